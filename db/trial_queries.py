"""Reading studies and trials: the study list with counts and best value, a study's trials, one trial, failures,
the convergence history.

Every function takes a ``Database`` and returns plain rows (``db.rows`` dataclasses and ``search_spaces``
models); ``db.queries`` is the public face that re-exports them. Load levels are ``db.level_queries``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, select

from db.budget import budget_used
from db.engine import Database
from db.mapping import config, export, measurement, study_id, trial
from db.models import ExportRow, MeasurementRow, StudyRow, TrialRow
from db.ranking import RunRow, best_of, deployments, first_objective, objective_maximized
from db.rows import Failure, HistoryPoint, Study, Trial
from search_spaces import TrialState

#: Column names and rows: what the named queries and the column-only reads return.
Table = tuple[list[str], list[list[Any]]]


# ---------------------------------------------------------------------------------------------- studies


def ranked_for(job: dict[str, Any]) -> int | None:
    """The cluster a stored job's answer is ranked for (``advisor.objectives.cluster_gpus`` of the stored
    document, whose defaults are ``per: cluster``, ``scope: deployment``), so the study list names the
    deployment ``advisor best`` does."""
    o, c = job.get("objective") or {}, job.get("cluster") or {}
    if o.get("per", "cluster") != "cluster" or o.get("scope", "deployment") != "deployment":
        return None
    nodes, per_node = c.get("nodes"), c.get("gpus_per_node")
    return nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else None


#: States of a trial whose deployment ran to a result.
_RAN = (TrialState.COMPLETE.value, TrialState.FAILED.value)


def _studies(db: Database, name: str | None) -> list[Study]:
    with db._read() as s:
        q = select(StudyRow).order_by(StudyRow.name)
        if name is not None:
            q = q.where(StudyRow.name == name)
        rows = s.scalars(q).all()
        ids = [r.id for r in rows]
        counts: dict[int, dict[str, int]] = {i: {st.value: 0 for st in TrialState} for i in ids}
        for sid, state, n in s.execute(
            select(TrialRow.study_id, TrialRow.state, func.count())
            .where(TrialRow.study_id.in_(ids))
            .group_by(TrialRow.study_id, TrialRow.state)
        ):
            counts[sid][state] = n
        per_study: dict[int, list[RunRow]] = {i: [] for i in ids}
        for sid, *row in s.execute(
            select(TrialRow.study_id, TrialRow.number, TrialRow.state, TrialRow.objectives, TrialRow.violation,
                   TrialRow.proposer, TrialRow.repeat_of, TrialRow.reused_from, TrialRow.gpus, TrialRow.baseline)
            .where(TrialRow.study_id.in_(ids))
            .order_by(TrialRow.study_id, TrialRow.number)
        ):
            per_study[sid].append(RunRow(*row))
        used = budget_used(s, ids)
        beats = dict(s.execute(select(TrialRow.study_id, func.max(TrialRow.heartbeat_at))
                               .where(TrialRow.study_id.in_(ids), TrialRow.state == TrialState.RUNNING.value)
                               .group_by(TrialRow.study_id)).all())
        out = []
        for r in rows:
            objective, best, best_trial = best_of(per_study[r.id], ranked_for(r.job or {}))
            mine = per_study[r.id]
            bases = {t.number for t in mine if t.baseline}
            out.append(
                Study(
                    name=r.name, description=r.description, job=dict(r.job or {}), executor=r.executor,
                    engine_version=r.engine_version, hardware=r.hardware, optuna_study_name=r.optuna_study_name,
                    created_at=r.created_at, updated_at=r.updated_at, counts=counts[r.id],
                    best_objective=objective, best=best, best_trial=best_trial, budget_used=used[r.id],
                    reused=sum(1 for t in mine if t.reused_from is not None),
                    baseline_runs=sum(1 for t in mine if (t.number in bases or t.repeat_of in bases)
                                      and t.state in _RAN),
                    repeats=sum(1 for t in mine if t.repeat_of is not None and t.repeat_of not in bases
                                and t.state in _RAN),
                    best_runs=next((len(d.values) for d in deployments(mine, objective) if d.trial == best_trial), 0)
                    if objective is not None else 0,
                    heartbeat_at=beats.get(r.id),
                )
            )
        return out


def list_studies(db: Database) -> list[Study]:
    """Every study, by name, with its trials per state and the best objective value so far."""
    return _studies(db, None)


def get_study(db: Database, name: str) -> Study | None:
    found = _studies(db, name)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------- trials


def states_filter(states: Iterable[TrialState | str] | None) -> list[str] | None:
    """Trial states as their stored values (``None``: every state); ``ValueError`` naming the allowed ones."""
    if states is None:
        return None
    out = []
    for st in states:
        try:
            out.append(TrialState(st).value)
        except ValueError:
            raise ValueError(f"unknown trial state {st!r}; allowed: {', '.join(x.value for x in TrialState)}") from None
    return out


def list_trials(db: Database, study: str, *, states: Iterable[TrialState | str] | None = None) -> list[Trial]:
    """The study's trials by number (without their measurements: ``get_trial`` has those)."""
    wanted = states_filter(states)
    with db._read() as s:
        q = select(TrialRow).where(TrialRow.study_id == study_id(s, study)).order_by(TrialRow.number)
        if wanted is not None:
            q = q.where(TrialRow.state.in_(wanted))
        return [trial(r, study) for r in s.scalars(q)]


