"""Reading results: studies, trials, load levels, the best deployment under SLOs, the Pareto front, convergence.

Every function takes a ``Database`` and returns plain rows (``db.rows`` dataclasses and ``search_spaces``
models). ``NAMED_QUERIES`` is what ``advisor query NAME [args]`` may run — named queries only, never SQL.

Which way is better: throughput and tokens/s per user (``search_spaces.HIGHER_IS_BETTER``) are maximized,
latencies (``*_ms``) minimized. "Best" and "Pareto" consider COMPLETE trials only (a trial that failed at a
higher load is not recommended for the load it survived), and only levels that completed a request.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from db.engine import Database, _config, _export, _measurement, _trial
from db.models import MEASUREMENT_COLUMNS, ExportRow, MeasurementRow, StudyRow, TrialRow
from db.rows import Best, Failure, HistoryPoint, Level, Study, Trial, UnknownStudy
from search_spaces import HIGHER_IS_BETTER, SLO, SLO_METRICS, Measurement, TrialState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: The columns of a load level, in ``Measurement``'s field order (everything but ``raw``).
LEVEL_FIELDS: tuple[str, ...] = tuple(f for f in Measurement.model_fields if f != "raw")

#: Column names and rows: what the named queries and the column-only reads return.
Table = tuple[list[str], list[list[Any]]]


# ---------------------------------------------------------------------------------------------- directions


def _metric_sign(metric: str) -> int:
    """+1 when more is better, -1 when less is; only metrics whose direction is known may rank levels."""
    if metric not in SLO_METRICS:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(SLO_METRICS)}")
    return 1 if metric in HIGHER_IS_BETTER else -1


def objective_maximized(name: str) -> bool:
    """An objective is minimized when it is a latency (``*_ms``), maximized otherwise."""
    return not name.endswith("_ms")


# ---------------------------------------------------------------------------------------------- studies


def _study_id(s: Session, name: str) -> int:
    return Database._study_id(s, name)


def _first_objective(objs: Iterable[dict[str, Any] | None]) -> str | None:
    for o in objs:
        if o:
            return next(iter(o))
    return None


def _best_of(trials: Sequence[tuple[int, str, dict[str, Any] | None, float | None]]) -> tuple[str | None, float | None, int | None]:
    """(objective, best value, trial number) over complete, feasible trials; trials sorted by number."""
    name = _first_objective(t[2] for t in trials)
    if name is None:
        return None, None, None
    sign = 1 if objective_maximized(name) else -1
    best: float | None = None
    best_n: int | None = None
    for number, state, objs, violation in trials:
        value = (objs or {}).get(name)
        if state != TrialState.COMPLETE.value or value is None or (violation is not None and violation > 0):
            continue
        if best is None or sign * value > sign * best:
            best, best_n = value, number
    return name, best, best_n


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
        per_study: dict[int, list[tuple[int, str, dict[str, Any] | None, float | None]]] = {i: [] for i in ids}
        for sid, number, state, objs, violation in s.execute(
            select(TrialRow.study_id, TrialRow.number, TrialRow.state, TrialRow.objectives, TrialRow.violation)
            .where(TrialRow.study_id.in_(ids))
            .order_by(TrialRow.study_id, TrialRow.number)
        ):
            per_study[sid].append((number, state, objs, violation))
        out = []
        for r in rows:
            objective, best, best_trial = _best_of(per_study[r.id])
            out.append(
                Study(
                    name=r.name, description=r.description, job=dict(r.job or {}), executor=r.executor,
                    engine_version=r.engine_version, hardware=r.hardware, optuna_study_name=r.optuna_study_name,
                    created_at=r.created_at, updated_at=r.updated_at, counts=counts[r.id],
                    best_objective=objective, best=best, best_trial=best_trial,
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


def _states(states: Iterable[TrialState | str] | None) -> list[str] | None:
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
    wanted = _states(states)
    with db._read() as s:
        q = select(TrialRow).where(TrialRow.study_id == _study_id(s, study)).order_by(TrialRow.number)
        if wanted is not None:
            q = q.where(TrialRow.state.in_(wanted))
        return [_trial(r, study) for r in s.scalars(q)]


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
    wanted = _states(states)
    cols = list(columns)
    with db._read() as s:
        q = (select(*(getattr(TrialRow, c) for c in cols)).where(TrialRow.study_id == _study_id(s, study))
             .order_by(TrialRow.number))
        if wanted is not None:
            q = q.where(TrialRow.state.in_(wanted))
        rows = [list(r) for r in s.execute(q)]
    if "config" in cols:
        i = cols.index("config")
        for r in rows:
            r[i] = _config(r[i])
    return cols, rows


def get_trial(db: Database, study: str, number: int) -> Trial | None:
    """One trial with its measurements (by concurrency) and exports; ``None`` when there is no such trial."""
    with db._read() as s:
        row = s.scalar(select(TrialRow).where(TrialRow.study_id == _study_id(s, study), TrialRow.number == number))
        if row is None:
            return None
        levels = s.scalars(
            select(MeasurementRow).where(MeasurementRow.trial_id == row.id).order_by(MeasurementRow.concurrency)
        ).all()
        exports = s.scalars(select(ExportRow).where(ExportRow.trial_id == row.id).order_by(ExportRow.id)).all()
        return _trial(row, study, measurements=[_measurement(m) for m in levels], exports=[_export(e) for e in exports])


def failures(db: Database, study: str) -> list[Failure]:
    """Trials that did not complete — failed, invalid and interrupted — with their reasons, by number."""
    bad = [TrialState.FAILED.value, TrialState.INVALID.value, TrialState.INTERRUPTED.value]
    with db._read() as s:
        rows = s.execute(
            select(
                TrialRow.number, TrialRow.state, TrialRow.failure_kind, TrialRow.reason, TrialRow.config_text,
                TrialRow.log_tail, TrialRow.finished_at,
            )
            .where(TrialRow.study_id == _study_id(s, study), TrialRow.state.in_(bad))
            .order_by(TrialRow.number)
        ).all()
    return [
        Failure(
            number=r.number, state=TrialState(r.state), failure_kind=r.failure_kind, reason=r.reason,
            config_text=r.config_text, log_tail=r.log_tail, finished_at=r.finished_at,
        )
        for r in rows
    ]


# ---------------------------------------------------------------------------------------------- load levels


def measurements(db: Database, study: str, *, states: Iterable[TrialState | str] | None = None) -> list[Level]:
    """Every trial × load level of the study (any trial state unless ``states``), by trial number, concurrency."""
    wanted = _states(states)
    with db._read() as s:
        q = (
            select(MeasurementRow, TrialRow.id, TrialRow.number, TrialRow.state, TrialRow.config_text, TrialRow.gpus)
            .join(TrialRow, MeasurementRow.trial_id == TrialRow.id)
            .where(TrialRow.study_id == _study_id(s, study))
            .order_by(TrialRow.number, MeasurementRow.concurrency)
        )
        if wanted is not None:
            q = q.where(TrialRow.state.in_(wanted))
        return [
            Level(
                trial_id=tid, trial_number=number, state=TrialState(state), config_text=text, gpus=gpus,
                measurement=_measurement(m),
            )
            for m, tid, number, state, text, gpus in s.execute(q)
        ]


def level_table(db: Database, study: str, columns: Sequence[str] = MEASUREMENT_COLUMNS, *,
                states: Iterable[TrialState | str] | None = None) -> tuple[list[str], list[Any]]:
    """Every trial × load level as plain rows: ``trial``, ``state``, ``config_text``, ``trial_gpus`` (the
    trial's), then the level's ``columns`` (``MEASUREMENT_COLUMNS`` names); ordered as ``measurements``.

    One column-only select, for pages that tabulate thousands of levels: no ``Measurement`` is validated per
    level and ``raw`` (JSON) is not read. Rows are SQLAlchemy rows, so ``row.p90_ttft_ms`` reads like a
    ``Measurement`` (``SLO.met(row)`` works) — missing data is ``None``.
    """
    unknown = [c for c in columns if c not in MEASUREMENT_COLUMNS]
    if unknown:
        raise ValueError(f"unknown measurement column {', '.join(unknown)}; "
                         f"allowed: {', '.join(MEASUREMENT_COLUMNS)}")
    wanted = _states(states)
    head = ["trial", "state", "config_text", "trial_gpus"]
    with db._read() as s:
        q = (
            select(TrialRow.number.label("trial"), TrialRow.state, TrialRow.config_text,
                   TrialRow.gpus.label("trial_gpus"), *(getattr(MeasurementRow, c) for c in columns))
            .join(TrialRow, MeasurementRow.trial_id == TrialRow.id)
            .where(TrialRow.study_id == _study_id(s, study))
            .order_by(TrialRow.number, MeasurementRow.concurrency)
        )
        if wanted is not None:
            q = q.where(TrialRow.state.in_(wanted))
        return [*head, *columns], list(s.execute(q).all())


def _eligible(db: Database, study: str, slos: Sequence[SLO] | None, metrics: Sequence[str]) -> list[Level]:
    """Levels of COMPLETE trials that completed requests, have every metric, and meet every SLO."""
    out = []
    for lv in measurements(db, study, states=[TrialState.COMPLETE]):
        m = lv.measurement
        if m.completed <= 0 or any(getattr(m, k) is None for k in metrics):
            continue
        if slos and not all(slo.met(m) for slo in slos):
            continue
        out.append(lv)
    return out


def best_under_slo(
    db: Database, study: str, slos: Sequence[SLO], metric: str = "throughput_per_gpu"
) -> Best | None:
    """The trial × level with the best ``metric`` (highest; lowest for a latency) among levels meeting every SLO.

    Returns ``(trial, measurement)`` (a ``Best``, which also reads like a ``Level``); ties go to the lower trial
    number, then the lower concurrency; ``None`` when no level qualifies.
    """
    sign = _metric_sign(metric)
    levels = _eligible(db, study, slos, [metric])
    if not levels:
        return None
    best = min(levels, key=lambda lv: (-sign * lv.metric(metric), lv.trial_number, lv.measurement.concurrency))
    trial = get_trial(db, study, best.trial_number)
    assert trial is not None
    return Best(trial, best.measurement)


def pareto_front(
    db: Database,
    study: str,
    x: str = "throughput_per_gpu",
    y: str = "p90_tokens_per_s_per_user",
    slos: Sequence[SLO] | None = None,
) -> list[Level]:
    """The non-dominated trial × level points on ``x`` and ``y`` (both maximized for the defaults; a latency
    axis is minimized), optionally only levels meeting every SLO; best ``x`` first. Equal points are all kept."""
    sx, sy = _metric_sign(x), _metric_sign(y)  # an unknown metric is a ValueError before anything is read
    pts = _eligible(db, study, slos, [x, y])
    keep = pareto_mask([lv.metric(x) for lv in pts], [lv.metric(y) for lv in pts], x, y)
    return sorted(
        (lv for lv, k in zip(pts, keep) if k),
        key=lambda lv: (-sx * lv.metric(x), -sy * lv.metric(y), lv.trial_number, lv.measurement.concurrency),
    )


def pareto_mask(xs: Sequence[float | None], ys: Sequence[float | None], x: str = "throughput_per_gpu",
                y: str = "p90_tokens_per_s_per_user") -> list[bool]:
    """Which points (``xs[i]``, ``ys[i]``) are non-dominated on metrics ``x`` and ``y`` (directions as in
    ``pareto_front``, which uses it; equal points are all kept; a missing or NaN value is never on the front).

    Public so that a page holding levels as columns marks the very front ``pareto_front`` returns, in
    O(n log n), without reading them again.
    """
    sx, sy = _metric_sign(x), _metric_sign(y)
    keep = [False] * len(xs)
    valid = [i for i, (a, b) in enumerate(zip(xs, ys))
             if a is not None and b is not None and not math.isnan(a) and not math.isnan(b)]
    order = sorted(valid, key=lambda i: (-sx * xs[i], -sy * ys[i]))  # type: ignore[operator]
    best_y: float | None = None  # best y among points with a strictly better x
    i = 0
    while i < len(order):
        gx = sx * xs[order[i]]  # type: ignore[operator]
        j = i
        while j < len(order) and sx * xs[order[j]] == gx:  # type: ignore[operator]
            j += 1
        top = sy * ys[order[i]]  # type: ignore[operator]  # the group's best y: sorted first
        if best_y is None or top > best_y:
            for k in order[i:j]:
                keep[k] = sy * ys[k] == top  # type: ignore[operator]
            best_y = top
        i = j
    return keep


def history(db: Database, study: str, objective: str | None = None, *, maximize: bool | None = None) -> list[HistoryPoint]:
    """Per trial (by number): its ``objective`` value and the best so far over complete, feasible trials.

    ``objective`` defaults to the first one the study's trials recorded; ``maximize`` defaults to
    ``objective_maximized(objective)``.
    """
    _, rows = trial_table(db, study, ["number", "state", "objectives", "violation"])  # column-only: fast
    trials = [(n, TrialState(state), objs, violation is None or violation <= 0) for n, state, objs, violation in rows]
    name = objective or _first_objective(t[2] for t in trials)
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


# ---------------------------------------------------------------------------------------------- named queries


class QueryError(ValueError):
    """A named query was asked for wrongly (unknown name, missing or bad argument): one line for the user."""


_SLO_RE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|>=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


def parse_slos(text: str) -> list[SLO]:
    """``"p90_ttft_ms<=2000,p90_tokens_per_s_per_user>=20"`` → SLOs. Empty text → no SLOs."""
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _SLO_RE.match(part)
        if not m:
            raise ValueError(f"SLO {part.strip()!r} is not METRIC<=VALUE or METRIC>=VALUE")
        metric, op, value = m.groups()
        if metric not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {metric!r}; allowed: {', '.join(SLO_METRICS)}")
        out.append(SLO(metric=metric, op=op, value=float(value)))
    return out


_REQUIRED: Any = object()


@dataclass(frozen=True)
class QueryArg:
    name: str
    type: type  # str, int or float
    help: str
    default: Any = _REQUIRED

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@dataclass(frozen=True)
class NamedQuery:
    """A query the CLI may run: ``advisor query NAME [VALUE | ARG=VALUE ...]`` (values in declared order).

    ``run(db, **typed_args)`` runs it (missing optional arguments take their defaults); ``q(db, ["a", "k=v"])``
    parses strings first. Either raises ``QueryError`` (one line) for what the user got wrong.
    """

    name: str
    help: str
    args: tuple[QueryArg, ...]
    fn: Callable[..., Table]

    def run(self, db: Database, **kwargs: Any) -> Table:
        return self(db, kwargs)

    def parse(self, given: Sequence[str] | Mapping[str, Any] = ()) -> dict[str, Any]:
        """Arguments from ``["study1", "metric=p90_ttft_ms"]`` or a mapping, typed, defaults filled in."""
        by_name = {a.name: a for a in self.args}
        raw: dict[str, Any] = {}
        if isinstance(given, Mapping):
            raw.update(given)
        else:
            positional = iter(self.args)
            for item in given:
                key, sep, value = item.partition("=")
                if sep and key in by_name:
                    raw[key] = value
                    continue
                arg = next((a for a in positional if a.name not in raw), None)
                if arg is None:
                    raise QueryError(f"query {self.name}: unexpected argument {item!r}; it takes: {self.usage()}")
                raw[arg.name] = item
        unknown = sorted(set(raw) - set(by_name))
        if unknown:
            raise QueryError(f"query {self.name}: unknown argument {', '.join(unknown)}; it takes: {self.usage()}")
        out: dict[str, Any] = {}
        for a in self.args:
            if a.name not in raw or raw[a.name] is None:
                if a.required:
                    raise QueryError(f"query {self.name} needs {a.name} ({a.help}); usage: {self.usage()}")
                out[a.name] = a.default
                continue
            try:
                out[a.name] = a.type(raw[a.name])
            except (TypeError, ValueError):
                raise QueryError(
                    f"query {self.name}: {a.name} must be {a.type.__name__}, got {raw[a.name]!r}"
                ) from None
        return out

    def usage(self) -> str:
        parts = [a.name if a.required else f"[{a.name}={a.default!r}]" for a in self.args]
        return f"{self.name} {' '.join(parts)}".strip()

    def __call__(self, db: Database, given: Sequence[str] | Mapping[str, Any] = ()) -> Table:
        kwargs = self.parse(given)
        try:
            return self.fn(db, **kwargs)
        except QueryError:
            raise
        except (UnknownStudy, ValueError) as e:  # unknown study, metric, state or SLO: the user's input
            raise QueryError(f"query {self.name}: {e}") from None


def run_query(db: Database, name: str, given: Sequence[str] | Mapping[str, Any] = ()) -> Table:
    """Run the named query ``name``; ``QueryError`` (one line) for anything the user got wrong."""
    q = NAMED_QUERIES.get(name)
    if q is None:
        raise QueryError(f"unknown query {name!r}; allowed: {', '.join(NAMED_QUERIES)}")
    return q(db, given)


def _cell(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat(timespec="seconds")
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return v


def _last_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else None


def _q_studies(db: Database) -> Table:
    cols = ["name", "description", "executor", "trials", "complete", "failed", "invalid", "running", "interrupted",
            "best_objective", "best", "best_trial", "updated_at"]
    rows = [
        [st.name, st.description, st.executor, st.trials, st.done, st.failed, st.invalid, st.running,
         st.interrupted, st.best_objective, st.best, st.best_trial, st.updated_at]
        for st in list_studies(db)
    ]
    return cols, [[_cell(v) for v in r] for r in rows]


def _q_trials(db: Database, study: str, states: str) -> Table:
    wanted = [p.strip() for p in states.split(",") if p.strip()] or None
    trials = list_trials(db, study, states=wanted)
    objs: list[str] = []
    for t in trials:
        objs += [k for k in (t.objectives or {}) if k not in objs]
    cols = ["trial", "state", "gpus", "config", *objs, "violation", "failure_kind", "reason",
            "deploy_s", "warmup_s", "measure_s", "teardown_s", "worker", "proposer", "repeat_of",
            *[f"predicted_{k}" for k in objs], "started_at", "finished_at"]
    rows = [
        [t.number, t.state, t.gpus, t.config_text, *[(t.objectives or {}).get(k) for k in objs], t.violation,
         t.failure_kind, t.reason, t.deploy_s, t.warmup_s, t.measure_s, t.teardown_s, t.worker, t.proposer,
         t.repeat_of, *[(t.predicted or {}).get(k) for k in objs], t.started_at, t.finished_at]
        for t in trials
    ]
    return cols, [[_cell(v) for v in r] for r in rows]


def _level_table(levels: Iterable[Level]) -> Table:
    cols = ["trial", "state", "config", *LEVEL_FIELDS]
    rows = [
        [_cell(v) for v in [lv.trial_number, lv.state, lv.config_text, *(lv.metric(f) for f in LEVEL_FIELDS)]]
        for lv in levels
    ]
    return cols, rows


def _q_measurements(db: Database, study: str) -> Table:
    return _level_table(measurements(db, study))


def _q_trial(db: Database, study: str, number: int) -> Table:
    t = get_trial(db, study, number)
    if t is None:
        raise QueryError(f"study {study!r} has no trial {number}")
    return _level_table(
        Level(t.id, t.number, t.state, t.config_text, t.gpus, m) for m in t.measurements
    )


def _q_best(db: Database, study: str, slo: str, metric: str) -> Table:
    found = best_under_slo(db, study, parse_slos(slo), metric)
    if found is None:
        return _level_table([])
    t, m = found
    return _level_table([Level(t.id, t.number, t.state, t.config_text, t.gpus, m)])


def _q_pareto(db: Database, study: str, x: str, y: str, slo: str) -> Table:
    cols = ["trial", "config", "gpus", "concurrency", x, y]
    rows = [
        [lv.trial_number, lv.config_text, lv.gpus, lv.measurement.concurrency, lv.metric(x), lv.metric(y)]
        for lv in pareto_front(db, study, x, y, parse_slos(slo) or None)
    ]
    return cols, rows


def _q_history(db: Database, study: str, objective: str) -> Table:
    cols = ["trial", "state", "value", "feasible", "best"]
    rows = [[p.number, p.state.value, p.value, p.feasible, p.best] for p in history(db, study, objective or None)]
    return cols, rows


def _q_failures(db: Database, study: str) -> Table:
    cols = ["trial", "state", "failure_kind", "reason", "config", "last_log_line", "finished_at"]
    rows = [
        [_cell(v) for v in [f.number, f.state, f.failure_kind, f.reason, f.config_text, _last_line(f.log_tail),
                            f.finished_at]]
        for f in failures(db, study)
    ]
    return cols, rows


_STUDY = QueryArg("study", str, "the study's name")
_SLO = QueryArg("slo", str, "comma-separated SLOs, e.g. 'p90_ttft_ms<=2000,p90_tokens_per_s_per_user>=20'", "")

NAMED_QUERIES: dict[str, NamedQuery] = {
    q.name: q
    for q in [
        NamedQuery("studies", "every study with its trials per state and best objective so far", (), _q_studies),
        NamedQuery(
            "trials", "a study's trials: state, GPUs, deployment, objectives, reason, phase timings",
            (_STUDY, QueryArg("states", str, "comma-separated states to keep (default: all)", "")), _q_trials,
        ),
        NamedQuery("trial", "one trial's load levels with every metric",
                   (_STUDY, QueryArg("number", int, "the trial number")), _q_trial),
        NamedQuery("measurements", "every trial × load level with every metric", (_STUDY,), _q_measurements),
        NamedQuery(
            "best", "the trial × load level with the best metric among those meeting every SLO",
            (_STUDY, _SLO, QueryArg("metric", str, "metric to rank by", "throughput_per_gpu")), _q_best,
        ),
        NamedQuery(
            "pareto", "non-dominated trial × load levels on two metrics (optionally SLO-meeting only)",
            (_STUDY, QueryArg("x", str, "first metric", "throughput_per_gpu"),
             QueryArg("y", str, "second metric", "p90_tokens_per_s_per_user"), _SLO),
            _q_pareto,
        ),
        NamedQuery(
            "history", "per trial: objective value and best so far (convergence)",
            (_STUDY, QueryArg("objective", str, "objective name (default: the study's first)", "")), _q_history,
        ),
        NamedQuery("failures", "failed, invalid and interrupted trials with their reasons", (_STUDY,), _q_failures),
    ]
}

__all__ = [
    "Best", "LEVEL_FIELDS", "MEASUREMENT_COLUMNS", "NAMED_QUERIES", "NamedQuery", "QueryArg", "QueryError",
    "TRIAL_COLUMNS", "best_under_slo", "failures", "get_study", "get_trial", "history", "level_table",
    "list_studies", "list_trials", "measurements", "objective_maximized", "pareto_front", "pareto_mask",
    "parse_slos", "run_query", "trial_table",
]
