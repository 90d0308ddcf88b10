"""A closed-loop level's first wave — the ``concurrency`` requests ``vllm bench serve`` sends at once as it begins —
is left out of the level's latencies (``executors.measuring.bench_result.first_wave``), and kept beside them in
``raw``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from executors.measuring import bench

#: A real level: the H200 study r4 (4 Dec), trial 5 (max-num-seqs 128 / batched tokens 2048), c = 34, 68 prompts
#: (per-request gaps rounded to 10 µs to keep the file small; vLLM's summary numbers are the run's own).
R4_C34 = Path(__file__).parent / "data" / "first_wave" / "h200-30b-r4-t5-c34.json"


def _level(starts: list[float], ttfts: list[float], tokens: int = 11, gap: float = 0.01) -> dict[str, Any]:
    n = len(starts)
    return {"num_prompts": n, "completed": n, "failed": 0, "duration": max(starts) + 1.0,
            "total_input_tokens": 100 * n, "total_output_tokens": tokens * n, "request_throughput": 1.0,
            "output_throughput": 1.0, "total_token_throughput": 1.0, "start_times": starts, "ttfts": ttfts,
            "itls": [[gap] * (tokens - 1)] * n, "latencies": [t + gap * (tokens - 1) for t in ttfts],
            "output_lens": [tokens] * n, "input_lens": [100] * n, "errors": [""] * n}


def test_the_burst_that_decided_r4s_ttft_slo_is_left_out_and_kept_in_raw() -> None:
    d = json.loads(R4_C34.read_text())
    m = bench.parse_result(d, concurrency=34, gpus=1)
    wave = m.raw["first_wave"]
    assert wave["requests"] == 34
    # vLLM's whole-run P90 TTFT (2.38 s) failed the 2-s SLO; the burst alone read 2.55 s, the steady requests 0.30 s
    assert m.raw["p90_ttft_ms"] == d["p90_ttft_ms"] > 2000
    assert wave["p90_ttft_ms"] > 2000 > 500 > m.p90_ttft_ms
    starts = np.asarray(d["start_times"])
    first = np.argsort(starts)[:34]
    assert starts[first].max() - starts.min() < 0.05  # sent within 50 ms of each other
    later = [1000 * t for i, t in enumerate(d["ttfts"]) if i not in set(first)]
    assert m.p90_ttft_ms == pytest.approx(np.percentile(later, 90))
    lo, hi = m.intervals["p90_ttft_ms"]  # the interval is the steady requests' too
    assert lo <= m.p90_ttft_ms <= hi < 2000
    # throughput is the whole level's
    assert m.output_throughput_per_gpu == pytest.approx(d["output_throughput"])


def test_only_requests_sent_before_any_ended_are_the_wave() -> None:
    """A client that never held its load (one request at a time, c = 4) sent no burst: nothing is left out but
    the first request (sent before any had ended)."""
    starts = [float(i) for i in range(8)]
    d = _level(starts, [0.1] * 8)
    d["latencies"] = [0.9] * 8
    assert bench.first_wave(d, 4) == [0]
    burst = _level([0.0, 0.0, 0.0, 0.0, 1.0, 1.1, 1.2, 1.3], [2.0, 2.0, 2.0, 2.0, 0.1, 0.1, 0.1, 0.1])
    assert bench.first_wave(burst, 4) == [0, 1, 2, 3]
    m = bench.parse_result(burst, concurrency=4, gpus=1)
    assert m.p90_ttft_ms == pytest.approx(100.0) and m.raw["first_wave"]["p90_ttft_ms"] == pytest.approx(2000.0)


def test_at_most_half_a_level_and_nothing_at_c1_or_for_rate_levels() -> None:
    burst = _level([0.0] * 6, [1.0, 1.0, 1.0, 1.0, 0.1, 0.1])
    assert bench.first_wave(burst, 8) == [0, 1, 2]  # 6 prompts at c = 8: the 3 earliest, half the level
    assert bench.first_wave(burst, 1) == []
    rate = bench.parse_result(burst, concurrency=8, gpus=1, request_rate=4.0)  # open loop: no burst to leave out
    assert "first_wave" not in rate.raw and rate.raw["derived"]["tpot_requests"] == 6


def test_two_pooled_runs_leave_out_each_runs_own_wave() -> None:
    """A close call measured twice is pooled (``pool_results``): each run began with its own burst."""
    one = _level([0.0, 0.0, 1.0, 1.1], [2.0, 2.0, 0.1, 0.1])
    two = _level([0.0, 0.0, 1.0, 1.1], [3.0, 3.0, 0.2, 0.2])
    pooled = bench.pool_results(one, two)
    assert pooled["run_sizes"] == [4, 4]
    assert bench.first_wave(pooled, 2) == [0, 1, 4, 5]
    m = bench.parse_result(pooled, concurrency=2, gpus=1)
    assert m.raw["first_wave"]["requests"] == 4
    assert m.p90_ttft_ms == pytest.approx(np.percentile([100, 100, 200, 200], 90))
    assert m.raw["first_wave"]["p50_ttft_ms"] == pytest.approx(2500.0)
