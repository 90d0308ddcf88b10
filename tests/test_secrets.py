"""Secrets stay out of what the tool writes: a planted token and the database password appear in no output,
no export, no log and no database row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

TOKEN = "hf_PLANTED_Secret_7f3a9c"


def _run(*args: str, cwd: Path, env: dict[str, str]) -> str:
    p = subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=600, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout + p.stderr


def _all_text(url: str) -> str:
    """Every row of every table (ours and Optuna's), as text: what a database dump would show."""
    import sqlalchemy as sa

    eng = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    out = []
    with eng.connect() as c:
        for table in sa.inspect(eng).get_table_names():
            out += [repr(tuple(r)) for r in c.execute(sa.text(f'SELECT * FROM "{table}"'))]
    eng.dispose()
    return "\n".join(out)


@pytest.mark.postgres
def test_no_token_or_password_in_outputs_exports_logs_or_database(tmp_path: Path, pg_url: str) -> None:
    password = urlsplit(pg_url).password
    assert password
    leak = f":{password}@"
    env = {**os.environ, "HF_TOKEN": TOKEN, "ADVISOR_STORAGE": pg_url}
    job = {"name": f"secret-{os.getpid()}", "preset": "h200-qwen3-235b", "budget": {"trials": 3},
           "storage": pg_url}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    text = _run("tune", "job.yaml", cwd=tmp_path, env=env)
    text += _run("studies", cwd=tmp_path, env=env)
    text += _run("trials", job["name"], "--format", "json", cwd=tmp_path, env=env)
    text += _run("query", "studies", "--format", "json", cwd=tmp_path, env=env)
    text += _run("export", job["name"], "--format", "all", "--out", "out", cwd=tmp_path, env=env)
    for f in (tmp_path / "out").rglob("*"):
        if f.is_file():
            text += f.read_text()
    for f in tmp_path.rglob("*.log"):
        text += f.read_text(errors="replace")
    assert "***" in text  # the URL was shown, redacted
    dump = _all_text(pg_url)
    for where, blob in (("outputs/exports/logs", text), ("database", dump)):
        assert TOKEN not in blob, f"the planted token leaked into {where}"
        assert leak not in blob, f"the database password leaked into {where}"
    # exports name the secret only by reference
    assert "secretKeyRef" in "".join(p.read_text() for p in (tmp_path / "out" / "k8s").glob("*leaderworkerset.yaml"))
