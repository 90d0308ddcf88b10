"""Environment failures (the cluster, not the configuration) in the tune loop: retried once on a fresh
deployment, then told to Optuna as FAIL — never as an infeasible configuration — and not counted in the budget.

The executors here are fakes standing in for a cluster failure: the real simulator whose ``deploy`` raises
``DeploymentFailed(FailureKind.ENVIRONMENT, …)`` the way the Ray executor does on a placement timeout, a port taken
or a node lost. Real environment failures are tested with the two-host namespace cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest

import db
from advisor import api, recovery, trial_record, tune as tune_mod
from advisor.job import job_from_dict
from advisor.objectives import objective_names
from advisor.tune import tune
from db import queries
from executors import DeploymentFailed, FailureKind
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import TrialState

PORT_TAKEN = "port 8200 taken on 10.77.77.2"
NODE_LOST = "node 10.77.77.2 lost (Ray: node died)"

#: Ten aggregated candidates, all valid: small enough that the sampler proposes a configuration again.
SPACE = {"modes": ["aggregated"],
         "mixed": {"instances": [1], "dp_sizes": [8, 16], "max_num_seqs": [32, 64, 128, 256, 512],
                   "max_num_batched_tokens": [8192], "all2all_backends": ["allgather_reducescatter"],
                   "dbo": [False]},
         "eplb": {"enabled": [False], "num_redundant_experts": [0]}}


def _job(name: str = "env", kind: str = "random", trials: int = 4, space: dict | None = None):
    return job_from_dict({"name": name, "preset": "gb300-rack-dsv3", "sampler": {"kind": kind, "seed": 7},
                          "budget": {"trials": trials}, "space": space or SPACE})


class FlakyCluster(SimulatedExecutor):
    """Fake: the first deploy of each configuration finds its port taken; a fresh deploy works."""

    def __init__(self, job) -> None:
        super().__init__(job.model_profile(), default_params(job.cluster.gpu))
        self.deploys: Counter[str] = Counter()

    def deploy(self, topology):
        key = topology.config.key()
        self.deploys[key] += 1
        if self.deploys[key] == 1:
            raise DeploymentFailed(FailureKind.ENVIRONMENT, PORT_TAKEN, "bind: address already in use")
        return super().deploy(topology)


class BrokenCluster(SimulatedExecutor):
    """Fake: every deploy loses a node. ``healthy_after`` deploys fail, then the cluster is back."""

    def __init__(self, job, healthy_after: int | None = None) -> None:
        super().__init__(job.model_profile(), default_params(job.cluster.gpu))
        self.deployed: list[str] = []
        self.healthy_after = healthy_after

    def deploy(self, topology):
        self.deployed.append(topology.config.key())
        if self.healthy_after is None or len(self.deployed) <= self.healthy_after:
            raise DeploymentFailed(FailureKind.ENVIRONMENT, NODE_LOST)
        return super().deploy(topology)


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune_mod, "ENVIRONMENT_RETRY_PAUSE_S", 0.0)


def _optuna(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=db.optuna_storage(url)).get_trials(deepcopy=False)


def _trials(url: str, name: str) -> list[db.Trial]:
    database = db.connect(url)
    try:
        return queries.list_trials(database, name)
    finally:
        database.close()


def test_an_environment_failure_is_retried_once_and_the_retry_counts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    job = _job()
    ex = FlakyCluster(job)
    seen: list[api.TrialReport] = []
    summary = tune(job, storage=url, executor=ex, on_trial=seen.append)
    assert summary.executed == 4 and summary.environment_failed == 0 and summary.stopped_because == "budget reached"
    assert len(ex.deploys) == 4 and set(ex.deploys.values()) == {2}  # each configuration: failed, then fresh
    notes = [r.note for r in seen if r.state is TrialState.RUNNING]
    measured = [t for t in _trials(url, "env") if t.state is TrialState.COMPLETE
                and not (t.reason or "").startswith("same configuration")]
    assert len(measured) == 4
    assert notes == [f"trial {t.number}: environment failure ({PORT_TAKEN}): retrying on a fresh placement in 0 s"
                     for t in measured]
    for t in measured:  # the first attempt stays visible on the trial
        assert t.reason == f"retried on a fresh placement: the first attempt failed for the environment ({PORT_TAKEN})"
        assert t.log_tail == "bind: address already in use" and t.objectives
    told = {t.number: t for t in _optuna(url, "env")}
    for t in measured:
        o = told[t.number]
        assert o.state is optuna.trial.TrialState.COMPLETE and o.user_attrs[trial_record.EXECUTED_ATTR] is True
        assert o.user_attrs[trial_record.ENVIRONMENT_RETRY_ATTR] == PORT_TAKEN
        assert o.values == [t.objectives[n] for n in objective_names(job)]


def test_failing_twice_is_told_fail_not_counted_and_three_in_a_row_stop_the_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    job = _job(trials=5)
    ex = BrokenCluster(job)
    summary = tune(job, storage=url, executor=ex)
    assert summary.environment_broken and summary.environment_failed == 3
    assert summary.executed == 0 and summary.failed == 0
    assert summary.stopped_because.startswith(f"the environment keeps failing: {NODE_LOST} (3 trials in a row")
    assert len(ex.deployed) == 6  # three trials, each deployed twice
    trials = _trials(url, "env")
    assert [(t.state, t.failure_kind) for t in trials] == [(TrialState.FAILED, "environment")] * 3
    assert all(t.reason == f"{NODE_LOST} (retried on a fresh placement: the first attempt failed for the "
                           f"environment ({NODE_LOST}))" for t in trials)
    told = _optuna(url, "env")
    assert [t.state for t in told] == [optuna.trial.TrialState.FAIL] * 3  # not COMPLETE-infeasible
    for t in told:
        assert t.user_attrs[trial_record.FAILURE_ATTR] == "environment" and t.user_attrs[trial_record.EXECUTED_ATTR] is False
        assert trial_record.CONFIG_KEY_ATTR not in t.user_attrs  # not "measured": may be proposed again
        assert not any(k.startswith("constraints") for k in t.system_attrs)
    assert api.executed_trials(job, url, None) == 0
    cols, rows = api.trials_table(url, "env")
    assert [r[cols.index("state")] for r in rows] == ["failed: environment"] * 3


def test_the_budget_counts_configurations_and_a_failed_one_is_measured_later(tmp_path: Path) -> None:
    """Grid of three: the first point meets a broken node twice; the grid comes round to it after the others,
    and the budget of three is three configurations measured."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    space = {**SPACE, "mixed": {**SPACE["mixed"], "dp_sizes": [8], "max_num_seqs": [64, 128, 256]}}
    job = _job(kind="grid", trials=3, space=space)
    ex = BrokenCluster(job, healthy_after=2)
    summary = tune(job, storage=url, executor=ex)
    assert (summary.executed, summary.environment_failed, summary.stopped_because) == (3, 1, "budget reached")
    assert ex.deployed[0] == ex.deployed[1] == ex.deployed[-1] and len(set(ex.deployed)) == 3
    trials = _trials(url, "env")
    assert [t.state for t in trials] == [TrialState.FAILED] + [TrialState.COMPLETE] * 3
    assert trials[0].config.key() == trials[-1].config.key()
    assert api.executed_trials(job, url, None) == 3
    again = tune(job, storage=url, executor=ex)  # resumed: the budget is spent, nothing runs
    assert again.executed == 0 and len(ex.deployed) == 5


