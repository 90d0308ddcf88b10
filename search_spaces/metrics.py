"""Every metric a load level reports, declared once: unit, which way is better, percentile, labels, how it scales.

The bench parser (``executors.measuring.bench_result``), the SLO and objective checks, ranking (``db.ranking``), the
Optuna directions (``advisor.study``), the performance model's outputs and the dashboard's labels all read this table,
so a metric cannot be "better higher" in one place and "better lower" in another (``error_rate`` once was: the
ranking's suffix rule maximized it while the SLO check minimized it). Adding a metric is one ``register`` call;
a registered metric that ``Measurement`` has no field for travels as an extra of the level (stored in the level's
JSON, ``db.mapping.UNMAPPED``), so the database, SLOs, ranking and labels see it without a new column.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Scaling(StrEnum):
    """How a deployment's value becomes the whole cluster's when copies of it fill the cluster
    (``db.ranking.cluster_factor``)."""

    NONE = "none"  # a property of each request or level (latency, speed per user, error rate): unchanged
    PER_GPU = "per_gpu"  # per GPU the deployment uses: × copies × GPUs / cluster GPUs (idle GPUs serve nothing)
    PER_DEPLOYMENT = "per_deployment"  # what one copy serves: × copies


@dataclass(frozen=True)
class Metric:
    """One metric of a load level (a ``Measurement`` field, or an extra of it).

    ``bench_key`` is the key of ``vllm bench serve``'s saved JSON the value is read from (divided by the level's
    GPUs for ``Scaling.PER_GPU``); ``None``: computed by the parser (tokens/s per user, error rate) or by the
    servers' counters. ``slo``: an SLO, ranking and the Pareto plot may name it (its direction is the point of
    it); the others are shown and sorted only.
    """

    name: str
    unit: str
    higher_is_better: bool
    short: str  # a caption or table header: "P90 TTFT (ms)", "tok/s/GPU"
    label: str = ""  # an axis title ("" → ``short``)
    percentile: int | None = None
    scaling: Scaling = Scaling.NONE
    bench_key: str | None = None
    slo: bool = True

    @property
    def title(self) -> str:
        return self.label or self.short

    @property
    def sign(self) -> int:
        """+1 when more is better, -1 when less is."""
        return 1 if self.higher_is_better else -1


#: The percentiles every latency and speed is reported at (and ``vllm bench serve --metric-percentiles``).
PERCENTILES: tuple[int, ...] = (50, 90, 99)
#: The per-request latencies ``vllm bench serve`` reports percentiles of, in ms.
LATENCIES: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")

#: What a job maximizes unless it says otherwise (``objective.metric``), and the second axis of its Pareto front
#: (``objective.pareto_y``); the database's queries and the dashboard default to the same two.
DEFAULT_OBJECTIVE = "throughput_per_gpu"
DEFAULT_PARETO_Y = "p90_tokens_per_s_per_user"

_REGISTRY: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Declare ``metric`` (a second declaration of a name is refused: one place per fact)."""
    if metric.name in _REGISTRY:
        raise ValueError(f"metric {metric.name!r} is declared already")
    _REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    """Forget a metric ``register`` declared (a test's temporary metric)."""
    _REGISTRY.pop(name, None)


def metric(name: str) -> Metric | None:
    """The declared metric ``name``; ``None`` when there is none."""
    return _REGISTRY.get(name)


def all_metrics() -> list[Metric]:
    """Every declared metric, in declaration order."""
    return list(_REGISTRY.values())


def slo_metrics() -> list[str]:
    """The metrics an SLO may bound (their direction is known), sorted."""
    return sorted(m.name for m in _REGISTRY.values() if m.slo)


def maximizable() -> list[str]:
    """The metrics an objective may maximize: SLO metrics where more is better, sorted."""
    return sorted(m.name for m in _REGISTRY.values() if m.slo and m.higher_is_better)


def higher_is_better(name: str) -> bool:
    """Whether more of ``name`` is better. A name nobody declared (an objective stored by a caller outside the
    registry) is better lower when it is a latency in ms, higher otherwise."""
    m = _REGISTRY.get(name)
    return m.higher_is_better if m is not None else not name.endswith("_ms")


def scaling(name: str) -> Scaling:
    m = _REGISTRY.get(name)
    return m.scaling if m is not None else Scaling.NONE


def _declare_defaults() -> None:
    throughput = "tok/s/GPU"
    register(Metric("throughput_per_gpu", throughput, True, throughput, "throughput per GPU (tok/s)",
                    scaling=Scaling.PER_GPU, bench_key="total_token_throughput"))
    register(Metric("output_throughput_per_gpu", throughput, True, f"output {throughput}",
                    "output throughput per GPU (tok/s)", scaling=Scaling.PER_GPU, bench_key="output_throughput"))
    register(Metric("request_throughput", "req/s", True, "req/s", "requests/s", scaling=Scaling.PER_DEPLOYMENT,
                    bench_key="request_throughput"))
    for p in PERCENTILES:
        register(Metric(f"p{p}_tokens_per_s_per_user", "tok/s/user", True, f"P{p} tok/s/user",
                        f"P{p} tokens/s per user", percentile=p))
    for lat in LATENCIES:
        for p in PERCENTILES:
            register(Metric(f"p{p}_{lat}_ms", "ms", False, f"P{p} {lat.upper()} (ms)", percentile=p,
                            bench_key=f"p{p}_{lat}_ms"))
    register(Metric("error_rate", "share", False, "error rate"))
    # Shown and sorted on the dashboard, not bounded by SLOs.
    register(Metric("dp_imbalance", "max/mean", False, "DP imbalance", slo=False))
    register(Metric("eplb_balancedness", "mean/max", True, "EPLB balancedness", slo=False))
    register(Metric("prefix_cache_hit_rate", "share", True, "prefix cache hit rate", slo=False))
    register(Metric("kv_transfer_tokens", "tokens", False, "KV transfer tokens", slo=False))
    register(Metric("preemptions", "count", False, "preemptions", slo=False))


_declare_defaults()
