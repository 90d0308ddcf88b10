"""``advisor.recovery.ask``: a new trial exists only with its worker on it, so a database that stops right after the
trial is created never leaves a RUNNING trial that a resume cannot attribute (CI, 5 Dec: trial 21 of
tests/test_db_outage.py's long outage, asked, then the worker's mark lost with the server).

The stop is injected where it bit: the storage refuses every write after the trial's creation, as the stopped
PostgreSQL server did (``DatabaseOutage``, what ``db.outage`` raises once its window has passed)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from advisor import recovery
from advisor.job import job_from_dict
from advisor.study import open_study
from db.outage import DatabaseOutage

WORKER = "ci-host:4242"


@pytest.fixture()
def study(tmp_path: Path) -> optuna.Study:
    job = job_from_dict({"name": "ask", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 3},
                         "storage": f"sqlite:///{tmp_path / 'ask.db'}"})
    return open_study(job, job.storage, "ask")


def _attr_writes_fail(study: optuna.Study, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_a: object, **_k: object) -> None:
        raise DatabaseOutage("the database is unreachable (injected)")

    monkeypatch.setattr(type(study._storage), "set_trial_user_attr", refused)


def test_a_new_trial_is_created_with_its_worker_and_runs(study: optuna.Study) -> None:
    trial = recovery.ask(study, WORKER)
    stored = study.get_trials(deepcopy=False)
    assert [(t.number, t.state, t.user_attrs.get(recovery.WORKER_ATTR)) for t in stored] == \
        [(trial.number, optuna.trial.TrialState.RUNNING, WORKER)]
    x = trial.suggest_float("x", 0.0, 1.0)  # the trial is a full Optuna trial: suggest, tell
    study.tell(trial, [x] * len(study.directions))
    assert recovery.ask(study, WORKER).number == trial.number + 1


def test_a_database_stopping_after_the_creation_leaves_no_trial_without_its_worker(
        study: optuna.Study, monkeypatch: pytest.MonkeyPatch) -> None:
    _attr_writes_fail(study, monkeypatch)
    trial = recovery.ask(study, WORKER)  # needs no write after the one that creates it
    [stored] = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    assert stored.number == trial.number and stored.user_attrs[recovery.WORKER_ATTR] == WORKER


def test_an_enqueued_trial_is_taken_and_marked_and_a_stop_between_is_left_to_age(
        study: optuna.Study, monkeypatch: pytest.MonkeyPatch) -> None:
    study.enqueue_trial({}, user_attrs={"advisor_proposer": "repeat"})
    trial = recovery.ask(study, WORKER)
    t = study.get_trials(deepcopy=False)[trial.number]
    assert t.state is optuna.trial.TrialState.RUNNING and t.user_attrs == {"advisor_proposer": "repeat",
                                                                           recovery.WORKER_ATTR: WORKER}
    study.enqueue_trial({})
    _attr_writes_fail(study, monkeypatch)
    with pytest.raises(DatabaseOutage):
        recovery.ask(study, WORKER)
    # the documented gap: a popped trial whose mark was lost carries no worker (``close_stale`` closes it by age)
    last = study.get_trials(deepcopy=False)[-1]
    assert last.state is optuna.trial.TrialState.RUNNING and recovery.WORKER_ATTR not in last.user_attrs
