"""Crash safety: `advisor tune` killed with SIGKILL, then resumed.

`advisor tune` killed in the middle of a real trial (real vLLM servers that outlive the tuner) is tested on
tests/test_knee_real.py's study, whose first tuner is SIGKILLed mid-trial and resumed: that study deploys the
same tiny model anyway, and a study of its own here cost two more vLLM cold starts (~3 minutes on 2 cores).

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
from search_spaces import TrialState


def _budget_used(url: str, study: str) -> int:
    with db.connect(url) as d:
        return d.budget_used(study)


def _trials(url: str, study: str = "crash") -> list[db.Trial]:
    database = db.connect(url)
    try:
        return [queries.get_trial(database, study, t.number) for t in queries.list_trials(database, study)]
    finally:
        database.close()


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
    # Rich folds lines at 80 columns when stdout is not a terminal: compare the words, not the line breaks
    assert "2 trials failed in a row (budget.max_consecutive_failures)" in " ".join(p.stdout.split()), p.stdout
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
from executors.simulated.executor import SimulatedExecutor, default_params

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
        assert told.constraints == {"0": recorded.violation}
        assert told.user_attrs[trial_record.EXECUTED_ATTR] is True
        assert told.user_attrs[trial_record.CONFIG_KEY_ATTR] == recorded.config.key()
        assert summary.executed == 5 - after  # the measured trial counted once, not run again
    else:  # an environment failure: FAIL, not counted, so the whole budget runs after it
        assert told.state is optuna.trial.TrialState.FAIL
        assert told.user_attrs[trial_record.FAILURE_ATTR] == "environment"
        assert summary.executed == 5
    assert _budget_used(url, "crash") == 5
    trials = _trials(url)
    measured = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAILED)
                and t.failure_kind != "environment" and not (t.reason or "").startswith("same configuration")]
    assert len(measured) == 5  # the budget completes, and nothing beyond it ran
    assert [m.model_dump() for m in {t.number: t for t in trials}[victim].measurements] == levels


_KILL_AFTER_ASK = """
import json, os, signal, sys
import db.engine
from advisor import tune as t
from advisor.job import job_from_dict

url, after, job = sys.argv[1], int(sys.argv[2]), job_from_dict(json.loads(sys.argv[3]))
start, calls = db.engine.Database.start_trial, [0]

def die_before_recording(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == after:  # asked from Optuna, not yet recorded by us
        os.kill(os.getpid(), signal.SIGKILL)
    return start(self, *args, **kwargs)

db.engine.Database.start_trial = die_before_recording
t.tune(job, storage=url)
"""


def test_sigkill_between_ask_and_record_then_resume_leaves_no_running_trial(tmp_path: Path) -> None:
    """A tuner killed after asking Optuna for a trial and before recording it: the resume closes that trial at
    once (its asking worker is recorded on it and is dead), so none stays RUNNING, counted toward the budget."""
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    doc = {"name": "asked", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 5},
           "budget": {"trials": 5}}
    p = subprocess.run([sys.executable, "-c", _KILL_AFTER_ASK, url, "3", json.dumps(doc)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    study = optuna.load_study(study_name="asked", storage=db.optuna_storage(url))
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    assert len(running) == 1 and running[0].number not in {t.number for t in _trials(url, "asked")}

    summary = tune_mod.tune(job_from_dict(doc), storage=url)  # at once: well inside the 60 s age rule

    study = optuna.load_study(study_name="asked", storage=db.optuna_storage(url))
    assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    assert study.trials[running[0].number].state is optuna.trial.TrialState.FAIL
    assert summary.stopped_because == "budget reached" and _budget_used(url, "asked") == 5
    measured = [t for t in _trials(url, "asked") if t.state in (TrialState.COMPLETE, TrialState.FAILED)
                and not (t.reason or "").startswith("same configuration")]
    assert len(measured) == 5  # the budget exact: not one short, nothing beyond it
