"""A level during which the server stalled is measured again (``bench_result.stall_of``, ``LevelProbe._unstall``).

The two bench JSONs are real, untrimmed ``vllm bench serve --save-result --save-detailed`` results (vLLM 0.26.0,
one H200, 4 Dec, the DeepSeek-V3-width FP8 profile ``h200-profile-dsv3``): ``h200-dsv3-L1-c16-stalled.json`` is
c=16 on the 1-layer stack, where the server paused for just-in-time kernel compiles (its log: "Triton kernel JIT
compilation during inference: fused_moe_kernel"; P50 TTFT 6.6 s beside 276 ms at c=64), and
``h200-dsv3-L5-c16-clean.json`` is c=16 on the 5-layer stack without a pause. ``research/stall_check.py`` lists
every level of those runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from executors.measuring import bench
from executors.measuring.bench_result import STALL_FACTOR, STALL_FLOOR_S, stall_of, token_pauses
from executors.measuring.loop import LevelProbe, LevelRunner, MeasurePlan
from search_spaces import SLO, LengthDist, Workload

DATA = Path(__file__).parent / "data" / "stalls"
STALLED = DATA / "h200-dsv3-L1-c16-stalled.json"
CLEAN = DATA / "h200-dsv3-L5-c16-clean.json"


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_the_detector_finds_the_compile_pause_and_not_the_clean_levels_gaps() -> None:
    stalled, clean = stall_of(_load(STALLED)), stall_of(_load(CLEAN))
    assert stalled is not None and clean is not None
    assert stalled["stalled"] and not clean["stalled"]
    assert 13.0 < stalled["longest_pause_s"] < 13.3  # the first tokens waited for the compile
    assert clean["longest_pause_s"] < 0.1 < STALL_FLOOR_S
    for s in (stalled, clean):  # an ordinary long gap is a few ms here: the floor decides on this GPU
        assert s["pause_reference_s"] < 0.005 and STALL_FACTOR * s["pause_reference_s"] < STALL_FLOOR_S


def test_parse_result_stores_the_pause_of_every_level_and_flags_the_stall() -> None:
    stalled = bench.parse_result(_load(STALLED), concurrency=16, gpus=1)
    clean = bench.parse_result(_load(CLEAN), concurrency=16, gpus=1)
    assert "stalled" in stalled.flags and "stalled" not in clean.flags
    assert stalled.raw["longest_pause_s"] > 13.0 and clean.raw["longest_pause_s"] < 0.1
    # what the stall did to the level (vLLM's own whole-run numbers; the first wave waited for the compile)
    assert stalled.raw["p50_ttft_ms"] > 6000 > 300 > clean.raw["p50_ttft_ms"]
    assert stalled.raw["first_wave"]["p50_ttft_ms"] > 6000


def test_gaps_while_nothing_is_in_flight_are_not_pauses() -> None:
    """Two requests one after the other, 5 s apart: the client was idle between them, the server not stalled."""
    data = {"start_times": [0.0, 10.0], "ttfts": [0.1, 0.1], "itls": [[0.01] * 4, [0.01] * 4],
            "latencies": [0.14, 0.14], "errors": ["", ""]}
    gaps = token_pauses(data)
    assert max(gaps) == pytest.approx(0.1)  # the wait for each first token, nothing for the idle 9.86 s
    assert stall_of(data)["stalled"] is False  # type: ignore[index]


WORKLOAD = Workload(isl=LengthDist(mean=2048), osl=LengthDist(mean=64), load_levels=[16], knee_search=False,
                    warmups_per_concurrency=0, prompts_per_concurrency=2, min_prompts=1, fresh_prompts=False)


def _probe(results: list[Path]) -> tuple[LevelProbe, list[str]]:
    """A probe whose levels replay recorded results in order (no server: no counters to scrape)."""
    ran: list[str] = []

    def run_level(spec: bench.LevelSpec) -> tuple[dict[str, Any], float]:
        ran.append(spec.name)
        return _load(results[len(ran) - 1]), 1.0

    runner = LevelRunner(run_level, lambda: None, [])
    return LevelProbe(runner, WORKLOAD, MeasurePlan(()), gpus=1, disaggregated=False, warm=True), ran


def test_a_stalled_level_is_measured_again_and_the_run_without_the_stall_kept() -> None:
    probe, ran = _probe([STALLED, CLEAN])
    m = probe(16)
    assert ran == ["c16", "c16-2"]
    assert "stalled" not in m.flags and "stall-remeasured" in m.flags
    assert m.p50_ttft_ms < 300 and m.raw["longest_pause_s"] < 0.1
    note = m.raw["stall_remeasured"]
    assert note["kept"] == "rerun" and note["first_pause_s"] > 13.0 and note["dropped"]["whole_run_p50_ttft_ms"] > 6000


def test_a_level_that_stalls_again_keeps_the_shorter_pause_and_says_so() -> None:
    probe, ran = _probe([STALLED, STALLED])
    m = probe(16)
    assert ran == ["c16", "c16-2"]
    assert {"stalled", "stall-remeasured"} <= set(m.flags)
    assert m.raw["stall_remeasured"]["kept"] == "first"  # equal pauses: the first run stays


def test_a_clean_level_is_measured_once() -> None:
    probe, ran = _probe([CLEAN])
    m = probe(16)
    assert ran == ["c16"] and "stall-remeasured" not in m.flags and "stall_remeasured" not in m.raw


def test_a_profile_leaves_levels_still_stalled_out_of_its_fit() -> None:
    """``advisor profile``'s fit values of one probe: the level whose server stalled twice is not among them."""
    from advisor.profile import probe_values

    stalled = bench.parse_result(_load(STALLED), concurrency=16, gpus=1)
    clean = bench.parse_result(_load(CLEAN), concurrency=64, gpus=1)  # the clean run, standing in for c=64
    assert set(probe_values([stalled, clean])) == {64}
    unflagged = stalled.model_copy(update={"flags": []})
    assert set(probe_values([unflagged, clean])) == {16, 64}  # only the flag leaves a level out


