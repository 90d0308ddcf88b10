"""Secrets stay out of what the tool writes: a planted token and the database password appear in no output,
no export, no log and no database row. A job's ``executor.env`` reaches every export — plain values as values,
``${NAME}`` values as references that the place the export runs resolves (the shell, a Kubernetes Secret, Ray)."""

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


def test_executor_env_reaches_every_export_and_its_secret_only_by_reference(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from advisor.exports import FORMATS, Evidence, write_export
    from advisor.job import job_from_dict
    from executors import place
    from search_spaces import DeploymentConfig, Mode, Role, RoleConfig
    from tests.test_render import run_launch_script

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    job = job_from_dict({"name": "env-pd", "model": {"preset": "tiny-moe"},
                         "cluster": {"gpu": "H200", "nodes": 2, "gpus_per_node": 1},
                         "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 2000}],
                         "space": {r: {"dp_sizes": [1], "tp_sizes": [1]} for r in ("mixed", "prefill", "decode")},
                         "executor": {"env": {"GLOO_SOCKET_IFNAME": "eth0", "HF_TOKEN": "${HF_TOKEN}"}}})
    cfg = DeploymentConfig(mode=Mode.DISAGGREGATED, prefill=RoleConfig(role=Role.PREFILL),
                           decode=RoleConfig(role=Role.DECODE))
    ev = Evidence(job.name, 1, "simulated", "test", job.cluster.describe(), [])
    out = tmp_path / "out"
    for fmt in FORMATS:
        write_export(job, place(cfg, job.cluster), ev, fmt, out, model="example-org/tiny-qwen3-moe")
    for f in out.rglob("*"):
        assert not f.is_file() or TOKEN not in f.read_text(), f"{f} holds the token's value"

    # launch.sh: the operator's shell expands ${HF_TOKEN} — every process gets it, the file never had it
    script = (out / "launch.sh").read_text()
    assert "export GLOO_SOCKET_IFNAME=eth0 HF_TOKEN=\"${HF_TOKEN}\"" in script
    started = run_launch_script(script, tmp_path / "run", nodes=2, node_ips=["10.77.0.1", "10.77.0.2"],
                                env={"HF_TOKEN": TOKEN}, servers=2)
    assert len(started) == 3
    for p in started:
        assert (p.env["GLOO_SOCKET_IFNAME"], p.env["HF_TOKEN"]) == ("eth0", TOKEN), p.name

    # json: the environment as written
    doc = json.loads((out / "deployment.json").read_text())
    assert doc["env"] == {"GLOO_SOCKET_IFNAME": "eth0", "HF_TOKEN": "${HF_TOKEN}"}

    # k8s: every container, vLLM pods and the router; the token from the export's Secret
    containers = []
    for f in (out / "k8s").glob("*.yaml"):
        obj = yaml.safe_load(f.read_text())
        if obj["kind"] == "LeaderWorkerSet":
            tmpl = obj["spec"]["leaderWorkerTemplate"]
            pods = (tmpl.get("leaderTemplate"), tmpl["workerTemplate"])
            containers += [t["spec"]["containers"][0] for t in pods if t]
        elif obj["kind"] == "Deployment":
            containers += obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 3
    for c in containers:
        env = {e["name"]: e for e in c["env"]}
        assert env["GLOO_SOCKET_IFNAME"] == {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"}
        assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "hf-token", "key": "token", "optional": False}}}
        assert [e["name"] for e in c["env"]].count("HF_TOKEN") == 1
    assert "--from-literal=token=" in (out / "k8s" / "README.md").read_text()

    # Ray Serve: runtime_env of each role; Ray expands ${HF_TOKEN} on the replica's node
    app = yaml.safe_load((out / "ray-serve" / "serve_config.yaml").read_text())["applications"][0]["args"]
    for role in ("prefill_config", "decode_config"):
        assert app[role]["runtime_env"]["env_vars"] == {"GLOO_SOCKET_IFNAME": "eth0", "HF_TOKEN": "${HF_TOKEN}"}
