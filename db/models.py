"""The ORM tables. Private to ``db``: nothing outside this package sees these classes.

Every table is prefixed ``advisor_`` so it sits beside Optuna's own RDB tables in the same database.
A schema change here needs a new revision under ``db/migrations/versions`` (``tests/test_db.py`` checks
that the migrated schema and these models agree).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.sql.expression import false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

#: Constraint names are spelled out so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

TABLE_PREFIX = "advisor_"
#: Alembic's bookkeeping table for our migrations (Optuna keeps its own ``alembic_version``).
VERSION_TABLE = "advisor_alembic_version"


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out — also on SQLite, which stores no zone."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware (UTC) datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _json() -> JSON:
    # None is stored as SQL NULL, not the JSON literal 'null'.
    return JSON(none_as_null=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StudyRow(Base):
    __tablename__ = "advisor_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    job: Mapped[dict[str, Any]] = mapped_column(_json())
    description: Mapped[str | None] = mapped_column(Text)
    executor: Mapped[str | None] = mapped_column(String(32))
    engine_version: Mapped[str | None] = mapped_column(String(64))
    hardware: Mapped[str | None] = mapped_column(String(200))
    optuna_study_name: Mapped[str | None] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    trials: Mapped[list[TrialRow]] = relationship(back_populates="study", passive_deletes=True)


class TrialRow(Base):
    __tablename__ = "advisor_trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number"),
        Index("ix_advisor_trials_study_id_state", "study_id", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("advisor_studies.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    #: ``search_spaces.TrialState`` value, stored as text so it is never renumbered.
    state: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]] = mapped_column(_json())
    #: ``DeploymentConfig.model_dump(mode="json")``
    config: Mapped[dict[str, Any] | None] = mapped_column(_json())
    #: ``DeploymentConfig.describe()``
    config_text: Mapped[str | None] = mapped_column(Text)
    topology: Mapped[dict[str, Any] | None] = mapped_column(_json())
    gpus: Mapped[int | None] = mapped_column(Integer)
    objectives: Mapped[dict[str, Any] | None] = mapped_column(_json())
    violation: Mapped[float | None] = mapped_column(Double)
    failure_kind: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    log_tail: Mapped[str | None] = mapped_column(Text)
    deploy_s: Mapped[float | None] = mapped_column(Double)
    warmup_s: Mapped[float | None] = mapped_column(Double)
    measure_s: Mapped[float | None] = mapped_column(Double)
    teardown_s: Mapped[float | None] = mapped_column(Double)
    #: What a crash leaves behind (process groups, placement groups, ports), for the cleanup after one.
    resources: Mapped[dict[str, Any] | None] = mapped_column(_json())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    worker: Mapped[str | None] = mapped_column(String(200))
    #: Who proposed the candidate: "model" (``advisor.proposers.guide``), "sampler" (Optuna), "grid"; NULL before 0002.
    proposer: Mapped[str | None] = mapped_column(String(16))
    #: Since 0003: the performance model's objective values for this candidate before it ran ({name: value}).
    predicted: Mapped[dict[str, Any] | None] = mapped_column(_json())
    #: Since 0003: a repeat's original trial number (``budget.repeat_top``); NULL otherwise.
    repeat_of: Mapped[int | None] = mapped_column(Integer)
    #: Since 0006: this trial deployed its configuration and its result judges it (complete or failed; not an
    #: environment failure, an interrupted run, an invalid candidate or a reused measurement).
    executed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: Since 0006: the trial whose measurements this one reuses (the same configuration proposed again; nothing ran).
    reused_from: Mapped[int | None] = mapped_column(Integer)
    #: Since 0006: vLLM's defaults, measured once before the search (its repeats carry ``repeat_of`` instead).
    baseline: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    study: Mapped[StudyRow] = relationship(back_populates="trials")
    measurements: Mapped[list[MeasurementRow]] = relationship(
        back_populates="trial", order_by="MeasurementRow.concurrency", passive_deletes=True
    )
    exports: Mapped[list[ExportRow]] = relationship(
        back_populates="trial", order_by="ExportRow.id", passive_deletes=True
    )


class MeasurementRow(Base):
    """One load level of one trial: a column for every field of ``search_spaces.Measurement`` but ``raw``."""

    __tablename__ = "advisor_measurements"
    __table_args__ = (Index("ix_advisor_measurements_trial_id", "trial_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("advisor_trials.id", ondelete="CASCADE"))
    concurrency: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(32))
    gpus: Mapped[int] = mapped_column(Integer)
    num_requests: Mapped[int] = mapped_column(Integer)
    completed: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float | None] = mapped_column(Double)
    input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    throughput_per_gpu: Mapped[float | None] = mapped_column(Double)
    output_throughput_per_gpu: Mapped[float | None] = mapped_column(Double)
    request_throughput: Mapped[float | None] = mapped_column(Double)
    p50_tokens_per_s_per_user: Mapped[float | None] = mapped_column(Double)
    p90_tokens_per_s_per_user: Mapped[float | None] = mapped_column(Double)
    p99_tokens_per_s_per_user: Mapped[float | None] = mapped_column(Double)
    p50_ttft_ms: Mapped[float | None] = mapped_column(Double)
    p90_ttft_ms: Mapped[float | None] = mapped_column(Double)
    p99_ttft_ms: Mapped[float | None] = mapped_column(Double)
    p50_tpot_ms: Mapped[float | None] = mapped_column(Double)
    p90_tpot_ms: Mapped[float | None] = mapped_column(Double)
    p99_tpot_ms: Mapped[float | None] = mapped_column(Double)
    p50_itl_ms: Mapped[float | None] = mapped_column(Double)
    p90_itl_ms: Mapped[float | None] = mapped_column(Double)
    p99_itl_ms: Mapped[float | None] = mapped_column(Double)
    p50_e2el_ms: Mapped[float | None] = mapped_column(Double)
    p90_e2el_ms: Mapped[float | None] = mapped_column(Double)
    p99_e2el_ms: Mapped[float | None] = mapped_column(Double)
    achieved_concurrency: Mapped[float | None] = mapped_column(Double)
    client_saturated: Mapped[bool] = mapped_column(Boolean)
    dp_imbalance: Mapped[float | None] = mapped_column(Double)
    prefix_cache_hit_rate: Mapped[float | None] = mapped_column(Double)
    kv_transfer_tokens: Mapped[float | None] = mapped_column(Double)
    preemptions: Mapped[float | None] = mapped_column(Double)
    eplb_balancedness: Mapped[float | None] = mapped_column(Double)
    #: Since 0003. A rate level's req/s (None: a concurrency level).
    request_rate: Mapped[float | None] = mapped_column(Double)
    error_rate: Mapped[float | None] = mapped_column(Double)
    #: "fixed", "search" or "knee" (``Measurement.purpose``); NULL before 0003.
    purpose: Mapped[str | None] = mapped_column(String(16))
    #: {metric: [low, high]}: bootstrap 95% intervals.
    intervals: Mapped[dict[str, Any] | None] = mapped_column(_json())
    #: ``search_spaces.LEVEL_FLAGS`` names.
    flags: Mapped[list[str] | None] = mapped_column(_json())
    #: Since 0004. The servers' expert routing while the level ran ("real", "zipf 1.1", …; ``ExpertRouting``
    #: text); NULL: not recorded (the performance model, levels stored before 0004).
    expert_routing: Mapped[str | None] = mapped_column(String(64))
    raw: Mapped[dict[str, Any]] = mapped_column(_json())

    trial: Mapped[TrialRow] = relationship(back_populates="measurements")


#: The ``Measurement`` fields that have a column of their own (everything but ``raw``).
MEASUREMENT_COLUMNS: tuple[str, ...] = tuple(
    c.key for c in MeasurementRow.__table__.columns if c.key not in ("id", "trial_id", "raw")
)


class ExportRow(Base):
    __tablename__ = "advisor_exports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("advisor_trials.id", ondelete="CASCADE"), index=True)
    format: Mapped[str] = mapped_column(String(32))
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    trial: Mapped[TrialRow] = relationship(back_populates="exports")


class HardwareProfileRow(Base):
    """One ``advisor profile`` run: the model's shape measured with real vLLM on one kind and count of GPU."""

    __tablename__ = "advisor_hardware_profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    gpu: Mapped[str] = mapped_column(String(32), index=True)
    gpu_count: Mapped[int] = mapped_column(Integer)
    engine_version: Mapped[str] = mapped_column(String(64))
    shape_key: Mapped[str] = mapped_column(String(32), index=True)
    model_name: Mapped[str] = mapped_column(String(256))
    shape: Mapped[dict[str, Any]] = mapped_column(_json())
    params: Mapped[dict[str, Any]] = mapped_column(_json())
    report: Mapped[dict[str, Any]] = mapped_column(_json())
    probes: Mapped[list[Any]] = mapped_column(_json())


