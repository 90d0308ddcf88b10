"""Row mapping: ORM rows to what ``db`` hands back (``db.rows`` dataclasses, ``search_spaces`` models) and back.

Both the writes (``db.engine``) and the reads (``db.queries``) go through these functions, so a stored value is
turned into a ``Trial`` or ``Measurement`` the same way everywhere, and what is written is checked and cut to
its column the same way on SQLite and PostgreSQL.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import MEASUREMENT_COLUMNS, ExportRow, MeasurementRow, StudyRow, TrialRow
from db.rows import TIMING_KEYS, Export, Trial, UnknownStudy
from search_spaces import DeploymentConfig, Measurement, TrialState, metric

#: ``Measurement`` fields without a column of their own travel in ``raw`` under this key.
UNMAPPED = "__unmapped__"


# ---------------------------------------------------------------------------------------------- values


def nan_to_none(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def text(value: str | None, limit: int | None = None) -> str | None:
    """PostgreSQL text cannot hold NUL bytes (process output sometimes does); keep the tail of long text."""
    if value is None:
        return None
    value = str(value).replace("\x00", "\ufffd")
    return value[-limit:] if limit is not None and len(value) > limit else value


def clip(value: str | None, limit: int) -> str | None:
    """Short labels (worker, failure kind, hardware, …) are cut to their column's width, the same on every backend
    (PostgreSQL would refuse a longer one and lose the whole write)."""
    return None if value is None else text(value)[:limit]  # type: ignore[index]


# ---------------------------------------------------------------------------------------------- rows


def measurement_row(trial_id: int, m: Measurement) -> MeasurementRow:
    """A level's ``Measurement`` as its row; fields without a column, and declared metrics ``Measurement`` carries
    as extras (``search_spaces.metrics``), go into ``raw``."""
    data = m.model_dump(exclude={"raw"})
    raw: dict[str, Any] = dict(m.model_dump(mode="json", include={"raw"})["raw"])
    unmapped = {k: data.pop(k) for k in list(data) if k not in MEASUREMENT_COLUMNS}
    if unmapped:
        raw[UNMAPPED] = unmapped
    data["source"] = clip(data["source"], 32)
    return MeasurementRow(trial_id=trial_id, raw=raw, **{k: nan_to_none(v) for k, v in data.items()})


def measurement(r: MeasurementRow) -> Measurement:
    """A stored level as a ``Measurement`` (unvalidated when stored under an older vocabulary)."""
    fields = Measurement.model_fields
    raw = dict(r.raw or {})
    data: dict[str, Any] = {k: getattr(r, k) for k in MEASUREMENT_COLUMNS if k in fields}
    data.update({k: v for k, v in raw.pop(UNMAPPED, {}).items() if k in fields or metric(k) is not None})
    try:
        return Measurement.model_validate({**data, "raw": raw})
    except ValidationError:  # stored under an older vocabulary: show what there is
        return Measurement.model_construct(**data, raw=raw)


def config(data: dict[str, Any] | None) -> DeploymentConfig | None:
    """A stored deployment as a ``DeploymentConfig``; ``None`` when absent or no longer valid."""
    if data is None:
        return None
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError:
        return None


def export(r: ExportRow) -> Export:
    return Export(id=r.id, trial_id=r.trial_id, format=r.format, path=r.path, sha256=r.sha256, created_at=r.created_at)


def trial(r: TrialRow, study: str, *, measurements: Sequence[Measurement] = (), exports: Sequence[Export] = ()) -> Trial:
    return Trial(
        id=r.id,
        study=study,
        number=r.number,
        state=TrialState(r.state),
        params=dict(r.params or {}),
        config=config(r.config),
        config_json=r.config,
        config_text=r.config_text,
        topology=r.topology,
        gpus=r.gpus,
        objectives=r.objectives,
        violation=r.violation,
        failure_kind=r.failure_kind,
        reason=r.reason,
        log_tail=r.log_tail,
        deploy_s=r.deploy_s,
        warmup_s=r.warmup_s,
        measure_s=r.measure_s,
        teardown_s=r.teardown_s,
        resources=r.resources,
        heartbeat_at=r.heartbeat_at,
        worker=r.worker,
        proposer=r.proposer,
        predicted=r.predicted,
        repeat_of=r.repeat_of,
        executed=r.executed,
        reused_from=r.reused_from,
        baseline=r.baseline,
        started_at=r.started_at,
        finished_at=r.finished_at,
        measurements=tuple(measurements),
        exports=tuple(exports),
    )


def study_id(s: Session, name: str) -> int:
    """The row id of the study ``name``; ``UnknownStudy`` (naming some known ones) when there is none."""
    sid = s.scalar(select(StudyRow.id).where(StudyRow.name == name))
    if sid is None:
        known = s.scalars(select(StudyRow.name).order_by(StudyRow.name).limit(20)).all()
        raise UnknownStudy(f"no study named {name!r}; known: {', '.join(known) if known else '(none)'}")
    return sid


# ---------------------------------------------------------------------------------------------- checks


def check_timings(timings: Mapping[str, float | None] | None) -> dict[str, float | None]:
    if not timings:
        return {}
    unknown = sorted(set(timings) - set(TIMING_KEYS))
    if unknown:
        raise ValueError(f"unknown timing {', '.join(unknown)}; allowed: {', '.join(TIMING_KEYS)}")
    return {k: None if v is None else nan_to_none(float(v)) for k, v in timings.items()}


def check_objectives(objectives: Mapping[str, float | None] | None) -> dict[str, float | None] | None:
    if objectives is None:
        return None
    return {str(k): None if v is None else float(v) for k, v in objectives.items()}


def check_levels(measurements: Sequence[Measurement]) -> list[Measurement]:
    levels = list(measurements)
    seen: set[tuple[int, float | None]] = set()
    for m in levels:
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements must be search_spaces.Measurement, got {type(m).__name__}")
        key = (m.concurrency, m.request_rate)
        if key in seen:
            raise ValueError(f"two measurements for {m.label()}; one load level is one Measurement")
        seen.add(key)
    return levels
