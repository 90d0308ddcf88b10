"""The knee search (executors/measuring/loop.py) against probes whose knee is known, and the objectives it feeds.

The probes here are deterministic stand-ins for a deployment (a level meets the SLO exactly when its load is at
most ``K``), so every property can be checked exactly; the real probe runs in tests/test_knee_real.py.
"""

from __future__ import annotations

import pytest

from advisor.job import job_from_dict
from advisor.objectives import copies, score, scoped
from executors.measuring.loop import MeasurePlan, knee_of, search_levels
from search_spaces import SLO, Measurement, Workload

SLOS = (SLO(metric="p90_ttft_ms", op="<=", value=2000.0),)


def _probe(knee: float, seen: list[float]):
    def probe(load: float) -> Measurement:
        seen.append(load)
        ok = load <= knee
        return Measurement(concurrency=int(load), source="simulated", gpus=8, num_requests=100, completed=100,
                           p90_ttft_ms=100.0 if ok else 1e5, throughput_per_gpu=10.0 * load, error_rate=0.0)
    return probe


@pytest.mark.parametrize("knee", [3, 37, 100, 263, 1904])
def test_a_right_prediction_brackets_the_knee_in_two_levels(knee: int) -> None:
    seen: list[float] = []
    levels = search_levels(_probe(knee, seen), Workload(load_levels=[]), MeasurePlan(SLOS, float(knee)))
    assert len(levels) == 2 and knee_of(levels).concurrency == knee
    assert not knee_of(levels).flags


@pytest.mark.parametrize(("knee", "start"), [(50, 80), (50, 30), (500, 300), (7, 12), (120, 16)])
def test_the_knee_is_a_measured_level_within_the_tolerance(knee: int, start: int) -> None:
    seen: list[float] = []
    wl = Workload(load_levels=[], max_levels=6, knee_tolerance=0.15)
    levels = search_levels(_probe(knee, seen), wl, MeasurePlan(SLOS, float(start)))
    k = knee_of(levels)
    assert k is not None and k.concurrency in seen and k.concurrency <= knee  # never above, never interpolated
    assert k.concurrency >= knee / 1.15 or "bracket-open" in k.flags
    assert len(levels) <= 6 and len(set(seen)) == len(seen)  # no level measured twice


def test_flags_say_why_the_search_ended() -> None:
    wl = Workload(load_levels=[], max_levels=6, max_load=64)
    top = search_levels(_probe(10_000, []), wl, MeasurePlan(SLOS, 60.0))
    assert "knee-at-max-load" in knee_of(top).flags and knee_of(top).concurrency == 64
    none = search_levels(_probe(0, []), wl, MeasurePlan(SLOS, 4.0))
    assert knee_of(none) is None and any("no-level-meets-slo" in m.flags for m in none)
    far = search_levels(_probe(10, []), wl.model_copy(update={"max_levels": 3}), MeasurePlan(SLOS, 2000.0))
    assert knee_of(far) is None or "bracket-open" in knee_of(far).flags


def test_fixed_levels_are_measured_after_the_search_and_without_slos_only_they() -> None:
    seen: list[float] = []
    wl = Workload(load_levels=[8, 32, 128], max_levels=6)
    levels = search_levels(_probe(40, seen), wl, MeasurePlan(SLOS, 40.0))
    assert {8, 32, 128} <= {m.concurrency for m in levels} and seen[:2] == [40.0, 46.0]
    assert [m.purpose for m in levels if m.concurrency in (8, 128)] == ["fixed", "fixed"]
    only = search_levels(_probe(40, []), wl, MeasurePlan((SLO(metric="error_rate", op="<=", value=0.01),)))
    assert [m.concurrency for m in only] == [8, 32, 128]  # no SLO that load breaks: no knee to search


def test_rate_levels_search_a_request_rate() -> None:
    seen: list[float] = []

    def probe(rate: float) -> Measurement:
        seen.append(rate)
        return Measurement(concurrency=64, request_rate=rate, source="simulated", gpus=1, num_requests=50,
                           completed=50, p90_ttft_ms=100.0 if rate <= 3.3 else 1e4)

    wl = Workload(load_levels=[], load_by="rate", max_load=50)
    levels = search_levels(probe, wl, MeasurePlan(SLOS, 2.0))
    k = knee_of(levels)
    assert k.request_rate is not None and 3.3 / 1.15 <= k.request_rate <= 3.3
    assert all(r != int(r) or r in (2.0, 3.0) for r in seen)  # rates are not rounded to integers


