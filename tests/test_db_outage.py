"""A PostgreSQL outage mid-study (issue 32): a server stopped and restarted inside the retry window → the study
goes on and every trial is recorded once; stopped for longer → one line, exit 3, and a resume after the restart
completes the budget exactly.

The server is this module's own (``scripts/pg_start.sh`` into a temporary folder, on a free port), since the
test stops it; the study is simulated (fast trials, so that the stop lands mid-transaction).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

import db
from advisor import tune as tune_mod
from db import queries
from search_spaces import TrialState

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 60  # 20 trials before the outage, 40 after it: the budget exact either way

pytestmark = pytest.mark.skipif(
    not (shutil.which("pg_ctl") or list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))),
    reason="no PostgreSQL server binaries (apt-get install -y postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg(script: str, *args: str) -> str:
    p = subprocess.run(["bash", str(ROOT / "scripts" / script), *args], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""


class Server:
    """A PostgreSQL server of our own: started, stopped and started again on the same folder and port."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, str(_free_port())
        self.url = self.start()

    def start(self) -> str:
        return _pg("pg_start.sh", str(self.folder), self.port)

    def stop(self) -> None:
        _pg("pg_stop.sh", str(self.folder))


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # not under pytest's tmp folders (mode 0700): run as root, the server runs as "postgres" and must reach it
    folder = Path(tempfile.mkdtemp(prefix="advisor-outage-"))
    folder.chmod(0o755)
    s = Server(folder / "data")
    try:
        yield s
    finally:
        _pg("pg_stop.sh", str(s.folder), "--purge")
        shutil.rmtree(folder, ignore_errors=True)


def _job(name: str, url: str) -> dict:
    return {"name": name, "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 11},
            "budget": {"trials": BUDGET, "max_consecutive_failures": BUDGET}, "storage": url}


def _tuner(tmp_path: Path, doc: dict, window_s: float) -> subprocess.Popen[str]:
    (tmp_path / "job.yaml").write_text(json.dumps(doc))
    env = {**os.environ, "DEPLOY_ADVISOR_DB_OUTAGE_S": str(window_s)}
    return subprocess.Popen([sys.executable, "-m", "advisor", "tune", "job.yaml"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def _wait_for_trials(url: str, name: str, n: int, p: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()
        try:
            database = db.connect(url)
            try:
                if len(queries.list_trials(database, name)) >= n:
                    return
            finally:
                database.close()
        except (db.DatabaseUnavailable, db.UnknownStudy):
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} trials after 300 s")


def _check_whole(url: str, name: str) -> None:
    """The budget exact, nothing RUNNING on either side, and each Optuna trial recorded once in our tables."""
    study = optuna.load_study(study_name=name, storage=db.optuna_storage(url))
    assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    database = db.connect(url)
    try:
        assert database.budget_used(name) == BUDGET
        ours = [queries.get_trial(database, name, t.number) for t in queries.list_trials(database, name)]
    finally:
        database.close()
    numbers = [t.number for t in ours]
    assert len(numbers) == len(set(numbers))
    assert not [t for t in ours if t.state is TrialState.RUNNING]
    measured = [t for t in ours if t.state in (TrialState.COMPLETE, TrialState.FAILED) and t.reused_from is None]
    assert len(measured) == BUDGET, len(measured)  # nothing lost, nothing run twice
    for t in study.get_trials(deepcopy=False):  # every trial Optuna knows as run is one of ours
        if t.user_attrs.get(tune_mod.EXECUTED_ATTR):
            assert t.number in set(numbers), t.number


def test_a_restart_inside_the_retry_window_loses_nothing(server: Server, tmp_path: Path) -> None:
    name = "outage-restart"
    p = _tuner(tmp_path, _job(name, server.url), window_s=60)
    try:
        _wait_for_trials(server.url, name, 20, p)
        server.stop()
        time.sleep(1.0)
        server.start()
        out, errs = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out + errs
    assert "Traceback" not in errs, errs
    assert "budget reached" in out
    _check_whole(server.url, name)


def test_an_outage_past_the_window_ends_with_one_line_and_the_resume_completes_the_budget(
        server: Server, tmp_path: Path) -> None:
    name = "outage-long"
    p = _tuner(tmp_path, _job(name, server.url), window_s=3)
    try:
        _wait_for_trials(server.url, name, 20, p)
        server.stop()
        t0 = time.monotonic()
        out, errs = p.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
        server.start()
    assert p.returncode == 3, out + errs
    lines = [ln for ln in errs.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: the database is unreachable"), errs
    assert "advisor:advisor" not in errs and "Traceback" not in errs
    assert took < 60, took  # bounded: the window (3 s) and the last backoff, not the default 120 s

    resumed = _tuner(tmp_path, _job(name, server.url), window_s=60)
    out, errs = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out + errs
    _check_whole(server.url, name)
