"""What a server's own counters say about one load level: a ``/metrics`` scrape before and after it.

vLLM's Prometheus counters (label ``engine`` = DP rank) give, as deltas over the level:

* ``dp_imbalance`` — max/mean over DP ranks of prompt + generation tokens (worst instance; 1.0 = even);
* ``prefix_cache_hit_rate`` — ``prefix_cache_hits_total`` / ``prefix_cache_queries_total`` (all instances);
* ``kv_transfer_tokens`` — ``prompt_tokens_by_source_total{source="external_kv_transfer"}`` on decode
  instances (P/D only: the prompt tokens that arrived as KV instead of being computed);
* ``preemptions`` — ``num_preemptions_total``.

EPLB has no metric: its balancedness is read from the log line ``EPLB step: … balancedness=…`` that EP
rank 0 writes (``log_balancedness``), over the bytes logged during the level.

And what the engine itself timed (``engine_times``, kept in ``Measurement.raw["engine"]``): the means over the level
of vLLM's request histograms — waiting in the scheduler's queue, prefill, decode, its TTFT (from the API server's
arrival to the first token leaving the output processor) and inter-token gap — and its engine steps (the count and
mean size of ``iteration_tokens_total``). Beside the client's numbers they split a request's time into the way
in and out (client TTFT − engine TTFT), the wait for the scheduler and the prefill; the profile's step times and
the model's ``request_latency_s`` can be read from them rather than fitted to what they add up to.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executors.processes import procs

Sample = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)

PROMPT = "vllm:prompt_tokens_total"
GENERATION = "vllm:generation_tokens_total"
CACHE_QUERIES = "vllm:prefix_cache_queries_total"
CACHE_HITS = "vllm:prefix_cache_hits_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PREEMPTIONS = "vllm:num_preemptions_total"
EXTERNAL_KV = "external_kv_transfer"
#: vLLM's histograms a level's ``raw["engine"]`` reads (name in the record → vLLM's metric, a histogram).
ENGINE_HISTOGRAMS = {
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
}
STEP_TOKENS = "vllm:iteration_tokens_total"
_EPLB = re.compile(r"EPLB step:(?:.*?avg_tokens=([0-9.eE+-]+),\s*max_tokens=([0-9.eE+-]+),)?.*?"
                   r"balancedness[=:]\s*([0-9.eE+-]+)")


def parse_metrics(text: str) -> dict[Sample, float]:
    """Prometheus text → {(sample name, labels): value} (counters keep their ``_total`` name)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[Sample, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def scrape(url: str, timeout: float = 5.0) -> dict[Sample, float] | None:
    """One ``/metrics`` scrape of a server (``None`` when it does not answer)."""
    status, body = procs.http_get(url.rstrip("/") + "/metrics", timeout=timeout)
    if status != 200:
        return None
    try:
        return parse_metrics(body.decode("utf-8", errors="replace"))
    except ValueError:
        return None


def delta(before: Mapping[Sample, float] | None, after: Mapping[Sample, float] | None) -> dict[Sample, float]:
    """After − before for every sample of ``after`` (a sample new since ``before`` counts from 0)."""
    if after is None:
        return {}
    b = before or {}
    return {k: v - b.get(k, 0.0) for k, v in after.items()}


def _sum(d: Mapping[Sample, float], name: str, **labels: str) -> float | None:
    vals = [v for (n, lab), v in d.items() if n == name and all((k, w) in lab for k, w in labels.items())]
    return sum(vals) if vals else None


def rank_load(d: Mapping[Sample, float]) -> dict[str, float]:
    """Prompt + generation tokens per DP rank (``engine`` label)."""
    load: dict[str, float] = defaultdict(float)
    for (n, lab), v in d.items():
        if n in (PROMPT, GENERATION):
            load[dict(lab).get("engine", "0")] += v
    return dict(load)


def imbalance(load: Mapping[str, float]) -> float | None:
    if not load:
        return None
    mean = sum(load.values()) / len(load)
    return max(load.values()) / mean if mean > 0 else None


@dataclass
class InstanceDelta:
    """One instance's counter deltas over a level, with its role (``prefill``/``decode``/``mixed``)."""

    name: str
    role: str
    delta: dict[Sample, float]


def level_stats(instances: Iterable[InstanceDelta], *, disaggregated: bool) -> dict[str, Any]:
    """The Measurement fields the counters give (``None`` where no instance reported the counter)."""
    insts = list(instances)
    imbs = [x for x in (imbalance(rank_load(i.delta)) for i in insts) if x is not None]
    queries = [q for q in (_sum(i.delta, CACHE_QUERIES) for i in insts) if q is not None]
    hits = [h for h in (_sum(i.delta, CACHE_HITS) for i in insts) if h is not None]
    pre = [p for p in (_sum(i.delta, PREEMPTIONS) for i in insts) if p is not None]
    kv: float | None = None
    if disaggregated:
        kvs = [k for k in (_sum(i.delta, BY_SOURCE, source=EXTERNAL_KV) for i in insts if i.role == "decode")
               if k is not None]
        kv = sum(kvs) if kvs else None
    return {
        "dp_imbalance": max(imbs) if imbs else None,
        "prefix_cache_hit_rate": (sum(hits) / sum(queries)) if queries and sum(queries) > 0 and hits else None,
        "kv_transfer_tokens": kv,
        "preemptions": sum(pre) if pre else None,
    }


def engine_times(deltas: Iterable[Mapping[Sample, float]]) -> dict[str, float | None] | None:
    """Means over a level of what vLLM's own histograms timed (``ENGINE_HISTOGRAMS``, in ms, with the number of
    requests each counted) and its engine steps (count, mean tokens per step), summed over ``deltas`` (instances,
    DP ranks; P/D: both roles' requests); every request of the level, its first wave included; ``None`` where no
    server exposed them (another engine, an older vLLM)."""
    ds = list(deltas)
    out: dict[str, float | None] = {}
    for key, name in ENGINE_HISTOGRAMS.items():
        total = [v for d in ds if (v := _sum(d, f"{name}_sum")) is not None]
        count = [v for d in ds if (v := _sum(d, f"{name}_count")) is not None]
        n = sum(count) if count else None
        out[f"{key}_ms"] = 1e3 * sum(total) / n if n and total else None
        out[f"{key}_n"] = n
    steps = [v for d in ds if (v := _sum(d, f"{STEP_TOKENS}_count")) is not None]
    tokens = [v for d in ds if (v := _sum(d, f"{STEP_TOKENS}_sum")) is not None]
    out["steps"] = sum(steps) if steps else None
    out["tokens_per_step"] = sum(tokens) / sum(steps) if steps and tokens and sum(steps) > 0 else None
    return out if any(v is not None for v in out.values()) else None


def per_instance_summary(instances: Iterable[InstanceDelta]) -> dict[str, dict[str, Any]]:
    """Small per-instance record for ``Measurement.raw``: tokens per rank, cache, KV received, preemptions."""
    out: dict[str, dict[str, Any]] = {}
    for i in instances:
        out[i.name] = {
            "role": i.role,
            "tokens_per_rank": rank_load(i.delta),
            "prefix_cache_queries": _sum(i.delta, CACHE_QUERIES),
            "prefix_cache_hits": _sum(i.delta, CACHE_HITS),
            "kv_transfer_tokens": _sum(i.delta, BY_SOURCE, source=EXTERNAL_KV),
            "preemptions": _sum(i.delta, PREEMPTIONS),
        }
    return out


def log_size(path: str | Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def eplb_balancedness(path: str | Path, since: int = 0) -> float | None:
    """EPLB balancedness over the ``EPLB step`` lines written to ``path`` after byte ``since``.

    Where the lines carry their token counts (vLLM ≥ 0.26: ``avg_tokens=…, max_tokens=…``) it is
    Σ avg_tokens / Σ max_tokens over the steps that moved tokens — the share of the slowest EP rank's work
    that an even split would leave, weighted as step times are. Idle DP steps log ``balancedness=0`` with no
    tokens; a plain mean counted them and read 0.94–0.96 where the loaded steps were 0.99 (2 × H200 run).
    Lines without token counts fall back to the mean of their balancedness.
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(since)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    avg_sum = max_sum = 0.0
    plain: list[float] = []
    for m in _EPLB.finditer(text):
        try:
            avg, mx, bal = (float(g) if g is not None else None for g in m.groups())
        except ValueError:
            continue
        if avg is not None and mx is not None:
            if mx > 0:
                avg_sum, max_sum = avg_sum + avg, max_sum + mx
        elif bal is not None:
            plain.append(bal)
    if max_sum > 0:
        return avg_sum / max_sum
    return sum(plain) / len(plain) if plain else None