def test_a_second_tell_of_a_trial_told_from_its_record_is_dropped(tmp_path: Path) -> None:
    """A resuming tuner tells a recorded trial from the database; its own (slow) tuner's tell must not raise."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    job = _job()
    study = tune_mod.open_study(job, url, "env")
    database = db.connect(url)
    try:
        database.upsert_study("env", job.to_document())
        trial = study.ask()
        cfg = job.space.suggest(trial)
        tid = database.start_trial("env", trial.number, params=trial.params, config=cfg, worker="elsewhere:1")
        names = objective_names(job)
        database.finish_trial(tid, TrialState.COMPLETE, objectives={n: 100.0 for n in names}, violation=0.0)
        recovery.close_stale(job, database, study, "env", None)
        told = study.trials[0]
        assert told.state is optuna.trial.TrialState.COMPLETE and told.values == [100.0] * len(names)
        assert told.user_attrs[trial_record.CONFIG_KEY_ATTR] == cfg.key()
        assert told.system_attrs[trial_record.OPTUNA_CONSTRAINTS_KEY] == [0.0]
        trial_record.tell(study, trial, cfg, tune_mod.Outcome([100.0] * len(names), 0.0, None), TrialState.COMPLETE)
        assert study.trials[0].values == [100.0] * len(names)
    finally:
        database.close()


#: ``advisor tune`` in a child process on a fake cluster where every deploy loses a node; the first retry waits
#: until the test, having read the retry line, creates the file argv[1] (the rest of argv is the CLI's).
_CLI = r"""
import os, sys, time
from pathlib import Path
import advisor.tune as t
from executors import DeploymentFailed, FailureKind
from executors.simulated.executor import SimulatedExecutor, default_params