def _close_call_probe(results: list[Path]) -> tuple[LevelProbe, list[str]]:
    """``_probe`` with one SLO the clean run is a close call on: P90 TTFT bounded in the middle of its interval."""
    lo, hi = bench.parse_result(_load(CLEAN), concurrency=16, gpus=1).intervals["p90_ttft_ms"]
    probe, ran = _probe(results)
    probe.plan = MeasurePlan((SLO(metric="p90_ttft_ms", op="<=", value=(lo + hi) / 2),))
    return probe, ran


def test_a_close_calls_second_run_that_stalls_is_measured_again_before_it_is_pooled() -> None:
    """H200 study r6 (5 Dec): c = 93's close call was run twice and the second run paused 1.2 s; pooled as it was,
    the level failed P90 tok/s/user >= 30 that its clean first run met (27.7 beside 31.2). Here the first run is
    clean and a close call, the second stalled: it is run a third time, and the pool holds the two clean runs."""
    probe, ran = _close_call_probe([CLEAN, STALLED, CLEAN])
    m = probe(16)
    assert ran == ["c16", "c16-2", "c16-3"]
    assert {"remeasured", "stall-remeasured"} <= set(m.flags) and "stalled" not in m.flags
    note = m.raw["close_call_stall_remeasured"]
    assert note["kept"] == "rerun" and note["first_pause_s"] > 13.0 and note["rerun_pause_s"] < 0.1
    assert "stall_remeasured" not in m.raw  # the level's first run was clean
    assert m.raw["longest_pause_s"] < 0.1 and m.p50_ttft_ms < 300


def test_a_close_call_whose_second_run_is_clean_is_pooled_at_once() -> None:
    probe, ran = _close_call_probe([CLEAN, CLEAN])
    m = probe(16)
    assert ran == ["c16", "c16-2"] and "remeasured" in m.flags and "stall-remeasured" not in m.flags
