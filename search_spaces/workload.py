"""The traffic a deployment is measured under, and what one load level produced."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from search_spaces.metrics import metric, slo_metrics


class Dataset(StrEnum):
    RANDOM = "random"  # random ISL/OSL with a range ratio (InferenceX's default)
    PREFIX = "prefix"  # random prompts that share a prefix (prefix-cache reuse)
    AGENTIC = "agentic"  # multi-turn sessions whose context grows turn by turn (a JSONL we generate)
    TRACE = "trace"  # a user's JSONL trace, replayed


#: Upper bounds checked when the job is read (see ``cluster.MAX_NODES``): tokens of a prompt or an output, a load
#: level (requests in flight or per second), fixed levels per deployment, turns of an agentic session.
MAX_TOKENS = 10_000_000
MAX_LOAD = 1_000_000
MAX_LOAD_LEVELS = 64
MAX_TURNS = 1000


class LengthDist(BaseModel):
    """Uniform in ``[mean × (1 - range_ratio), mean × (1 + range_ratio)]`` — vllm bench's ``random`` rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: int = Field(ge=1, le=MAX_TOKENS)
    range_ratio: float = Field(0.0, ge=0.0, lt=1.0)

    @property
    def max(self) -> int:
        return int(self.mean * (1 + self.range_ratio))


#: vLLM's switch for its routing simulator: a strategy name, or empty for the model's own router.
ROUTING_ENV = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"
#: The strategy names vLLM ships, by ``expert_routing`` kind; ``zipf`` is ours (``executors.vllm.routing``).
_VLLM_STRATEGIES = {"uniform": "uniform_random", "normal": "normal_routing"}
ROUTING_KINDS = ("real", "uniform", "normal", "zipf")
DEFAULT_ZIPF_EXPONENT = 1.1
_ROUTING_TEXT = re.compile(r"^\s*([A-Za-z]+)(?:\s*[\s:_=]\s*([^\s]+))?\s*$")


