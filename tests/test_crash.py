"""Crash safety with real child processes: `advisor tune` killed with SIGKILL in the middle of a trial.

The tuner is killed (the tuner only: its vLLM servers run in process groups of their own and outlive it, as
they would after an OOM-kill or a lost SSH session). The next `advisor tune` on the study must mark the
trial interrupted, stop the orphaned servers from the resources recorded in the database, and complete the
budget — with every measurement written before the kill still there, once.

A kill can also fall between recording a trial (our database) and telling Optuna: the resumed tuner tells the
trial from its record, so no Optuna trial stays RUNNING and no measured trial is lost or run again.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import optuna

import db
from advisor import trial_record, tune as tune_mod
from advisor.job import job_from_dict
from advisor.objectives import objective_names
from db import queries
from executors import procs
from search_spaces import TrialState


def _trials(url: str) -> list[db.Trial]:
    database = db.connect(url)
    try:
        return [queries.get_trial(database, "crash", t.number) for t in queries.list_trials(database, "crash")]
    finally:
        database.close()


@pytest.mark.vllm
def test_sigkill_mid_trial_then_resume(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    job = {"name": "crash", "preset": "cpu-tiny-moe", "budget": {"trials": 2}, "sampler": {"kind": "grid"},
           "space": {"modes": ["aggregated"], "mixed": {"max_num_seqs": [4, 8, 16]}},
           "executor": {"kind": "local", "run_dir": str(tmp_path / "runs")}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    tuner = procs.start([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], name="tuner",
                        log_path=tmp_path / "tuner.log", cwd=tmp_path)
    orphans: list[int] = []
    try:
        deadline = time.monotonic() + 600
        while True:  # wait for: one trial complete, the next one's server started
            assert tuner.poll() is None, tuner.tail(40)
            assert time.monotonic() < deadline, tuner.tail(40)
            try:
                ts = _trials(url) if Path(url[len("sqlite:///"):]).exists() else []
            except db.UnknownStudy:  # the tuner has not created the study yet
                ts = []
            if ts:
                running = [t for t in ts if t.state is TrialState.RUNNING and (t.resources or {}).get("pgids")]
                if any(t.state is TrialState.COMPLETE for t in ts) and running:
                    orphans = list(running[0].resources["pgids"])
                    victim = running[0].number
                    break
            time.sleep(1)
        tuner.popen.send_signal(signal.SIGKILL)  # the tuner alone, mid-trial
        tuner.popen.wait(timeout=30)
    finally:
        if tuner.poll() is None:
            procs.stop(tuner)
    before = {(t.number, m.concurrency): m.model_dump() for t in _trials(url) for m in t.measurements}
    assert before, "no measurement was written before the kill"
    assert any(procs.group_alive(g) for g in orphans), "the killed tuner's servers should still be running"

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], cwd=tmp_path,
                       capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    resume_s = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    assert "closed 1 trial(s) left running by an earlier tuner" in p.stdout

    try:
        trials = _trials(url)
        interrupted = [t for t in trials if t.number == victim]
        assert interrupted[0].state is TrialState.INTERRUPTED
        assert "stopped process group" in interrupted[0].reason
        for g in orphans:
            assert not procs.group_alive(g), f"orphaned process group {g} is still running"
        complete = [t for t in trials if t.state is TrialState.COMPLETE]
        assert len(complete) == 2  # the budget, completed
        after = [(t.number, m.concurrency) for t in trials for m in t.measurements]
        assert len(after) == len(set(after))  # nothing duplicated
        now = {(t.number, m.concurrency): m.model_dump() for t in trials for m in t.measurements}
        for key, m in before.items():  # nothing lost or changed
            assert now[key] == m
        print(f"resume after SIGKILL: {resume_s:.1f} s including one new trial")
    finally:
        for g in orphans:
            if procs.group_alive(g):
                procs.stop_group(g, 10)


@pytest.mark.vllm
def test_consecutive_failures_stop_the_study_with_a_clear_message(tmp_path: Path) -> None:
    """Every candidate fails to start (a flag vLLM refuses): the study stops after
    budget.max_consecutive_failures trials instead of burning its whole budget, and says why."""
    url = f"sqlite:///{tmp_path / 'fail.db'}"
    job = {"name": "fails", "preset": "cpu-tiny-moe", "budget": {"trials": 6, "max_consecutive_failures": 2},
           "executor": {"kind": "local", "run_dir": str(tmp_path / "runs"),
                        "extra_serve_args": ["--max-num-seqs", "notanumber"]}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 trials failed in a row (budget.max_consecutive_failures)" in p.stdout, p.stdout
    database = db.connect(url)
    try:
        trials = queries.list_trials(database, "fails")
    finally:
        database.close()
    failed = [t for t in trials if t.state is TrialState.FAILED]
    assert len(failed) == 2 and all("notanumber" in (t.reason or "") for t in failed)
    print(f"two start failures and the stop: {took:.1f} s")


#: The simulated tuner in a child process that SIGKILLs itself right after ``_record`` returns for the argv[2]-th
#: time: between our database and Optuna, the window a real kill can hit. With argv[3] "environment" every deploy
#: fails for the environment (a fake cluster), so the recorded trial is an environment failure.
_KILL_AFTER_RECORD = r"""
import json, os, signal, sys
import advisor.tune as t
from advisor.job import job_from_dict
from executors import DeploymentFailed, FailureKind
from executors.simulated import SimulatedExecutor, default_params

