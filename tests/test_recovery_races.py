"""Cleanup beside a live tuner, and a tuner killed in teardown. ``advisor cleanup`` runs as the real command;
the tuner runs the model's levels (a labelled stand-in for a deployment: the races are between the tuner, the
database and the cleanup, not inside vLLM), in this process or, where it must be killed, in a process of its own.

- ``cleanup --stale-after 0`` leaves a trial whose tuner runs on this host alone (``recovery.worker_alive``).
- A trial a cleanup closes anyway (its tuner on another host, judged by heartbeat) does not end its tuner: the
  tuner says so and goes on; Optuna's trial is closed, not RUNNING.
- Levels measured before a SIGKILL in teardown are kept (stored before teardown starts); ``cleanup`` closes the
  Optuna trial too; a resume then leaves no trial RUNNING.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest

import db
from advisor import tune as tune_mod
from advisor.job import job_from_dict
from db import queries
from executors.base import Deployment
from executors.measuring.loop import MeasurePlan
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import Measurement, TrialState, Workload
from tests.cli_run import advisor

JOB = {"name": "race", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 5}, "budget": {"trials": 2},
       "workload": {"knee_search": False, "load_levels": [8, 16]}}


class CleanupWhileMeasuring(SimulatedExecutor):
    """The model's levels; while the first trial measures, ``advisor cleanup STUDY --stale-after 0`` runs."""

    def __init__(self, *args: object, url: str, cwd: Path) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.url, self.cwd, self.said = url, cwd, ""

    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        if not self.said:
            p = advisor("cleanup", "race", "--stale-after", "0", "--storage", self.url, cwd=self.cwd)
            assert p.returncode == 0, p.stdout + p.stderr
            self.said = p.stdout
        return super().measure(deployment, workload, plan)


def _states(url: str) -> tuple[list[TrialState], list[optuna.trial.TrialState]]:
    database = db.connect(url)
    try:
        ours = [t.state for t in queries.list_trials(database, "race")]
    finally:
        database.close()
    theirs = [t.state for t in optuna.load_study(study_name="race", storage=url).get_trials(deepcopy=False)]
    return ours, theirs


def test_cleanup_with_stale_after_0_leaves_a_trial_whose_tuner_is_alive(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'race.db'}"
    job = job_from_dict(JOB)
    ex = CleanupWhileMeasuring(job.model_profile(), default_params(job.cluster.gpu), url=url, cwd=tmp_path)
    summary = tune_mod.tune(job, storage=url, executor=ex)
    assert "no running trial without a live tuner" in ex.said, ex.said
    ours, theirs = _states(url)
    assert ours == [TrialState.COMPLETE] * 2 and summary.executed == 2
    assert optuna.trial.TrialState.RUNNING not in theirs


def test_a_trial_closed_by_cleanup_while_it_runs_does_not_end_its_tuner(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner's worker names another host, so the cleanup judges it by heartbeat (0 s: stale) and closes
    its trial while it measures; before, the tuner then died with IllegalTransition and left Optuna's trial
    RUNNING."""
    url = f"sqlite:///{tmp_path / 'race.db'}"
    job = job_from_dict(JOB)
    here = socket.gethostname()
    monkeypatch.setattr(tune_mod.socket, "gethostname", lambda: f"elsewhere-{here}")
    ex = CleanupWhileMeasuring(job.model_profile(), default_params(job.cluster.gpu), url=url, cwd=tmp_path)
    notes: list[str] = []
    tune_mod.tune(job, storage=url, executor=ex, on_trial=lambda r: notes.append(r.note or ""))
    assert "trial 0: interrupted" in ex.said, ex.said
    assert any("trial 0 was closed while it ran" in n for n in notes), notes
    ours, theirs = _states(url)
    assert ours[0] is TrialState.INTERRUPTED and ours.count(TrialState.COMPLETE) == 2, ours
    assert optuna.trial.TrialState.RUNNING not in theirs, theirs


KILLED_IN_TEARDOWN = textwrap.dedent('''
    """A tuner whose teardown never ends (a labelled stand-in: the model's levels, then a hung teardown)."""
    import json, sys, time
    from pathlib import Path
    from advisor import tune as tune_mod
    from advisor.job import job_from_dict
    from executors.simulated.executor import SimulatedExecutor, default_params
    from executors.processes.procs import terminate_as_interrupt

    class HungTeardown(SimulatedExecutor):
        def teardown(self, deployment):
            Path(sys.argv[2]).write_text("tearing down")
            time.sleep(600)

    terminate_as_interrupt()
    job = job_from_dict(json.loads(sys.argv[3]))
    tune_mod.tune(job, storage=sys.argv[1], executor=HungTeardown(job.model_profile(), default_params(job.cluster.gpu)))
''')


def test_levels_measured_before_a_kill_in_teardown_are_kept_and_cleanup_closes_optuna_too(tmp_path: Path) -> None:
    import json

    url = f"sqlite:///{tmp_path / 'race.db'}"
    script, flag = tmp_path / "tuner.py", tmp_path / "tearing-down"
    script.write_text(KILLED_IN_TEARDOWN)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.Popen([sys.executable, str(script), url, str(flag), json.dumps(JOB)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not flag.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert flag.exists(), p.stdout.read().decode() if p.stdout and p.poll() is not None else "no teardown"
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    ours, theirs = _states(url)
    assert ours == [TrialState.RUNNING] and theirs == [optuna.trial.TrialState.RUNNING]
    c = advisor("cleanup", "race", "--storage", url, cwd=tmp_path)
    assert c.returncode == 0 and "trial 0: interrupted" in c.stdout, c.stdout + c.stderr
    database = db.connect(url)
    try:
        t = queries.get_trial(database, "race", 0)
        assert t is not None and t.state is TrialState.INTERRUPTED
        assert sorted(m.concurrency for m in t.measurements) == [8, 16], "the levels measured before the kill"
    finally:
        database.close()
    ours, theirs = _states(url)
    assert optuna.trial.TrialState.RUNNING not in theirs, theirs  # cleanup closed Optuna's trial too
    (tmp_path / "job.yaml").write_text(json.dumps({**JOB, "storage": url}))
    r = advisor("tune", "job.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    ours, theirs = _states(url)
    assert TrialState.RUNNING not in ours and optuna.trial.TrialState.RUNNING not in theirs