#: The trial columns ``trial_table`` may return (every ``TrialRow`` column but the keys).
TRIAL_COLUMNS: tuple[str, ...] = tuple(c.key for c in TrialRow.__table__.columns if c.key not in ("id", "study_id"))


def trial_table(db: Database, study: str, columns: Sequence[str], *,
                states: Iterable[TrialState | str] | None = None) -> Table:
    """The study's trials by number as plain rows of only ``columns`` (``TRIAL_COLUMNS`` names).

    One column-only select: a page listing thousands of trials builds no ORM objects and decodes no JSON it
    does not show (``topology``, ``resources``), which ``list_trials`` must. ``state`` comes back as its text
    value and ``config`` as the parsed ``DeploymentConfig`` (``None`` when it no longer validates), as in
    ``Trial.config``.
    """
    unknown = [c for c in columns if c not in TRIAL_COLUMNS]
    if unknown:
        raise ValueError(f"unknown trial column {', '.join(unknown)}; allowed: {', '.join(TRIAL_COLUMNS)}")
    wanted = states_filter(states)
    cols = list(columns)
    with db._read() as s:
        q = (select(*(getattr(TrialRow, c) for c in cols)).where(TrialRow.study_id == study_id(s, study))
             .order_by(TrialRow.number))
        if wanted is not None:
            q = q.where(TrialRow.state.in_(wanted))
        rows = [list(r) for r in s.execute(q)]
    if "config" in cols:
        i = cols.index("config")
        for r in rows:
            r[i] = config(r[i])
    return cols, rows


def get_trial(db: Database, study: str, number: int) -> Trial | None:
    """One trial with its measurements (by concurrency) and exports; ``None`` when there is no such trial."""
    with db._read() as s:
        row = s.scalar(select(TrialRow).where(TrialRow.study_id == study_id(s, study), TrialRow.number == number))
        if row is None:
            return None
        levels = s.scalars(
            select(MeasurementRow).where(MeasurementRow.trial_id == row.id).order_by(MeasurementRow.concurrency)
        ).all()
        exports = s.scalars(select(ExportRow).where(ExportRow.trial_id == row.id).order_by(ExportRow.id)).all()
        return trial(row, study, measurements=[measurement(m) for m in levels], exports=[export(e) for e in exports])


def failures(db: Database, study: str) -> list[Failure]:
    """Trials that did not complete — failed, invalid and interrupted — with their reasons, by number."""
    bad = [TrialState.FAILED.value, TrialState.INVALID.value, TrialState.INTERRUPTED.value]
    with db._read() as s:
        rows = s.execute(
            select(
                TrialRow.number, TrialRow.state, TrialRow.failure_kind, TrialRow.reason, TrialRow.config_text,
                TrialRow.log_tail, TrialRow.finished_at,
            )
            .where(TrialRow.study_id == study_id(s, study), TrialRow.state.in_(bad))
            .order_by(TrialRow.number)
        ).all()
    return [
        Failure(
            number=r.number, state=TrialState(r.state), failure_kind=r.failure_kind, reason=r.reason,
            config_text=r.config_text, log_tail=r.log_tail, finished_at=r.finished_at,
        )
        for r in rows
    ]


def history(db: Database, study: str, objective: str | None = None, *, maximize: bool | None = None) -> list[HistoryPoint]:
    """Per trial (by number): its ``objective`` value and the best so far over complete, feasible trials.

    ``objective`` defaults to the first one the study's trials recorded; ``maximize`` defaults to
    ``objective_maximized(objective)``.
    """
    _, rows = trial_table(db, study, ["number", "state", "objectives", "violation"])  # column-only: fast
    trials = [(n, TrialState(state), objs, violation is None or violation <= 0) for n, state, objs, violation in rows]
    name = objective or first_objective(t[2] for t in trials)
    if name is None:
        return [HistoryPoint(n, state, None, feasible, None) for n, state, _, feasible in trials]
    sign = 1 if (objective_maximized(name) if maximize is None else maximize) else -1
    best: float | None = None
    out = []
    for number, state, objs, feasible in trials:
        value = (objs or {}).get(name)
        if state is TrialState.COMPLETE and feasible and value is not None:
            if best is None or sign * value > sign * best:
                best = value
        out.append(HistoryPoint(number=number, state=state, value=value, feasible=feasible, best=best))
    return out

