"""The proposer protocol and the ledger: a new proposer is one class plugged into the loop's chain, and the loop
decides from our rows only — never from what Optuna holds on its trials. Simulated trials (the model as the
deployment)."""

from __future__ import annotations

import random
from pathlib import Path

import optuna
import pytest

import db
from advisor import tune as tune_mod
from advisor.job import job_from_dict
from advisor.proposers.ledger import Ledger
from advisor.proposers.protocol import Proposal
from advisor.recovery import WORKER_ATTR
from advisor.trial_record import PICKED_ATTR
from advisor.tune import tune
from db import queries
from search_spaces import TrialState


class EveryThirdRandom:
    """A proposer defined here: on every third trial the ledger counts, a random valid candidate not yet taken."""

    name = "third"

    def __init__(self, job) -> None:
        self.valid = job.valid_space()
        self.rng = random.Random(11)

    def propose(self, ledger: Ledger) -> Proposal | None:
        if len(ledger.rows) % 3 != 0:
            return None
        params = self.valid.sample(self.rng, ledger.taken)
        return Proposal(params, self.name) if params is not None else None


def test_a_new_proposer_plugs_in_and_its_proposals_are_measured(tmp_path: Path, monkeypatch) -> None:
    job = job_from_dict({"name": "p", "preset": "h200-qwen3-235b", "sampler": {"seed": 3, "guide": False},
                         "budget": {"trials": 9}})
    chain = tune_mod._proposers
    monkeypatch.setattr(tune_mod, "_proposers", lambda ctx, streaks: [EveryThirdRandom(ctx.job),
                                                                      *chain(ctx, streaks)])
    url = f"sqlite:///{tmp_path / 'p.db'}"
    summary = tune(job, storage=url)
    assert summary.executed == 9
    database = db.connect(url)
    try:
        rows = queries.list_trials(database, "p")
    finally:
        database.close()
    mine = [t for t in rows if t.proposer == "third"]
    assert [t.number for t in mine] == [0, 3, 6]
    assert all(t.state is TrialState.COMPLETE and t.executed and t.objectives for t in mine)
    assert {t.proposer for t in rows} == {"third", "sampler"}


class _Blind(dict):
    """A trial's user attributes that refuse to be looked up, but for the two that coordinate workers (which worker
    asked a trial, which configuration a running trial claims): everything else the loop must read from our rows.
    Listing them stays allowed: Optuna's storage copies them whole when it writes a trial."""

    ALLOWED = (WORKER_ATTR, PICKED_ATTR)

    def _check(self, key) -> None:
        if key not in self.ALLOWED:
            raise AssertionError(f"Optuna's trial attribute {key!r} read for a decision")

    def __getitem__(self, key):
        self._check(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._check(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self._check(key)
        return super().__contains__(key)


def _refuse(name: str):
    def raiser(self, *a, **k):
        raise AssertionError(f"Optuna's Study.{name} read for a decision")
    return property(raiser)


@pytest.mark.parametrize("sampler", [{"seed": 2, "guided_trials": 4}, {"kind": "grid", "seed": 3}],
                         ids=["guided", "grid"])
def test_the_loop_decides_from_our_rows_not_optunas_attributes(tmp_path: Path, monkeypatch, sampler) -> None:
    """Behavioural: during the loop, reading any of Optuna's trial attributes (but the workers' own coordination)
    or its best trial raises; a guided study and a grid study still run to their budget. Optuna's samplers read
    parameters, values and constraints, never these."""
    job = job_from_dict({"name": "o", "preset": "h200-qwen3-235b", "sampler": sampler, "budget": {"trials": 8}})
    loop = tune_mod._loop

    def blind_loop(ctx, budget):
        with monkeypatch.context() as m:
            m.setattr(optuna.trial.FrozenTrial, "user_attrs",
                      property(lambda self: _Blind(self._user_attrs), lambda self, v: setattr(self, "_user_attrs", v)))
            m.setattr(optuna.trial.Trial, "user_attrs",
                      property(lambda self: _Blind(self.storage.get_trial_user_attrs(self._trial_id))))
            for name in ("best_trial", "best_trials", "best_value", "best_params", "trials"):
                m.setattr(optuna.Study, name, _refuse(name))
            loop(ctx, budget)

    monkeypatch.setattr(tune_mod, "_loop", blind_loop)
    summary = tune(job, storage=f"sqlite:///{tmp_path / 'o.db'}")
    assert summary.executed == 8, summary.stopped_because
