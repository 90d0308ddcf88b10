"""Reading load levels: every trial × level of a study (as ``Level`` rows or plain columns), the best level under
SLOs, the Pareto front.

"Best" and "Pareto" consider COMPLETE trials only (a trial that failed at a higher load is not recommended for
the load it survived), and only levels that completed a request; directions are ``db.ranking``'s. ``db.queries``
is the public face that re-exports these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select

from db.engine import Database
from db.mapping import measurement, study_id
from db.models import MEASUREMENT_COLUMNS, MeasurementRow, TrialRow
from db.ranking import metric_sign, pareto_mask
from db.rows import Best, Level
from db.trial_queries import get_trial, states_filter
from search_spaces import DEFAULT_OBJECTIVE, DEFAULT_PARETO_Y, SLO, TrialState


# ---------------------------------------------------------------------------------------------- load levels


def measurements(db: Database, study: str, *, states: Iterable[TrialState | str] | None = None) -> list[Level]:
    """Every trial × load level of the study (any trial state unless ``states``), by trial number, concurrency."""
    wanted = states_filter(states)
    with db._read() as s:
        q = (
            select(MeasurementRow, TrialRow.id, TrialRow.number, TrialRow.state, TrialRow.config_text, TrialRow.gpus)
            .join(TrialRow, MeasurementRow.trial_id == TrialRow.id)
            .where(TrialRow.study_id == study_id(s, study))
            .order_by(TrialRow.number, MeasurementRow.concurrency)
        )
        if wanted is not None:
            q = q.where(TrialRow.state.in_(wanted))
        return [
            Level(
                trial_id=tid, trial_number=number, state=TrialState(state), config_text=text, gpus=gpus,
                measurement=measurement(m),
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
    wanted = states_filter(states)
    head = ["trial", "state", "config_text", "trial_gpus"]
    with db._read() as s:
        q = (
            select(TrialRow.number.label("trial"), TrialRow.state, TrialRow.config_text,
                   TrialRow.gpus.label("trial_gpus"), *(getattr(MeasurementRow, c) for c in columns))
            .join(TrialRow, MeasurementRow.trial_id == TrialRow.id)
            .where(TrialRow.study_id == study_id(s, study))
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
    db: Database, study: str, slos: Sequence[SLO], metric: str = DEFAULT_OBJECTIVE
) -> Best | None:
    """The trial × level with the best ``metric`` (highest; lowest for a latency) among levels meeting every SLO.

    Returns ``(trial, measurement)`` (a ``Best``, which also reads like a ``Level``); ties go to the lower trial
    number, then the lower concurrency; ``None`` when no level qualifies.
    """
    sign = metric_sign(metric)
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
    x: str = DEFAULT_OBJECTIVE,
    y: str = DEFAULT_PARETO_Y,
    slos: Sequence[SLO] | None = None,
) -> list[Level]:
    """The non-dominated trial × level points on ``x`` and ``y`` (both maximized for the defaults; a latency
    axis is minimized), optionally only levels meeting every SLO; best ``x`` first. Equal points are all kept."""
    sx, sy = metric_sign(x), metric_sign(y)  # an unknown metric is a ValueError before anything is read
    pts = _eligible(db, study, slos, [x, y])
    keep = pareto_mask([lv.metric(x) for lv in pts], [lv.metric(y) for lv in pts], x, y)
    return sorted(
        (lv for lv, k in zip(pts, keep) if k),
        key=lambda lv: (-sx * lv.metric(x), -sy * lv.metric(y), lv.trial_number, lv.measurement.concurrency),
    )


