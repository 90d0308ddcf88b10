"""The ledger: what a study holds, read from our results database — the one source the tune loop and every proposer
decide from.

Optuna is written from our rows (``advisor.trial_record.tell_row``) and never read back for a decision: its trials
carry what it needs to sample, and nothing the loop needs that our rows lack. A ledger is a snapshot, read afresh
for each proposal (``Ledger.read``), so another worker's trials count as soon as their rows are written.

How a row counts (the same rules Optuna is told by): a measured trial (``executed``) judges its configuration, a
failure as much as a success; a trial the environment failed, an interrupted one and an invalid candidate judge
nothing, so their candidates may be proposed again (an invalid one is never proposed: the valid space excludes it).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import db
from advisor.job import TuningJob
from advisor.objectives import Outcome
from advisor.proposers.names import MODEL, MODEL_DECLINED
from advisor.trial_record import told_outcome
from executors import FailureKind
from search_spaces import DeploymentConfig, TrialState
from search_spaces.valid_space import params_key

#: The trial columns a ledger reads (one column-only select, and each trial's configuration once: ``_CONFIGS``).
COLUMNS = ("number", "state", "params", "config", "objectives", "violation", "executed", "proposer",
           "failure_kind", "baseline", "repeat_of", "reused_from")


#: Each database's trial configurations, by (study, trial number), parsed once: re-validating every row's
#: configuration on every read cost about 0.4 s per thousand trials, and a ledger is read twice a trial.
_CONFIGS: weakref.WeakKeyDictionary[db.Database, dict[tuple[str, int], DeploymentConfig | None]] = \
    weakref.WeakKeyDictionary()


class Measured(NamedTuple):
    """A configuration measured in the study: the trial that ran it and what Optuna was told for it."""

    number: int
    values: list[float]
    violation: float


@dataclass(frozen=True)
class Row:
    """One trial as the loop and the proposers read it."""

    number: int
    state: TrialState
    params: Mapping[str, Any]
    config: DeploymentConfig | None
    proposer: str | None
    executed: bool
    baseline: bool
    repeat_of: int | None
    reused_from: int | None
    told: Outcome | None  # what Optuna holds for it (``told_outcome``; None: told FAIL); meaningful where ``judged``
    environment_failed: bool

    @property
    def judged(self) -> bool:
        """Its configuration was measured (complete or failed) and Optuna holds its outcome."""
        return self.executed and self.state in (TrialState.COMPLETE, TrialState.FAILED) and self.told is not None

    @property
    def holds_candidate(self) -> bool:
        """Running, measured, or reusing a measurement: not to be proposed again. Not an invalid candidate, an
        interrupted trial, or one the environment failed (those are told FAIL and may come round again)."""
        if self.state is TrialState.FAILED:
            return not self.environment_failed
        return self.state in (TrialState.RUNNING, TrialState.COMPLETE)


@dataclass(frozen=True)
class Ledger:
    """A study's trials as our rows hold them, and what the loop asks of them."""

    rows: tuple[Row, ...]
    #: Trials the budget counts, search trials running now included (``db.budget``): several workers stop together.
    budget_used: int

    @classmethod
    def read(cls, job: TuningJob, database: db.Database, study: str) -> Ledger:
        columns = [c for c in COLUMNS if c != "config"]
        _, table = db.queries.trial_table(database, study, columns)
        configs = _CONFIGS.setdefault(database, {})
        rows = []
        for r in table:
            v = dict(zip(columns, r, strict=True))
            state = TrialState(v["state"])
            if (study, v["number"]) not in configs:  # a trial's configuration never changes once its row exists
                t = db.queries.get_trial(database, study, v["number"])
                configs[study, v["number"]] = t.config if t is not None else None
            v["config"] = configs[study, v["number"]]
            rows.append(Row(v["number"], state, v["params"] or {}, v["config"], v["proposer"], bool(v["executed"]),
                            bool(v["baseline"]), v["repeat_of"], v["reused_from"],
                            told_outcome(job, state, v["objectives"], v["violation"]),
                            v["failure_kind"] == FailureKind.ENVIRONMENT.value))
        return cls(tuple(rows), database.budget_used(study, in_flight=True))

    @property
    def measured(self) -> dict[str, Measured]:
        """Config key → the trial that measured it (the latest, where one was measured twice)."""
        return {r.config.key(): Measured(r.number, list(r.told.values), r.told.violation)
                for r in self.rows if r.judged and r.told is not None and r.config is not None}

    @property
    def taken(self) -> set[str]:
        """Candidates (``params_key``) the study holds: running, measured, or reusing a measurement."""
        return {params_key(dict(r.params)) for r in self.rows if r.params and r.holds_candidate}

    @property
    def config_keys(self) -> set[str]:
        """Config keys not to propose: those ``taken`` holds, and invalid candidates."""
        return {r.config.key() for r in self.rows
                if r.config is not None and (r.holds_candidate or r.state is TrialState.INVALID)}

    @property
    def turns(self) -> int:
        """Model turns the study has had, in any worker: its picks, and the turns it declined."""
        return sum(1 for r in self.rows if r.proposer in (MODEL, MODEL_DECLINED))

    @property
    def best_value(self) -> float | None:
        """The best feasible first objective measured so far (a model pick predicted below it yields its turn)."""
        vals = [r.told.values[0] for r in self.rows
                if r.judged and r.told is not None and r.state is TrialState.COMPLETE and r.told.feasible]
        return max(vals) if vals else None

    def measured_rows(self) -> list[Row]:
        """The measured trials (complete or failed), by number."""
        return [r for r in self.rows if r.judged]
