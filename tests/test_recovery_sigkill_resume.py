"""SIGKILL a simulated study at a moment drawn from 4-13 s, then resume it: the resume leaves no trial RUNNING, in
our table or in Optuna's, whatever the kill interrupted (an ask, an enqueued trial's pop before its mark, a
record, a tell). Three draws, seeded."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import db
from db import queries
from search_spaces import TrialState
from tests.cli_run import advisor


@pytest.mark.parametrize("draw", range(3))
def test_sigkill_at_a_random_moment_then_resume_leaves_no_trial_running(tmp_path: Path, draw: int) -> None:
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    (tmp_path / "job.yaml").write_text(json.dumps({"name": "kill", "preset": "gb300-rack-dsv3", "storage": url,
                                                   "budget": {"trials": 100000}}))
    p = subprocess.Popen([sys.executable, "-m", "advisor", "tune", "job.yaml"], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        time.sleep(random.Random(draw).uniform(4, 13))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    r = advisor("tune", "job.yaml", "--wall-time", "4", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    database = db.connect(url)
    try:
        ours = [t.state for t in queries.list_trials(database, "kill")]
    finally:
        database.close()
    theirs = [t.state for t in optuna.load_study(study_name="kill", storage=url).get_trials(deepcopy=False)]
    assert ours and TrialState.RUNNING not in ours, ours
    assert optuna.trial.TrialState.RUNNING not in theirs, [t for t in theirs if t.name == "RUNNING"]
