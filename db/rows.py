"""What the database hands back: plain frozen dataclasses and ``search_spaces`` models, never ORM objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from search_spaces import DeploymentConfig, Measurement, TrialState

#: The phases of a trial whose durations are kept, in order (``finish_trial(timings=...)`` keys).
TIMING_KEYS: tuple[str, ...] = ("deploy_s", "warmup_s", "measure_s", "teardown_s")


class DatabaseUnavailable(Exception):
    """``connect`` could not open the database; the message is one line and never shows the password."""


class UnknownStudy(LookupError):
    """No study of that name."""


class UnknownTrial(LookupError):
    """No trial of that id / number."""


@dataclass(frozen=True)
class Export:
    id: int
    trial_id: int
    format: str
    path: str
    sha256: str
    created_at: datetime


@dataclass(frozen=True)
class Trial:
    """One trial. ``config`` is the parsed ``DeploymentConfig``; it is ``None`` when none was stored or when the
    stored JSON no longer fits today's vocabulary (``config_json`` always has what was stored)."""

    id: int
    study: str
    number: int
    state: TrialState
    params: dict[str, Any]
    config: DeploymentConfig | None
    config_json: dict[str, Any] | None
    config_text: str | None
    topology: dict[str, Any] | None
    gpus: int | None
    objectives: dict[str, float | None] | None
    violation: float | None
    failure_kind: str | None
    reason: str | None
    log_tail: str | None
    deploy_s: float | None
    warmup_s: float | None
    measure_s: float | None
    teardown_s: float | None
    resources: dict[str, Any] | None
    heartbeat_at: datetime | None
    worker: str | None
    #: "model" (the guide's pick), "sampler" (Optuna's), "grid", "baseline" (vLLM's defaults), "repeat"; None when
    #: not recorded (before migration 0002).
    proposer: str | None
    started_at: datetime
    finished_at: datetime | None
    #: The performance model's objective values before the trial ran (since 0003; None before or when unknown).
    predicted: dict[str, float | None] | None = None
    #: A repeat's original trial (``budget.repeat_top``).
    repeat_of: int | None = None
    #: The trial deployed its configuration and its result judges it (``db.models.TrialRow.executed``).
    executed: bool = False
    #: The trial whose measurements this one reuses (its configuration was proposed again; nothing ran).
    reused_from: int | None = None
    #: vLLM's defaults, measured before the search.
    baseline: bool = False
    #: Filled by ``get_trial`` (ordered by concurrency); empty from the list queries.
    measurements: tuple[Measurement, ...] = ()
    exports: tuple[Export, ...] = ()

    @property
    def timings(self) -> dict[str, float]:
        """The phase durations that were recorded, e.g. ``{"deploy_s": 41.0, "measure_s": 300.2}``."""
        return {k: v for k in TIMING_KEYS if (v := getattr(self, k)) is not None}

    @property
    def feasible(self) -> bool:
        """No recorded SLO/constraint violation (``violation`` absent or ≤ 0)."""
        return self.violation is None or self.violation <= 0