class ExternalMeasurementRow(Base):
    """One operating point measured outside our studies (a published row, a user's own ``vllm bench serve`` JSON),
    imported by ``advisor import``: evidence for the model, never a trial (nothing here ran, or is told to Optuna).

    ``content_key`` is the point's identity (its source, layout, workload and concurrency, as the importer digests
    them): importing the same rows again adds nothing."""

    __tablename__ = "advisor_external_measurements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The import batch's label (``advisor import --label``): what ``advisor calibrate --external`` names.
    batch: Mapped[str] = mapped_column(String(200), index=True)
    source: Mapped[str] = mapped_column(Text)
    engine: Mapped[str] = mapped_column(String(64))
    engine_version: Mapped[str | None] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(256), index=True)
    precision: Mapped[str | None] = mapped_column(String(200))
    gpu: Mapped[str] = mapped_column(String(32), index=True)
    total_gpus: Mapped[int] = mapped_column(Integer)
    #: "agg", "disagg", "prefill-only" or "decode-only" (the published rows' words).
    mode: Mapped[str] = mapped_column(String(16))
    #: ``DeploymentConfig.model_dump(mode="json")``; NULL where the source measured no whole deployment
    #: (``prefill-only``, ``decode-only``).
    deployment: Mapped[dict[str, Any] | None] = mapped_column(_json())
    #: ``DeploymentConfig.describe()``, else the source's own words for the layout.
    deployment_text: Mapped[str] = mapped_column(Text)
    #: The source's own words for the layout (``raw_parallel_desc``).
    layout: Mapped[str | None] = mapped_column(Text)
    #: MTP draft tokens (0: off).
    mtp: Mapped[int | None] = mapped_column(Integer)
    isl: Mapped[int | None] = mapped_column(Integer)
    osl: Mapped[int | None] = mapped_column(Integer)
    range_ratio: Mapped[float | None] = mapped_column(Double)
    concurrency: Mapped[int | None] = mapped_column(Integer)
    #: Requests the level sent; NULL: not stated.
    requests: Mapped[int | None] = mapped_column(Integer)
    #: {metric: value}, keyed by the published rows' metric names (``tput_per_gpu``, ``median_ttft_ms``, …).
    metrics: Mapped[dict[str, Any]] = mapped_column(_json())
    per_gpu_normalization: Mapped[str | None] = mapped_column(Text)
    notes: Mapped[str | None] = mapped_column(Text)
    content_key: Mapped[str] = mapped_column(String(64), unique=True)
    imported_at: Mapped[datetime] = mapped_column(UTCDateTime())