def test_values_come_from_one_level_and_scope_counts_the_cluster() -> None:
    job = job_from_dict({"name": "s", "preset": "gb300-rack-dsv3", "objective": {"mode": "pareto"},
                         "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 2000}]})
    a = Measurement(concurrency=64, source="simulated", gpus=32, num_requests=10, completed=10, p90_ttft_ms=500,
                    throughput_per_gpu=1000.0, p90_tokens_per_s_per_user=90.0, purpose="search")
    b = a.model_copy(update={"concurrency": 256, "throughput_per_gpu": 3000.0, "p90_tokens_per_s_per_user": 40.0,
                             "purpose": "knee"})
    out = score(job, [a, b])
    assert out.values == [3000.0, 40.0] and out.best is b  # not (3000, 90): no level reached that point
    assert copies(job, 32) == 2  # 72 GPUs hold two 32-GPU copies
    cluster = job.model_copy(update={"objective": job.objective.model_copy(update={"scope": "cluster"})})
    assert scoped(cluster, "throughput_per_gpu", b) == pytest.approx(3000.0 * 64 / 72)  # 8 idle GPUs
    assert scoped(cluster, "p90_tokens_per_s_per_user", b) == 40.0


def _two_probes(knee_short: float, knee_full: float, seen: list[tuple[float, bool]]):
    """A full-length probe with knee ``knee_full`` and a short (bracketing) one that sees ``knee_short``."""
    full, short = _probe(knee_full, []), _probe(knee_short, [])

    def pick(is_short: bool):
        def probe(load: float) -> Measurement:
            seen.append((load, is_short))
            return (short if is_short else full)(load)
        return probe
    return pick(False), pick(True)


@pytest.mark.parametrize(("knee", "start"), [(50, 80), (50, 30), (500, 300), (7, 12), (120, 16), (263, 263)])
def test_short_levels_bracket_and_only_the_bracket_ends_run_at_full_length(knee: int, start: int) -> None:
    seen: list[tuple[float, bool]] = []
    full, short = _two_probes(knee, knee, seen)
    wl = Workload(load_levels=[], max_levels=6, knee_tolerance=0.15)
    levels = search_levels(full, wl, MeasurePlan(SLOS, float(start)), short=short)
    k = knee_of(levels)
    assert k is not None and knee / 1.15 <= k.concurrency <= knee and "short" not in k.flags
    assert (k.concurrency, False) in seen  # the knee is a full-length level ...
    above = [m for m in levels if m.concurrency > k.concurrency and "short" not in m.flags]
    assert above and (min(m.concurrency for m in above), False) in seen  # ... and so is the failure above it
    assert sum(not s for _, s in seen) == 2  # nothing else at full length
    assert all(s for load, s in seen if load not in (k.concurrency, min(m.concurrency for m in above)))
    assert k.raw["short_run"]["met_slos"] is True


@pytest.mark.parametrize(("knee_short", "knee_full"), [(60, 40), (30, 45), (100, 10)])
def test_a_full_level_that_contradicts_its_short_run_reopens_the_search(knee_short: int, knee_full: int) -> None:
    seen: list[tuple[float, bool]] = []
    full, short = _two_probes(knee_short, knee_full, seen)
    wl = Workload(load_levels=[], max_levels=6, knee_tolerance=0.15)
    levels = search_levels(full, wl, MeasurePlan(SLOS, 50.0), short=short)
    k = knee_of(levels)
    assert k is not None and k.concurrency <= knee_full and "short" not in k.flags  # never above the full truth
    assert (k.concurrency, False) in seen and sum(not s for _, s in seen) <= wl.max_levels
    assert k.concurrency >= knee_full / 1.15 or "bracket-open" in k.flags


def test_short_levels_draw_their_own_prompts_and_fewer_of_them() -> None:
    wl = Workload(load_levels=[], prompts_per_concurrency=10, min_prompts=40, bracket_prompts_per_concurrency=3)
    assert wl.num_prompts(64, short=True) == 192 < wl.num_prompts(64) == 640
    assert wl.num_prompts(2, short=True) == 20 and wl.num_prompts(2) == 40  # half the floor
    assert wl.level_seed(64, short=True) != wl.level_seed(64)
    off = wl.model_copy(update={"bracket_prompts_per_concurrency": 0.0})
    assert off.num_prompts(64, short=True) == 20  # 0 never reaches the real search (no short probe then)
