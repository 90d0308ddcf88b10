"""The ninth H200 session's study (r5: one trial before the machine was lost) says what docs/benchmarks.md says.

The device's database came back as a snapshot, committed inside ``research/results/h200-study-30b-r5/raw.tar.xz``
(``da-gpu/results.db``, as the other studies); this test unpacks it, reads it through the project's own queries and
re-derives the baseline trial's phases, its levels in the order they ran, the knee, what the first wave measured and
the stall re-measure.
"""

from __future__ import annotations

import pytest

from research.tests.gpu_records import ROOT, recorded_study
from search_spaces import TrialState

RESULTS = ROOT / "research" / "results" / "h200-study-30b-r5"
STUDY = "h200-study-30b-r5"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    r = recorded_study(RESULTS, STUDY, tmp_path_factory.mktemp("h200-r5"))
    return r["trials"], r["docs"]


def test_the_baseline_trial_and_its_phases_are_the_docs(recorded) -> None:
    trials, docs = recorded
    assert sorted(trials) == [0, 1]
    base, second = trials[0], trials[1]
    assert base.state is TrialState.COMPLETE and base.baseline
    assert second.state is TrialState.RUNNING and not second.measurements  # lost with the machine
    total = base.deploy_s + base.warmup_s + base.measure_s + base.teardown_s
    row = f"| {base.deploy_s:.1f} s (cold machine) | {base.warmup_s:.1f} | {base.measure_s:.1f} | {total:.0f} s |"
    assert row in docs


def test_the_knee_took_three_levels_from_the_models_start(recorded) -> None:
    trials, docs = recorded
    levels = sorted(trials[0].measurements, key=lambda m: str(m.raw["date"]))
    marks = {"remeasured": " R", "stall-remeasured": " S"}
    ordered = ", ".join(f"{m.concurrency:g}" + "".join(v for k, v in marks.items() if k in m.flags) for m in levels)
    knee = next(m for m in levels if m.purpose == "knee")
    assert f"| {ordered} | c = {knee.concurrency:g}, {knee.throughput_per_gpu:,.0f} tok/s/GPU |" in docs
    assert len(levels) == 3 and all("short" not in m.flags for m in levels)
    assert levels[0].raw["knee_start"] == "model"
    # the speed bound decided: every level's P90 TTFT (without the first wave) is far under 2 s
    assert all(m.p90_ttft_ms < 500 for m in levels)
    assert [m.p90_tokens_per_s_per_user >= 30 for m in levels] == [True, False, False]
    speeds = [m.p90_tokens_per_s_per_user for m in levels]
    assert f"P90 {speeds[0]:.1f}" in docs and f"({speeds[1]:.1f})" in docs and f"({speeds[2]:.1f}) and was measured again" in docs


def test_the_first_wave_and_the_stall_rerun_are_stored_and_quoted(recorded) -> None:
    trials, docs = recorded
    levels = sorted(trials[0].measurements, key=lambda m: str(m.raw["date"]))
    whole = [m.raw["p90_ttft_ms"] for m in levels]  # vLLM's own whole-run numbers, kept in raw
    wave = [m.raw["first_wave"]["p90_ttft_ms"] for m in levels]
    assert "the whole-run P90 TTFT of the three levels, as vLLM computed it, was\n  " \
        f"{whole[0]:,.0f}, {whole[1]:,.0f} and {whole[2]:,.0f} ms" in docs
    assert f"(the burst's own {wave[0]:,.0f}, {wave[1]:,.0f}, {wave[2]:,.0f} ms" in docs
    assert all(w > 1800 for w in wave) and all(  # one burst per run: a close call pooled two
        m.raw["first_wave"]["requests"] == m.concurrency * m.raw.get("pooled_runs", 1) for m in levels)
    note = levels[0].raw["stall_remeasured"]
    assert note["kept"] == "rerun" and note["first_pause_s"] > 1.0 > note["rerun_pause_s"]
    assert f"c = 70's first run paused {note['first_pause_s']:.2f} s" in docs
    assert f"(pause {note['rerun_pause_s']:.2f} s)" in docs
    assert f"whole-run P50 TTFT {note['dropped']['whole_run_p50_ttft_ms']:.0f} ms" in docs