gate = Path(sys.argv[1])

class BrokenCluster(SimulatedExecutor):
    deploys = 0
    def deploy(self, topology):
        BrokenCluster.deploys += 1
        if BrokenCluster.deploys == 2:  # the retry: still running when the retry line must already show
            deadline = time.monotonic() + 60
            while not gate.exists():
                if time.monotonic() > deadline:  # the test never saw the retry line while the retry ran
                    os._exit(97)
                time.sleep(0.05)
        raise DeploymentFailed(FailureKind.ENVIRONMENT, "NODE_LOST")

t.ENVIRONMENT_RETRY_PAUSE_S = 0.0
t.make_executor = lambda job, ray_address=None: BrokenCluster(job.model_profile(), default_params(job.cluster.gpu))
import advisor.cli as c
c.make_executor = t.make_executor  # the CLI builds the executor before its progress bar
sys.argv = ["advisor", *sys.argv[2:]]
c.main()
""".replace("NODE_LOST", NODE_LOST)


def test_cli_shows_the_retry_as_it_happens_and_exits_non_zero(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    (tmp_path / "job.yaml").write_text(json.dumps({"name": "env", "preset": "gb300-rack-dsv3", "space": SPACE,
                                                   "sampler": {"kind": "random", "seed": 7},
                                                   "budget": {"trials": 4}}))
    gate = tmp_path / "seen"
    p = subprocess.Popen([sys.executable, "-c", _CLI, str(gate), "tune", "job.yaml", "--storage", url],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        lines = []
        for line in p.stdout:  # the retry line arrives while the retry still waits on it
            lines.append(line)
            if "retrying on a fresh placement" in line:
                assert line.strip() == f"trial 0: environment failure ({NODE_LOST}): retrying on a fresh " \
                                       "placement in 0 s"
                assert p.poll() is None
                gate.touch()
                break
        else:
            pytest.fail("no retry line: " + "".join(lines) + p.stderr.read())
        out, errs = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    out = " ".join(("".join(lines) + out).split())  # Rich folds the summary line at the terminal's width
    assert p.returncode == 3, out + errs
    assert f"the environment keeps failing: {NODE_LOST}" in out
    assert errs.strip().startswith(f"error: the environment keeps failing: {NODE_LOST}") and len(errs.splitlines()) == 1
    assert "3 failed twice for the environment (not counted)" in out
    shown = subprocess.run([sys.executable, "-m", "advisor", "trials", "env", "--storage", url], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("failed: environment") == 3, shown.stdout
