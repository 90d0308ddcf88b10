"""A steady level (``workload.level_start: steady``) spreads its first c requests over about one request's lifetime:
``vllm bench serve`` gets a request rate beside ``--max-concurrency``; a burst level gets none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from advisor.job import BadInput, job_from_dict
from executors.measuring import bench
from executors.measuring.loop import LevelProbe, LevelRunner, MeasurePlan
from search_spaces import LengthDist, Workload

#: a real ``vllm bench serve --save-result --save-detailed`` result (vLLM 0.26.0, one H200, c=16): it carries
#: ``request_rate`` and ``burstiness``, the two options a steady level sets, so the GPU build has them
H200_C16 = Path(__file__).parent / "data" / "bench_serve_h200_vllm026_c16.json"


def _args(workload: Workload, spec: bench.LevelSpec) -> list[str]:
    return bench.bench_args(workload, spec, base_url="http://127.0.0.1:1", model="m", tokenizer="t",
                            result_dir="/tmp", result_filename="x.json")


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_a_steady_level_carries_a_request_rate_beside_its_concurrency_and_a_burst_level_none() -> None:
    lifetimes = [(8.0, 2.0)]  # a run at c=8 whose requests lived 2 s
    steady, burst = Workload(level_start="steady"), Workload(level_start="burst")
    s = bench.LevelSpec.for_load(steady, 8, lifetimes=lifetimes)
    b = bench.LevelSpec.for_load(burst, 8, lifetimes=lifetimes)
    sa, ba = _args(steady, s), _args(burst, b)
    assert _flag(sa, "--max-concurrency") == _flag(ba, "--max-concurrency") == "8"
    # 8 requests over 2 s / 1.25: the first c go out over 0.8 of a lifetime, evenly
    assert float(_flag(sa, "--request-rate")) == pytest.approx(bench.STEADY_HEADROOM * 8 / 2.0, rel=1e-3)
    assert _flag(sa, "--burstiness") == str(bench.STEADY_BURSTINESS)
    assert "--request-rate" not in ba and "--burstiness" not in ba
    # the default keeps vllm bench serve's closed loop as it was
    assert Workload().level_start == "burst"


def test_a_steady_level_with_nothing_to_estimate_from_or_at_c1_starts_at_once() -> None:
    wl = Workload(level_start="steady")
    assert bench.LevelSpec.for_load(wl, 8).pace_rps is None  # no run before it (no warm-up)
    assert bench.LevelSpec.for_load(wl, 1, lifetimes=[(1.0, 0.5)]).pace_rps is None  # one request: no wave


def test_rate_levels_keep_their_own_rate() -> None:
    wl = Workload(level_start="steady", load_by="rate", max_load_concurrency=64)
    spec = bench.LevelSpec.for_load(wl, 2.5, lifetimes=[(64.0, 1.0)])
    args = _args(wl, spec)
    assert spec.pace_rps is None and _flag(args, "--request-rate") == "2.5" and "--burstiness" not in args


def test_the_lifetime_is_a_lower_bound_from_the_nearest_runs() -> None:
    h = bench.STEADY_HEADROOM
    # below c: the nearest lower run's lifetime (latency does not fall with load)
    assert bench.steady_rate(16, [(4.0, 1.0), (8.0, 1.5)]) == pytest.approx(h * 16 / 1.5)
    # only above c: that run's lifetime × c / its concurrency (Little's law)
    assert bench.steady_rate(8, [(16.0, 4.0)]) == pytest.approx(h * 8 / 2.0)
    # both: the larger bound
    assert bench.steady_rate(8, [(4.0, 1.0), (16.0, 4.0)]) == pytest.approx(h * 8 / 2.0)
    assert bench.steady_rate(8, [(4.0, 3.0), (16.0, 4.0)]) == pytest.approx(h * 8 / 3.0)
    assert bench.steady_rate(8, [(4.0, 0.0)]) is None  # no usable lifetime


def test_the_warm_up_paces_the_first_level_and_each_level_the_next() -> None:
    """A probe whose runs replay one recorded GPU result (no server here to run them: a labelled fake runner)."""
    data = json.loads(H200_C16.read_text())
    assert "request_rate" in data and "burstiness" in data
    life = data["mean_e2el_ms"] / 1000.0
    specs: list[bench.LevelSpec] = []

    def run_level(spec: bench.LevelSpec) -> tuple[dict[str, Any], float]:
        specs.append(spec)
        return data, 1.0

    wl = Workload(isl=LengthDist(mean=2048), osl=LengthDist(mean=64), load_levels=[16], knee_search=False,
                  level_start="steady", prompts_per_concurrency=2, min_prompts=1, fresh_prompts=False)
    probe = LevelProbe(LevelRunner(run_level, lambda: None, []), wl, MeasurePlan(()), gpus=1, disaggregated=False)
    m = probe(16)
    warm, level = specs
    assert warm.name.startswith("warmup") and warm.pace_rps is None  # nothing ran before the warm-up
    assert level.pace_rps == pytest.approx(bench.STEADY_HEADROOM * 16 / life)
    assert m.raw["pace_rps"] == level.pace_rps and m.request_rate is None  # still a concurrency level
    assert probe.lifetimes == [(16.0, life), (16.0, life)]


@pytest.mark.parametrize("value", ["smooth", 3, None])
def test_a_bad_level_start_is_one_line_naming_the_field_and_the_choices(value: Any) -> None:
    with pytest.raises(BadInput) as e:
        job_from_dict({"name": "x", "preset": "cpu-tiny-moe", "workload": {"level_start": value}})
    line = str(e.value)
    assert "\n" not in line and "workload.level_start" in line and "'burst' or 'steady'" in line


def _closed_loop(c: int, n: int, life: float, ramp_s: float, rate: float) -> dict[str, Any]:
    """A closed loop at ``c`` whose first c requests start evenly over ``ramp_s`` and each of which lives ``life``."""
    starts = [k * ramp_s / c + (i // c) * life for i in range(n) for k in [i % c]]
    return {"start_times": starts, "latencies": [life] * n, "ttfts": [0.1] * n, "itls": [[0.1] * 9] * n,
            "output_lens": [10] * n, "input_lens": [100] * n, "errors": [""] * n, "completed": n, "failed": 0,
            "num_prompts": n, "duration": max(starts) + life, "request_rate": rate}


def test_a_steady_levels_ramp_is_not_read_as_a_saturated_client() -> None:
    """The client is judged from the c-th start: before it, a steady level was not yet asked for c in flight."""
    steady = bench.parse_result(_closed_loop(4, 12, 1.0, 0.8, 5.0), concurrency=4, gpus=1)
    assert steady.achieved_concurrency == pytest.approx(4.0) and not steady.client_saturated
    # the same starts read as a burst level's (no finite rate): the ramp counts, and is under 90% of c
    burst = bench.parse_result(_closed_loop(4, 12, 1.0, 0.8, float("inf")), concurrency=4, gpus=1)
    assert burst.achieved_concurrency < 0.9 * 4 and burst.client_saturated