url, after, kind, job = sys.argv[1], int(sys.argv[2]), sys.argv[3], job_from_dict(json.loads(sys.argv[4]))
record, calls = t.record, [0]

def record_then_die(*args, **kwargs):
    out = record(*args, **kwargs)
    calls[0] += 1
    if calls[0] == after:
        os.kill(os.getpid(), signal.SIGKILL)
    return out

class BrokenCluster(SimulatedExecutor):
    def deploy(self, topology):
        raise DeploymentFailed(FailureKind.ENVIRONMENT, "port 8200 taken on 10.77.77.2")

t.record = record_then_die
t.ENVIRONMENT_RETRY_PAUSE_S = 0.0
broken = BrokenCluster(job.model_profile(), default_params(job.cluster.gpu)) if kind == "environment" else None
t.tune(job, storage=url, executor=broken)
"""


@pytest.mark.parametrize(("kind", "after"), [("complete", 3), ("environment", 1)])
def test_sigkill_between_record_and_tell_then_resume(kind: str, after: int, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    doc = {"name": "crash", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 3},
           "budget": {"trials": 5},
           "space": {"modes": ["aggregated"],
                     "mixed": {"instances": [1], "dp_sizes": [8, 16], "max_num_seqs": [32, 64, 128, 256, 512],
                               "max_num_batched_tokens": [8192], "all2all_backends": ["allgather_reducescatter"],
                               "dbo": [False]},
                     "eplb": {"enabled": [False], "num_redundant_experts": [0]}}}
    p = subprocess.run([sys.executable, "-c", _KILL_AFTER_RECORD, url, str(after), kind, json.dumps(doc)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    study = optuna.load_study(study_name="crash", storage=db.optuna_storage(url))
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    assert len(running) == 1, "the kill should leave the recorded trial RUNNING in Optuna"
    victim = running[0].number
    recorded = {t.number: t for t in _trials(url)}[victim]
    assert recorded.state is (TrialState.COMPLETE if kind == "complete" else TrialState.FAILED)
    levels = [m.model_dump() for m in recorded.measurements]

    job = job_from_dict(doc)
    summary = tune_mod.tune(job, storage=url)

    study = optuna.load_study(study_name="crash", storage=db.optuna_storage(url))
    assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    told = study.trials[victim]
    if kind == "complete":  # told from the record: its values, its violation, as ``tell`` would have
        assert told.state is optuna.trial.TrialState.COMPLETE
        assert told.values == [recorded.objectives[n] for n in objective_names(job)]
        assert told.system_attrs["constraints:slo"] == recorded.violation
        assert told.user_attrs["advisor_executed"] is True
        assert told.user_attrs[trial_record.CONFIG_KEY_ATTR] == recorded.config.key()
        assert summary.executed == 5 - after  # the measured trial counted once, not run again
    else:  # an environment failure: FAIL, not counted, so the whole budget runs after it
        assert told.state is optuna.trial.TrialState.FAIL
        assert told.user_attrs[trial_record.FAILURE_ATTR] == "environment"
        assert summary.executed == 5
    assert tune_mod._executed(study) == 5
    trials = _trials(url)
    measured = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAILED)
                and t.failure_kind != "environment" and not (t.reason or "").startswith("same configuration")]
    assert len(measured) == 5  # the budget completes, and nothing beyond it ran
    assert [m.model_dump() for m in {t.number: t for t in trials}[victim].measurements] == levels
