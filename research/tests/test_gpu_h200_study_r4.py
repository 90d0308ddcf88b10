"""The seventh H200 session's study (issue 30's whole job: baseline, 5 search trials, 2 repeats) says what
docs/benchmarks.md says.

The device's database is committed inside ``research/results/h200-study-30b-r4/raw.tar.xz``; this test unpacks
it, reads the study back through the project's own queries and re-derives the trial times, the levels in the
order they ran, the knees and the repeats the docs quote; the profile's held-out errors come from
``heldout.json`` (``profile_check.py heldout`` on that database).
"""

from __future__ import annotations

import statistics

import pytest

from research.tests.gpu_records import ROOT, recorded_study
from search_spaces import TrialState

RESULTS = ROOT / "research" / "results" / "h200-study-30b-r4"
STUDY = "h200-study-30b-r4"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return recorded_study(RESULTS, STUDY, tmp_path_factory.mktemp("h200-r4"))


def _in_order(trial):
    """A trial's levels in the order they ran (vLLM's result JSON dates each run; the database keeps them by load)."""
    return sorted(trial.measurements, key=lambda m: str(m.raw["date"]))


def test_the_whole_study_ran_and_its_times_are_the_docs(recorded) -> None:
    t, docs = recorded["trials"], recorded["docs"]
    assert [t[n].proposer for n in range(8)] == ["baseline", "model", "sampler", "model", "sampler", "model",
                                                 "repeat", "repeat"]
    assert all(t[n].state is TrialState.COMPLETE for n in range(8))
    assert (t[6].repeat_of, t[7].repeat_of) == (2, 0)  # the search's best and the baseline, deployed again
    total = [t[n].deploy_s + t[n].warmup_s + t[n].measure_s + t[n].teardown_s for n in range(8)]
    assert f"**Median trial {statistics.median(total) / 60:.1f} minutes** ({statistics.median(total):.0f} s" in docs
    assert f"the eight trials {sum(total):,.0f} s, {sum(total) / 60:.1f} min" in docs
    for n in range(8):
        assert f"| {t[n].deploy_s:.1f}" in docs
        assert f"| {t[n].warmup_s:.1f} | {t[n].measure_s:.1f} | {total[n]:.0f} s |" in docs
    assert max(total) < 4 * 60  # every trial under the 4 minutes
    warm = [t[n].warmup_s for n in range(8)]
    assert f"| {min(warm):.1f}–{max(warm):.1f} s |" in docs


def test_levels_knees_and_repeats_are_the_docs(recorded) -> None:
    t, docs = recorded["trials"], recorded["docs"]
    counts = [len(t[n].measurements) for n in range(8)]
    assert "Levels per knee: " + ", ".join(map(str, counts)) in docs
    assert f"(median {statistics.median(counts):g})" in docs and sum(c > 4 for c in counts) == 2
    for n in range(8):
        ordered = ", ".join(f"{m.concurrency:g}{' R' if 'remeasured' in m.flags else ''}" for m in _in_order(t[n]))
        knee = next(m for m in t[n].measurements if m.purpose == "knee")
        assert f"| {ordered} | c = {knee.concurrency:g}, {knee.throughput_per_gpu:,.0f}" in docs, ordered
        for m in t[n].measurements:  # every level full length: 2 x c prompts (at least 32), two runs of them for
            assert "short" not in m.flags  # a re-measured close call
            runs = 2 if "remeasured" in m.flags else 1
            assert m.num_requests == runs * max(2 * m.concurrency, 32), m
    runs = {0: [], 2: []}
    for n in range(8):
        origin = t[n].repeat_of if t[n].repeat_of is not None else n
        if origin in runs:
            runs[origin].append(next(m for m in t[n].measurements if m.purpose == "knee").throughput_per_gpu)
    defaults, best = statistics.mean(runs[0]), statistics.mean(runs[2])
    assert f"vLLM's defaults (trial 0, {defaults:,.1f} over 2 run(s))" in docs
    assert f"(trial 2, {best:,.1f} over 2 run(s)) is {best / defaults:.2f}×" in docs
    best_txt = (RESULTS / "best.txt").read_text()
    assert f"{defaults:,.1f} over 2 run(s)) are the best measured deployment" in best_txt and "a tie" in best_txt


def test_the_profiles_held_out_errors_are_the_docs(recorded) -> None:
    h, docs = recorded["heldout"], recorded["docs"]
    assert h["study"] == STUDY and h["profile"].startswith("profile #1")
    under, every = h["pooled_under_knee"], h["pooled"]
    assert under["profile"]["n"] == 90 and every["profile"]["n"] == 160
    assert (f"**{under['profile']['median']:.1%} with the profile, {under['defaults']['median']:.1%} with the "
            f"defaults** (all 32 levels: {every['profile']['median']:.1%} / {every['defaults']['median']:.1%})") in docs
    assert under["profile"]["median"] < 0.2 < under["defaults"]["median"]
    brackets = [h["trials"][str(n)]["levels_to_bracket"] for n in range(8)]
    assert "bracket, in the order run: " + ", ".join(map(str, brackets)) in docs
