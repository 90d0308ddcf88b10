"""One ledger: what a trial was is said by columns of our row (executed, reused-from, baseline, repeat-of), the
budget is counted from them by one function (``db.budget``) that the tuner, the CLI, the API and the dashboard
all read, and Optuna is told the same: its feasibility and best trial agree with ``advisor best``.

The study here runs the tune loop on an executor that is not the simulator (so it measures vLLM's defaults first
and repeats its best at the end) but answers with the simulator's numbers, and whose cluster fails one search
trial's two deploys (an environment failure); a configuration enqueued again is reused, not run.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

import db
from advisor import api, tune as tune_mod
from advisor.cli import app
from advisor.job import job_from_dict
from advisor.study import open_study
from advisor.trial_record import EXECUTED_ATTR, EXTRA_ATTR, OPTUNA_CONSTRAINTS_KEY
from db import queries
from executors import DeploymentFailed, Executor, FailureKind
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import TrialState
from ui import data

SPACE = {"modes": ["aggregated"],
         "mixed": {"instances": [1], "dp_sizes": [8, 16], "max_num_seqs": [32, 64, 128, 256, 512],
                   "max_num_batched_tokens": [8192], "all2all_backends": ["allgather_reducescatter"],
                   "dbo": [False]},
         "eplb": {"enabled": [False], "num_redundant_experts": [0]}}


class FakeCluster(Executor):
    """Not the simulator (the tuner measures a baseline and repeats), with the simulator's numbers; deploys
    number ``lost`` lose a node (``FailureKind.ENVIRONMENT``, as the Ray executor reports it)."""

    kind = "fake-cluster"
    engine_version = "fake-1"

    def __init__(self, job, lost: tuple[int, ...]) -> None:  # noqa: ANN001 — a TuningJob
        self.sim = SimulatedExecutor(job.model_profile(), default_params(job.cluster.gpu))
        self.deploys = 0
        self.lost = lost

    def deploy(self, topology):  # noqa: ANN001, ANN201
        self.deploys += 1
        if self.deploys in self.lost:
            raise DeploymentFailed(FailureKind.ENVIRONMENT, "node 10.77.77.2 lost")
        return self.sim.deploy(topology)

    def measure(self, deployment, workload, plan=None):  # noqa: ANN001, ANN201
        return self.sim.measure(deployment, workload, plan)

    def teardown(self, deployment) -> None:  # noqa: ANN001
        self.sim.teardown(deployment)


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune_mod, "ENVIRONMENT_RETRY_PAUSE_S", 0.0)


def test_the_budget_is_one_count_for_the_tuner_the_cli_the_api_and_the_dashboard(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    doc = {"name": "ledger", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 7},
           "budget": {"trials": 3, "repeat_top": 1}, "space": SPACE, "executor": {"kind": "simulated"}}
    job = job_from_dict(doc)
    ex = FakeCluster(job, lost=(2, 3))  # deploy 1 is the baseline; the first search trial loses a node twice
    first = tune_mod.tune(job, trials=2, storage=url, executor=ex)
    assert (first.baseline, first.environment_failed, first.executed) == (0, 1, 2)
    study = open_study(job, url, "ledger")
    with db.connect(url) as d:
        ran = [t for t in queries.list_trials(d, "ledger") if t.executed and not t.baseline and t.repeat_of is None]
    study.enqueue_trial(ran[0].params)  # the sampler proposes a measured configuration again: reused, not run
    second = tune_mod.tune(job, storage=url, executor=ex)
    assert second.repeats == 1 and second.executed == 1

    with db.connect(url) as d:
        rows = queries.list_trials(d, "ledger")
        used = d.budget_used("ledger")
    base = [t for t in rows if t.baseline]
    assert len(base) == 1 and base[0].executed and base[0].proposer == "baseline"
    env = [t for t in rows if t.failure_kind == FailureKind.ENVIRONMENT.value]
    assert len(env) == 1 and not env[0].executed
    reused = [t for t in rows if t.reused_from is not None]
    assert [(t.executed, t.state, t.config.key()) for t in reused] == [(False, TrialState.COMPLETE, ran[0].config.key())]
    source = next(t for t in rows if t.number == reused[0].reused_from)  # the first run, or its repeat
    assert source.executed and source.config.key() == ran[0].config.key()
    repeats = [t for t in rows if t.repeat_of is not None]
    assert repeats and all(t.executed for t in repeats) and base[0].number in {t.repeat_of for t in repeats}

    # one count: the database's, the CLI's progress (api.executed_trials), the dashboard's, Optuna's attributes
    assert used == 3 == job.budget.trials
    assert api.executed_trials(job, url, None) == 3
    info = data.study(url, "ledger")
    assert info is not None and (info.executed, info.budget, info.state, info.reused) == (3, 3, "finished", 1)
    assert data.studies_frame(data.studies(url)).iloc[0]["trials"].startswith("3 of 3 search trials run")
    told = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(EXECUTED_ATTR) and not t.user_attrs.get(EXTRA_ATTR)]
    assert len(told) == 3
    # and the tuner agrees the budget is spent: run again, nothing runs
    (tmp_path / "ledger.yaml").write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["tune", str(tmp_path / "ledger.yaml"), "--storage", url])
    assert res.exit_code == 0, res.output
    assert "0 trials run this time" in " ".join(res.output.split())


def test_optunas_feasibility_and_best_trial_are_advisor_bests(tmp_path: Path) -> None:
    """The SLO violation is stored under the key Optuna's ``constraints_func`` writes and optuna-dashboard reads,
    so each trial's feasibility there is the row's, Optuna's constrained best trial is ``advisor best``'s, and
    so is optuna-dashboard's (``storage.get_best_trial``, which ranks values only: an infeasible trial's value
    comes from its level closest to feasibility, here below every feasible knee). The samplers are built without
    ``constraints_func`` (``advisor.study._base_sampler``): TPE, NSGA-II and GP must read the stored violation."""
    from optuna.samplers._gp.sampler import _get_constraint_vals_and_feasibility
    from optuna.samplers._tpe.sampler import _split_trials
    from optuna.samplers.nsgaii._constraints_evaluation import _constrained_dominates
    from optuna.study._constrained_optimization import _CONSTRAINTS_KEY  # the private constant we mirror

    assert OPTUNA_CONSTRAINTS_KEY == _CONSTRAINTS_KEY
    url = f"sqlite:///{tmp_path / 'slo.db'}"
    job = job_from_dict({"name": "slo", "preset": "h200-qwen3-235b", "sampler": {"kind": "random", "seed": 1},
                         "budget": {"trials": 12}, "objective": {"per": "used_gpu"},
                         "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 300}],
                         "executor": {"kind": "simulated"}})
    tune_mod.tune(job, storage=url)
    study = optuna.load_study(study_name="slo", storage=db.optuna_storage(url))
    with db.connect(url) as d:
        rows = {t.number: t for t in queries.list_trials(d, "slo")}
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    flags = {t.number: all(c <= 0 for c in t.system_attrs[OPTUNA_CONSTRAINTS_KEY]) for t in complete}
    assert flags == {n: rows[n].feasible for n in flags}
    assert True in flags.values() and False in flags.values()  # a constrained study: both kinds
    best = api.best_report(url, "slo").rows[0][0]
    assert study.best_trial.number == best and rows[best].feasible
    storage = db.optuna_storage(url)  # what optuna-dashboard opens, read through the public storage API
    assert storage.get_best_trial(storage.get_study_id_from_name("slo")).number == best
    feasible = sorted(n for n, ok in flags.items() if ok)
    below, _ = _split_trials(study, complete, len(feasible))  # TPE's good group, as large as the feasible set
    assert sorted(t.number for t in below) == feasible
    weakest = min((t for t in complete if flags[t.number]), key=lambda t: t.values[0])  # NSGA-II: still ahead
    assert all(_constrained_dominates(weakest, t, study.directions) for t in complete if not flags[t.number])
    assert list(_get_constraint_vals_and_feasibility(study, complete)[1]) == [flags[t.number] for t in complete]


class Crash(BaseException):
    """A tuner killed at one point of its write path (not an ``Exception``: nothing in the loop catches it)."""


#: The points between our row and Optuna's tell, in the order the writer passes them: after the row, after each
#: user attribute, after the constraint (the tell itself is the end).
CRASH_POINTS = ("row", "state", "executed", "config key", "constraint")


def _agree(job, row: db.Trial, ft: optuna.trial.FrozenTrial) -> None:  # noqa: ANN001 — a TuningJob
    """Optuna holds what our row says."""
    from advisor.objectives import objective_names
    from advisor.trial_record import CONFIG_KEY_ATTR, STATE_ATTR

    judged = row.state is TrialState.COMPLETE or (row.state is TrialState.FAILED
                                                  and row.failure_kind != FailureKind.ENVIRONMENT.value)
    want = optuna.trial.TrialState.COMPLETE if judged else optuna.trial.TrialState.FAIL
    assert ft.state is want, (row.number, row.state, ft.state)
    if not judged:
        return
    assert ft.user_attrs[STATE_ATTR] == row.state.value
    assert ft.user_attrs[EXECUTED_ATTR] is row.executed
    assert ft.user_attrs[CONFIG_KEY_ATTR] == row.config.key()
    assert ft.system_attrs[OPTUNA_CONSTRAINTS_KEY] == [row.violation]
    if row.state is TrialState.COMPLETE:
        assert ft.values == [row.objectives[n] for n in objective_names(job)]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_between_row_and_tell_then_resume_leaves_row_and_optuna_equal(
        point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from advisor import trial_record

    url = f"sqlite:///{tmp_path / 'crash.db'}"
    job = job_from_dict({"name": "crash", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 5},
                         "budget": {"trials": 4}, "space": SPACE, "executor": {"kind": "simulated"}})
    armed: list[str] = []  # the Optuna writes made since the victim's row was written
    finish, set_attr, set_constraint = db.Database.finish_trial, optuna.trial.Trial.set_user_attr, \
        trial_record._set_constraint

    def step(name: str) -> None:
        if armed:
            armed.append(name)
            if name == point:
                raise Crash(point)

    def finish_trial(self, trial_id, state, **kw):  # noqa: ANN001, ANN202
        out = finish(self, trial_id, state, **kw)
        if kw.get("executed") and not armed and self.budget_used("crash") == 2:  # the second trial run
            armed.append("armed")
            step("row")
        return out

    def set_user_attr(self, key, value):  # noqa: ANN001, ANN202
        set_attr(self, key, value)
        step({trial_record.STATE_ATTR: "state", EXECUTED_ATTR: "executed",
              trial_record.CONFIG_KEY_ATTR: "config key"}.get(key, key))

    def constraint(*a):  # noqa: ANN002, ANN202
        set_constraint(*a)
        step("constraint")

    monkeypatch.setattr(db.Database, "finish_trial", finish_trial)
    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr", set_user_attr)
    monkeypatch.setattr(trial_record, "_set_constraint", constraint)
    with pytest.raises(Crash):
        tune_mod.tune(job, storage=url)
    assert armed[-1] == point
    monkeypatch.undo()
    monkeypatch.setattr(tune_mod, "ENVIRONMENT_RETRY_PAUSE_S", 0.0)

    summary = tune_mod.tune(job, storage=url)  # the resume: tells the victim from its row, then runs the rest
    assert summary.interrupted_found == 0 and summary.stopped_because == "budget reached"
    study = optuna.load_study(study_name="crash", storage=db.optuna_storage(url))
    with db.connect(url) as d:
        rows = queries.list_trials(d, "crash")
        assert d.budget_used("crash") == 4
    told = study.get_trials(deepcopy=False)
    assert [t.number for t in told] == [r.number for r in rows]
    for row, ft in zip(rows, told, strict=True):
        _agree(job, row, ft)
    assert sum(1 for t in told if t.user_attrs.get(EXECUTED_ATTR)) == 4