@dataclass(frozen=True)
class Study:
    name: str
    description: str | None
    job: dict[str, Any]
    executor: str | None
    engine_version: str | None
    hardware: str | None
    optuna_study_name: str | None
    created_at: datetime
    updated_at: datetime
    #: Trials per state value (every ``TrialState`` is a key, 0 when none).
    counts: dict[str, int] = field(default_factory=dict)
    #: The objective ``best`` refers to: the first objective the study's trials recorded.
    best_objective: str | None = None
    #: The study's answer (``db.ranking.rank_deployments``): the mean of its runs, and its first trial.
    best: float | None = None
    best_trial: int | None = None
    #: Trials the budget counts (``db.budget``): what "N of ``budget.trials``" says.
    budget_used: int = 0
    #: Trials that reused another trial's measurements (``Trial.reused_from``).
    reused: int = 0
    #: Trials that measured vLLM's defaults: the baseline and its repeats on fresh deploys.
    baseline_runs: int = 0
    #: Repeats of searched deployments on fresh deploys (``budget.repeat_top``), the defaults' left out.
    repeats: int = 0
    #: Runs behind ``best`` (its first trial and the repeats of it that count).
    best_runs: int = 0
    #: The newest heartbeat of a trial still RUNNING (None when none runs): whether a tuner is alive.
    heartbeat_at: datetime | None = None

    @property
    def trials(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> int:
        return self.counts.get(TrialState.COMPLETE.value, 0)

    @property
    def failed(self) -> int:
        return self.counts.get(TrialState.FAILED.value, 0)

    @property
    def invalid(self) -> int:
        return self.counts.get(TrialState.INVALID.value, 0)

    @property
    def running(self) -> int:
        return self.counts.get(TrialState.RUNNING.value, 0)

    @property
    def interrupted(self) -> int:
        return self.counts.get(TrialState.INTERRUPTED.value, 0)


@dataclass(frozen=True)
class Level:
    """One trial × load level: the trial's identity and the level's ``Measurement``."""

    trial_id: int
    trial_number: int
    state: TrialState
    config_text: str | None
    #: The trial's GPUs (``measurement.gpus`` is what the level itself reported).
    gpus: int | None
    measurement: Measurement

    @property
    def concurrency(self) -> int:
        return self.measurement.concurrency

    def metric(self, name: str) -> Any:
        return getattr(self.measurement, name)

    def __getattr__(self, name: str) -> Any:
        """The level's metrics read straight off it: ``level.p90_ttft_ms``."""
        return _measurement_field(self, name)


def _measurement_field(obj: Any, name: str) -> Any:
    if name in Measurement.model_fields:
        return getattr(obj.measurement, name)
    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")


class Best(NamedTuple):
    """What ``best_under_slo`` found: unpacks as ``trial, measurement``; also reads like a ``Level``
    (``best.trial_number``, ``best.config_text``, ``best.concurrency``, ``best.throughput_per_gpu``)."""

    trial: Trial
    measurement: Measurement

    @property
    def trial_number(self) -> int:
        return self.trial.number

    @property
    def trial_id(self) -> int:
        return self.trial.id

    @property
    def state(self) -> TrialState:
        return self.trial.state

    @property
    def config_text(self) -> str | None:
        return self.trial.config_text

    @property
    def gpus(self) -> int | None:
        return self.trial.gpus

    @property
    def concurrency(self) -> int:
        return self.measurement.concurrency

    def metric(self, name: str) -> Any:
        return getattr(self.measurement, name)

    def __getattr__(self, name: str) -> Any:
        return _measurement_field(self, name)


@dataclass(frozen=True)
class HistoryPoint:
    """One trial of a convergence plot: its objective value and the best so far (complete, feasible trials)."""

    number: int
    state: TrialState
    value: float | None
    feasible: bool
    best: float | None


@dataclass(frozen=True)
class Failure:
    number: int
    state: TrialState
    failure_kind: str | None
    reason: str | None
    config_text: str | None
    log_tail: str | None
    finished_at: datetime | None


@dataclass(frozen=True)
class HardwareProfile:
    """A stored ``advisor profile``: what was measured where, and the model parameters fitted from it.

    ``shape`` is the model's widths (``search_spaces.ModelProfile`` without its depth), ``shape_key`` their digest;
    ``params`` are ``PerfParams`` fields, ``report`` the fit's errors and ``probes`` every measured probe level."""

    id: int
    created_at: datetime
    gpu: str
    gpu_count: int
    engine_version: str
    shape_key: str
    model_name: str
    shape: dict[str, Any]
    params: dict[str, Any]
    report: dict[str, Any]
    probes: list[Any]

    @property
    def label(self) -> str:
        """What a prediction resting on this profile says it rests on."""
        return (f"profile #{self.id} ({self.gpu} x{self.gpu_count}, vLLM {self.engine_version}, "
                f"{self.created_at:%Y-%m-%d})")


@dataclass(frozen=True)
class ExternalPoint:
    """One operating point measured outside our studies (``advisor import``): a published row or a user's own
    ``vllm bench serve`` result, with where it comes from. Evidence for the performance model, never a trial.

    ``key`` is the point's identity (its source, layout, workload and load: the same measurement imported again has
    the same key); ``metrics`` are keyed by the published rows' names (``tput_per_gpu``, ``median_ttft_ms``,
    ``p90_tpot_ms``, …); ``deployment`` is the layout as a ``DeploymentConfig`` — ``None`` where the source measured
    no whole deployment (``prefill-only``, ``decode-only``) or a stored one no longer fits today's vocabulary
    (``deployment_text`` and ``layout`` still say what it was); ``mode`` is the source's word (``agg``,
    ``disagg``, ``prefill-only``, ``decode-only``). ``id`` and ``imported_at`` are the database's (``None`` before
    it is stored)."""

    batch: str
    key: str
    source: str
    engine: str
    engine_version: str | None
    model: str
    precision: str | None
    gpu: str
    total_gpus: int
    mode: str
    deployment: DeploymentConfig | None
    layout: str | None
    mtp: int | None
    isl: int | None
    osl: int | None
    range_ratio: float | None
    concurrency: int | None
    metrics: dict[str, float]
    requests: int | None = None
    per_gpu_normalization: str | None = None
    notes: str | None = None
    deployment_text: str | None = None
    id: int | None = None
    imported_at: datetime | None = None

    @property
    def label(self) -> str:
        """The point in a few words: ``vllm on 8 × B200, agg, c=64 (batch 'inferencex')``."""
        return (f"{self.engine} on {self.total_gpus} × {self.gpu}, {self.mode}, c={self.concurrency} "
                f"(batch {self.batch!r})")
