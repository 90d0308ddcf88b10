"""`advisor cleanup --stale-after 0` in the middle of a real trial's levels (the CPU build of vLLM serving the tiny
dummy-weight MoE, local executor) leaves the trial alone: its tuner is alive on this host. Before, the cleanup
stopped the trial's servers and the live tuner then died with ``IllegalTransition`` (a traceback, exit 1, Optuna's
trial RUNNING). One vLLM cold start (~1 min)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import optuna
import pytest

import db
from db import queries
from executors.processes import procs
from search_spaces import TrialState
from tests.cli_run import advisor
from tests.test_stop_real import LEVELS, _job, _level_results


@pytest.mark.vllm
def test_cleanup_with_stale_after_0_mid_levels_leaves_a_live_tuners_real_trial(tmp_path: Path) -> None:
    work, url = tmp_path, f"sqlite:///{tmp_path / 'stop.db'}"
    runs = work / "runs"
    (work / "job.yaml").write_text(json.dumps(_job("local", work)))
    tuner = procs.start([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], name="tuner",
                        log_path=work / "tuner.log", cwd=work, env={})
    try:
        deadline = time.monotonic() + 900
        while len(_level_results(runs)) < 2:
            assert tuner.poll() is None, tuner.tail(60)
            assert time.monotonic() < deadline, tuner.tail(60)
            time.sleep(0.3)
        c = advisor("cleanup", "stop", "--stale-after", "0", "--storage", url, cwd=work)
        assert c.returncode == 0 and "no running trial without a live tuner" in c.stdout, c.stdout + c.stderr
        tuner.popen.wait(timeout=900)
    finally:
        if tuner.poll() is None:
            procs.stop(tuner)
        for m in procs.marked_processes([], runs):
            procs.stop_group(m.pgid, 5)
    assert tuner.poll() == 0, tuner.tail(60)
    assert "Traceback" not in tuner.tail(200)
    database = db.connect(url)
    try:
        (t,) = [queries.get_trial(database, "stop", x.number) for x in queries.list_trials(database, "stop")]
        assert t is not None and t.state is TrialState.COMPLETE, (t.state if t else None, t.reason if t else None)
        assert sorted(m.concurrency for m in t.measurements) == LEVELS
    finally:
        database.close()
    states = [x.state for x in optuna.load_study(study_name="stop", storage=url).get_trials(deepcopy=False)]
    assert optuna.trial.TrialState.RUNNING not in states, states
