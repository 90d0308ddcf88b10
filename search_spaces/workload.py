"""The traffic a deployment is measured under, and what one load level produced."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Dataset(StrEnum):
    RANDOM = "random"  # random ISL/OSL with a range ratio (InferenceX's default)
    PREFIX = "prefix"  # random prompts that share a prefix (prefix-cache reuse)
    AGENTIC = "agentic"  # multi-turn sessions whose context grows turn by turn (a JSONL we generate)
    TRACE = "trace"  # a user's JSONL trace, replayed


class LengthDist(BaseModel):
    """Uniform in ``[mean × (1 - range_ratio), mean × (1 + range_ratio)]`` — vllm bench's ``random`` rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: int = Field(ge=1)
    range_ratio: float = Field(0.0, ge=0.0, lt=1.0)

    @property
    def max(self) -> int:
        return int(self.mean * (1 + self.range_ratio))


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Dataset = Dataset.RANDOM
    isl: LengthDist = LengthDist(mean=1024, range_ratio=0.8)
    osl: LengthDist = LengthDist(mean=256, range_ratio=0.8)
    prefix_reuse: float = Field(0.0, ge=0.0, le=1.0, description="Share of each prompt that is a common prefix.")
    load_levels: list[int] = Field(default=[8, 32, 128], description="Concurrencies, one Measurement each.")
    prompts_per_concurrency: float = Field(10.0, gt=0, description="Prompts per level = this × concurrency.")
    min_prompts: int = Field(8, ge=1)
    warmups_per_concurrency: float = Field(2.0, ge=0, description="Warm-up requests = this × concurrency.")
    turns: int = Field(4, ge=1, description="Agentic: turns per session.")
    trace_path: str | None = Field(None, description="Trace: a JSONL of {prompt, output_len} or agentic sessions.")
    seed: int = 0

    @model_validator(mode="after")
    def _valid(self) -> Workload:
        if not self.load_levels:
            raise ValueError("load_levels needs at least one concurrency")
        if any(c < 1 for c in self.load_levels):
            raise ValueError("load_levels must be concurrencies ≥ 1")
        if self.dataset is Dataset.TRACE and not self.trace_path:
            raise ValueError("a trace workload needs trace_path")
        return self

    @property
    def max_model_len(self) -> int:
        """The longest sequence a request can make (agentic contexts grow with every turn)."""
        per_turn = self.isl.max + self.osl.max
        return per_turn * (self.turns if self.dataset is Dataset.AGENTIC else 1)

    def num_prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, int(round(self.prompts_per_concurrency * concurrency)))

    def num_warmups(self, concurrency: int) -> int:
        return int(round(self.warmups_per_concurrency * concurrency))


class Measurement(BaseModel):
    """One load level of one deployment. Missing data is ``None``, never 0 (an empty sample is not 0 ms)."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int
    source: str = Field(description="'simulated' (performance model) or 'measured' (vllm bench serve).")
    gpus: int
    num_requests: int
    completed: int
    failed: int = 0
    duration_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    throughput_per_gpu: float | None = Field(None, description="(input + output) tokens/s per GPU.")
    output_throughput_per_gpu: float | None = None
    request_throughput: float | None = None
    p50_tokens_per_s_per_user: float | None = None
    p90_tokens_per_s_per_user: float | None = Field(None, description="Speed 90% of requests get at least: 1000/P90 TPOT.")
    p99_tokens_per_s_per_user: float | None = None
    p50_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    p50_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    p50_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    p50_e2el_ms: float | None = None
    p90_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    achieved_concurrency: float | None = None
    client_saturated: bool = False
    dp_imbalance: float | None = Field(None, description="max/mean of per-DP-rank load.")
    prefix_cache_hit_rate: float | None = None
    kv_transfer_tokens: float | None = None
    preemptions: float | None = None
    eplb_balancedness: float | None = None
    raw: dict[str, Any] = Field(default_factory=dict)


#: The metrics an SLO may name, and which way is better.
HIGHER_IS_BETTER = {
    "throughput_per_gpu", "output_throughput_per_gpu", "request_throughput",
    "p50_tokens_per_s_per_user", "p90_tokens_per_s_per_user", "p99_tokens_per_s_per_user",
}
SLO_METRICS = sorted(
    HIGHER_IS_BETTER
    | {f"p{p}_{m}_ms" for p in (50, 90, 99) for m in ("ttft", "tpot", "itl", "e2el")}
)


class SLO(BaseModel):
    """A bound on one measured metric, e.g. ``p90_ttft_ms <= 2000``; checked per load level."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str
    op: str = Field(pattern=r"^(<=|>=)$")
    value: float

    @model_validator(mode="after")
    def _known(self) -> SLO:
        if self.metric not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {self.metric!r}; allowed: {', '.join(SLO_METRICS)}")
        return self

    def violation(self, m: Measurement) -> float:
        """How far ``m`` is outside the bound, relative to it (≤ 0 means met); missing data violates by 1."""
        got = getattr(m, self.metric)
        if got is None:
            return 1.0
        scale = abs(self.value) or 1.0
        return (self.value - got) / scale if self.op == ">=" else (got - self.value) / scale

    def met(self, m: Measurement) -> bool:
        return self.violation(m) <= 0

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


def slo_violation(slos: list[SLO], m: Measurement) -> float:
    """The worst violation of ``m`` over all SLOs (≤ 0: every SLO met); a failed level violates by 1."""
    if m.completed == 0:
        return 1.0
    return max((s.violation(m) for s in slos), default=0.0)