class ExpertRouting(BaseModel):
    """How MoE tokens pick their experts on the servers of a trial: ``real`` (the model's router — with dummy
    weights almost even), or vLLM's routing simulator: ``uniform``, ``normal``, or ``zipf`` with an exponent
    (expert *i* gets a share ∝ 1/(i+1)^exponent: a few hot experts, the skew EPLB is there to fix).

    Written in a job as text (``zipf``, ``zipf 1.3``, ``zipf:1.3``) or a mapping (``{kind: zipf, exponent:
    1.3}``); stored and shown as text (``str()``: ``real``, ``uniform``, ``normal``, ``zipf 1.3``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["real", "uniform", "normal", "zipf"] = "real"
    exponent: float | None = Field(None, description="zipf only: the skew (> 0; default 1.1).")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        if isinstance(data, ExpertRouting):
            return data
        if isinstance(data, str):
            m = _ROUTING_TEXT.match(data)
            if not m or m.group(1).lower() not in ROUTING_KINDS:
                raise ValueError(f"unknown expert routing {data!r}; allowed: real, uniform, normal, zipf, "
                                 "zipf <exponent> (e.g. 'zipf 1.1')")
            kind, exp = m.group(1).lower(), m.group(2)
            if exp is None:
                return {"kind": kind}
            try:
                value = float(exp)
            except ValueError:
                raise ValueError(f"expert routing {data!r}: exponent {exp!r} is not a number") from None
            return {"kind": kind, "exponent": value}
        return data

    @model_validator(mode="after")
    def _exponent(self) -> ExpertRouting:
        if self.kind == "zipf":
            if self.exponent is None:
                object.__setattr__(self, "exponent", DEFAULT_ZIPF_EXPONENT)
            elif not math.isfinite(self.exponent) or self.exponent <= 0:
                raise ValueError(f"expert routing zipf: exponent must be > 0 (got {self.exponent:g})")
            else:  # what the strategy name and the stored text carry: 6 significant digits
                object.__setattr__(self, "exponent", float(f"{self.exponent:g}"))
        elif self.exponent is not None:
            raise ValueError(f"expert routing {self.kind}: takes no exponent (only zipf does)")
        return self

    @model_serializer
    def _text(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"zipf {self.exponent:g}" if self.kind == "zipf" else self.kind

    @property
    def simulated(self) -> bool:
        return self.kind != "real"

    @property
    def strategy(self) -> str | None:
        """The vLLM routing-simulator strategy name (``ROUTING_ENV``'s value), None for the real router.
        Zipf's name carries its exponent (``zipf_1.1``): the plugin registers what the name says."""
        if self.kind == "zipf":
            return f"zipf_{self.exponent:g}"
        return _VLLM_STRATEGIES.get(self.kind)


def routing_env(routing: ExpertRouting | str | None) -> dict[str, str]:
    """The environment a vLLM server needs for ``routing`` (empty for the real router)."""
    r = routing if isinstance(routing, ExpertRouting) else ExpertRouting.model_validate(routing or "real")
    return {ROUTING_ENV: r.strategy} if r.strategy else {}


def routing_label(routing: ExpertRouting | Workload | str | None) -> str | None:
    """``"simulated routing: zipf 1.1"`` for a simulated routing (an ``ExpertRouting``, a ``Workload``, or the
    text stored with a measurement), None for the real router or nothing recorded: what every view of results
    shows beside the numbers."""
    if isinstance(routing, Workload):
        routing = routing.expert_routing
    if routing is None:
        return None
    try:
        r = routing if isinstance(routing, ExpertRouting) else ExpertRouting.model_validate(routing)
    except ValueError:
        return f"simulated routing: {routing}"  # an unknown stored value is still shown, as stored
    return f"simulated routing: {r}" if r.simulated else None


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Dataset = Dataset.RANDOM
    isl: LengthDist = LengthDist(mean=1024, range_ratio=0.8)
    osl: LengthDist = LengthDist(mean=256, range_ratio=0.8)
    prefix_reuse: float = Field(0.0, ge=0.0, le=1.0, description="Share of each prompt that is a common prefix.")
    load_levels: list[Annotated[int, Field(le=MAX_LOAD)]] = Field(
        default=[8, 32, 128], max_length=MAX_LOAD_LEVELS, description="Fixed levels measured on every deployment "
                                   "(concurrencies, or req/s with load_by: rate), in addition to the knee search.")
    load_by: Literal["concurrency", "rate"] = Field(
        "concurrency", description="What a load level sets: concurrent requests (closed loop) or a Poisson request "
        "rate in req/s (open loop, capped at max_load_concurrency in flight).")
    knee_search: bool = Field(True, description="Find each deployment's highest load meeting every SLO (the knee) on "
                              "the running deployment: bracket from the model's prediction, then bisect.")
    max_levels: int = Field(6, ge=1, le=20, description="Knee search: at most this many levels per deployment.")
    knee_tolerance: float = Field(0.15, gt=0, le=1.0, description="Knee search stops once the bracket's high end is "
                                  "within this share above its low end.")
    max_load: float = Field(4096, gt=0, le=MAX_LOAD, description="Knee search never measures above this load.")
    bracket_prompts_per_concurrency: float = Field(
        3.0, ge=0, description="Knee search on a real deployment: levels that only bracket the knee send this × "
        "concurrency prompts (≥ half of min_prompts); the knee and the level above it are then measured at full "
        "length. 0: every level at full length; else at least 2 (a level of 1 × concurrency is all ramp-up).")
    level_start: Literal["burst", "steady"] = Field(
        "burst", description="How a concurrency level's first c requests start: 'burst' (all at once, as vllm "
        "bench serve's closed loop sends them: their prefills queue behind each other and the next waves stay "
        "bunched) or 'steady' (sent over about one request's lifetime, estimated from the runs before the level, "
        "through a request rate beside the concurrency cap: the level holds c in steady state from its start). "
        "Rate levels are paced by their rate either way.")
    max_load_concurrency: int = Field(4096, ge=1, le=MAX_LOAD,
                                      description="Rate levels: at most this many requests in flight.")
    prompts_per_concurrency: float = Field(10.0, gt=0, description="Prompts per level ≥ this × concurrency "
                                           "(× req/s for rate levels).")
    min_prompts: int = Field(40, ge=1, description="Prompts per level ≥ this: a P90 of 40 requests rests on its 4 "
                             "slowest; fewer make the percentile SLOs a coin toss (the CPU preset trims it to 8).")
    min_level_s: float = Field(0.0, ge=0, description="Prompts per level ≥ what the deployment serves in this many "
                               "seconds at the load (estimated from the levels measured before).")
    warmups_per_concurrency: float = Field(2.0, ge=0, description="Warm-up before a deployment's first level: this "
                                           "× concurrency requests (≥ min_prompts) at that level's load, discarded.")
    fresh_prompts: bool = Field(True, description="Every level and the warm-up draw their own prompts (seeded per "
                                "level), so the prefix cache cannot serve one level's prompts from another's.")
    turns: int = Field(4, ge=1, le=MAX_TURNS, description="Agentic: turns per session.")
    trace_path: str | None = Field(None, description="Trace: a JSONL of {prompt, output_len} or agentic sessions.")
    seed: int = 0
    expert_routing: ExpertRouting = Field(ExpertRouting(), description="How MoE tokens pick experts on every "
                                          "server of a trial: real (the model's router), uniform, normal, or zipf "
                                          "<exponent> (vLLM's routing simulator; zipf through our vLLM plugin). "
                                          "Simulated routing gives timings, not valid text; stored with each level.")
    eplb_log_balancedness: bool = Field(False, description="Diagnosis: servers with EPLB log their balancedness "
                                        "(--eplb-config log_balancedness), read into each level's "
                                        "eplb_balancedness. Costs a sync per step: for studying EPLB, not tuning.")

    @field_validator("bracket_prompts_per_concurrency")
    @classmethod
    def _holds_its_load(cls, v: float) -> float:
        """A short level's load is only held once every one of its c first requests has started, and the client
        starts them one after another: at 1 × c the whole level is that ramp (on an H200 at c = 70: 31 requests in
        flight on average, measured again at full length). From 2 × c on, the level holds c for a while."""
        if 0 < v < 2:
            raise ValueError(f"{v:g} is too few: a short level needs at least 2 prompts per concurrency to hold its "
                             "load (1 × concurrency is all ramp-up); 0 measures every level at full length")
        return v

    @model_validator(mode="after")
    def _valid(self) -> Workload:
        if not self.load_levels and not self.knee_search:
            raise ValueError("load_levels needs at least one level when knee_search is off")
        if any(c < 1 for c in self.load_levels):
            raise ValueError("load_levels must be ≥ 1 (concurrency, or req/s)")
        if self.dataset is Dataset.TRACE and not self.trace_path:
            raise ValueError("a trace workload needs trace_path")
        return self

    @property
    def max_model_len(self) -> int:
        """The longest sequence a request can make (agentic contexts grow with every turn)."""
        per_turn = self.isl.max + self.osl.max
        return per_turn * (self.turns if self.dataset is Dataset.AGENTIC else 1)

    @property
    def reuses_prefixes(self) -> bool:
        """Whether prompts share prefixes on purpose (then prefix-cache hits are the workload, not an artefact)."""
        return self.dataset is not Dataset.RANDOM or self.prefix_reuse > 0

    def num_prompts(self, load: float, requests_per_s: float | None = None, short: bool = False) -> int:
        """Requests of one level: ≥ ``min_prompts``, ≥ ``prompts_per_concurrency`` × load, and ≥ what the
        deployment serves in ``min_level_s`` at ``requests_per_s`` (when known). A ``short`` level (bracketing
        only) uses ``bracket_prompts_per_concurrency`` and half of each floor, never more than a full level."""
        per, floor, level_s = self.prompts_per_concurrency, self.min_prompts, self.min_level_s
        if short:
            per, floor, level_s = self.bracket_prompts_per_concurrency, (self.min_prompts + 1) // 2, level_s / 2
        n = max(floor, int(round(per * load)))
        if level_s and requests_per_s:
            n = max(n, int(math.ceil(level_s * requests_per_s)))
        return min(n, self.num_prompts(load, requests_per_s)) if short else n

    def num_warmups(self, load: float) -> int:
        """Warm-up requests before a deployment's first level (0: no warm-up)."""
        if self.warmups_per_concurrency <= 0:
            return 0
        return max(self.min_prompts, int(round(self.warmups_per_concurrency * load)))

    def level_seed(self, load: float, attempt: int = 0, warmup: bool = False, short: bool = False) -> int:
        """The dataset seed of one level: distinct per load, attempt, warm-up and short (bracketing) run — the
        full-length run of a load after its short one must not find its prompts in the prefix cache — or the
        workload's seed for every level when ``fresh_prompts`` is off."""
        if not self.fresh_prompts:
            return self.seed
        tag = f"{self.seed}/{load:g}/{attempt}/{'w' if warmup else 'm'}{'/s' if short else ''}".encode()
        return int.from_bytes(hashlib.sha256(tag).digest()[:4], "big") % (2**31 - 1)


def server_env(workload: Workload) -> dict[str, str]:
    """What ``workload`` asks of every vLLM server's environment (the routing simulator's strategy): the local
    and Ray executors apply it to each server they start; an export that reproduces the measured conditions
    adds it to each server command (simulated routing: outputs are not valid text)."""
    return routing_env(workload.expert_routing)

class Measurement(BaseModel):
    """One load level of one deployment. Missing data is ``None``, never 0 (an empty sample is not 0 ms).

    A metric declared in ``search_spaces.metrics`` without a field here is carried as an extra of the level
    (``m.<name>``, a number or ``None``); any other unknown name is refused, as a typo should be."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _declared_extras(cls, data: Any) -> Any:
        """Extras are allowed only so that a newly declared metric needs no field (and no column); a name nobody
        declared is still a mistake, and a metric's value is a number or ``None`` like every field's."""
        if not isinstance(data, dict):
            return data
        extras = [k for k in data if k not in cls.model_fields]
        unknown = sorted(k for k in extras if metric(k) is None)
        if unknown:
            raise ValueError(f"unknown measurement field {', '.join(map(repr, unknown))}: neither a field nor a "
                             "metric declared in search_spaces.metrics")
        for k in extras:
            v = data[k]
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"metric {k!r} must be a number or null, got {v!r}")
        return data

    concurrency: int = Field(description="Requests in flight at most (for a rate level: the cap).")
    request_rate: float | None = Field(None, description="A rate level's Poisson arrival rate (req/s); None: a "
                                       "concurrency level.")
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
    eplb_balancedness: float | None = Field(None, description="EPLB's mean/max tokens per EP rank over the level "
                                            "(EP rank 0's log, with workload.eplb_log_balancedness).")
    expert_routing: str | None = Field(None, description="The servers' expert routing while the level ran "
                                       "(``ExpertRouting`` text: 'real', 'zipf 1.1', …); None: not recorded "
                                       "(the performance model, or levels stored before it was).")
    error_rate: float | None = Field(None, description="Failed / sent requests of the level.")
    purpose: str = Field("fixed", description="Why the level was measured: 'fixed' (workload.load_levels), "
                         "'search' (the knee search), 'knee' (the search's answer: the highest level meeting every "
                         "SLO; it may also be a fixed level).")
    intervals: dict[str, list[float]] = Field(default_factory=dict, description="Bootstrap 95% intervals "
                                              "[low, high] of percentiles and throughput, over requests.")
    flags: list[str] = Field(default_factory=list, description="What to distrust or know about the level: "
                             "see ``LEVEL_FLAGS``.")
    raw: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _error_rate(self) -> Measurement:
        """Levels recorded before ``error_rate`` existed (or built without it) get it from their counts."""
        if self.error_rate is None and self.num_requests > 0:
            self.error_rate = self.failed / self.num_requests
        return self

    @property
    def load(self) -> float:
        """The level's load as it was set: req/s for a rate level, else the concurrency."""
        return self.request_rate if self.request_rate is not None else float(self.concurrency)

    def label(self) -> str:
        """``c=64`` or ``2.5 req/s``: how a level is named in tables."""
        return f"{self.request_rate:g} req/s" if self.request_rate is not None else f"c={self.concurrency}"


#: Level flags and what they mean (``Measurement.flags``).
LEVEL_FLAGS = {
    "prefix-cache-reuse": "more than 5% of prompt tokens came from the prefix cache on a workload without shared "
                          "prefixes: prompts repeated, TTFT reads better than it is",
    "counters-unknown": "a /metrics scrape before or after the level failed: per-level counter deltas unknown",
    "remeasured": "an SLO decision fell inside the level's interval: measured twice, the numbers pool both runs",
    "stalled": "no token reached the client for at least 1 s and 20× the level's usual long gap while requests were "
               "in flight (a just-in-time kernel compile): the level measured the pause; kept only when measuring it "
               "again stalled too (the shorter pause kept); a profile's fit leaves it out",
    "stall-remeasured": "the level's first run stalled and was measured again (fresh prompts); the stored numbers "
                        "are one run's, the first run's pause is in raw.stall_remeasured",
    "knee-at-max-load": "every SLO held at workload.max_load: the knee is at least this level",
    "bracket-open": "the knee search ran out of levels before its bracket closed to the tolerance",
    "no-level-meets-slo": "the lowest load tried missed an SLO: the deployment has no knee",
    "bursty-delivery": "more than half of the gaps between tokens reached the client under 0.05 ms: the stream "
                       "arrived in lumps (a CPU-starved server, proxy or client), so TTFT, TPOT, ITL and tokens/s "
                       "per user describe the delivery, not the serving; E2E latency and throughput still hold",
}
PREFIX_REUSE_LIMIT = 0.05

#: The error-rate SLO every job gets unless it names one: at most 1% of a level's requests may fail.
DEFAULT_ERROR_SLO = {"metric": "error_rate", "op": "<=", "value": 0.01}


def slo_excess(op: str, bound: float, got: Any) -> Any:
    """How far ``got`` — a value, or a NumPy array of them — is outside the bound ``op bound`` (``<=`` or ``>=``),
    relative to it: ≤ 0 means met. A bound of 0 is scaled by 1 (an error rate ≤ 0 is violated by the failed share).
    The one SLO arithmetic: the tuner's scoring (``SLO.excess``), the model's levels (``LevelTable.violations``) and
    the dashboard's margins all call it."""
    scale = abs(bound) or 1.0
    return (bound - got) / scale if op == ">=" else (got - bound) / scale


class SLO(BaseModel):
    """A bound on one measured metric, e.g. ``p90_ttft_ms <= 2000``; checked per load level."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str
    op: str = Field(pattern=r"^(<=|>=)$")
    value: float

    @model_validator(mode="after")
    def _known(self) -> SLO:
        allowed = slo_metrics()
        if self.metric not in allowed:
            raise ValueError(f"unknown SLO metric {self.metric!r}; allowed: {', '.join(allowed)}")
        return self

    def violation(self, m: Measurement, value: float | None = None) -> float:
        """How far ``m`` (or ``value``) is outside the bound, relative to it (≤ 0 means met); missing data
        violates by 1. A bound of 0 is scaled by 1 (an error rate ≤ 0 is violated by the failed share)."""
        return self.excess(getattr(m, self.metric, None) if value is None else value)

    def excess(self, got: float | None) -> float:
        """``violation`` of a value of the metric (None: missing)."""
        return 1.0 if got is None else float(slo_excess(self.op, self.value, got))

    def close_call(self, m: Measurement) -> bool:
        """Whether the level's 95% interval of this metric straddles the bound (the decision is a coin toss)."""
        iv = m.intervals.get(self.metric)
        if not iv or len(iv) != 2:
            return False
        return (self.violation(m, iv[0]) <= 0) != (self.violation(m, iv[1]) <= 0)

    def met(self, m: Measurement) -> bool:
        return self.violation(m) <= 0

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


def slo_violation(slos: Sequence[SLO], m: Measurement) -> float:
    """The worst violation of ``m`` over all SLOs (≤ 0: every SLO met); a failed level violates by 1."""
    if m.completed == 0:
        return 1.0
    return max((s.violation(m) for s in slos), default=0.0)
