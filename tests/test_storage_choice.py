"""Which database a command opens, as its help says: ``--storage``, else (for a command reading a job) the job
file's ``storage``, else ``$ADVISOR_STORAGE``, else ``sqlite:///advisor.db``. A SQLite URL whose folder does not
exist is a mistyped URL: one line, exit 2, and no folder created."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cli_run import advisor, one_line


def _env_advisor(*args: str, cwd: Path, storage: str) -> None:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL, env={**os.environ, "ADVISOR_STORAGE": storage})
    assert p.returncode == 0, p.stdout + p.stderr


def test_tune_uses_advisor_storage_unless_the_job_or_the_command_line_names_one(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(json.dumps({"name": "env-study", "preset": "h200-qwen3-235b",
                                                   "budget": {"trials": 1}}))
    _env_advisor("tune", "job.yaml", cwd=tmp_path, storage="sqlite:///from-env.db")
    assert (tmp_path / "from-env.db").exists() and not (tmp_path / "advisor.db").exists()
    # the job file's storage is more specific than the environment
    (tmp_path / "job2.yaml").write_text(json.dumps({"name": "job-study", "preset": "h200-qwen3-235b",
                                                    "budget": {"trials": 1}, "storage": "sqlite:///from-job.db"}))
    _env_advisor("tune", "job2.yaml", cwd=tmp_path, storage="sqlite:///from-env.db")
    assert (tmp_path / "from-job.db").exists() and not (tmp_path / "advisor.db").exists()
    p = advisor("studies", "--storage", "sqlite:///from-env.db", "--format", "json", cwd=tmp_path)
    assert [s["name"] for s in json.loads(p.stdout)] == ["env-study"], p.stdout


def test_a_sqlite_url_in_a_missing_folder_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    url = f"sqlite:///{missing}/x.db"
    (tmp_path / "job.yaml").write_text(json.dumps({"name": "s", "preset": "h200-qwen3-235b", "budget": {"trials": 1}}))
    for args in (("tune", "job.yaml", "--storage", url), ("studies", "--storage", url),
                 ("import", "--storage", url, "nothing.csv")):
        p = advisor(*args, cwd=tmp_path)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (args, p.stderr)
        assert not (tmp_path / "no").exists(), f"{args[0]} created the folder"
    line = one_line(advisor("tune", "job.yaml", "--storage", url, cwd=tmp_path))
    assert str(missing) in line and "does not exist" in line, line
