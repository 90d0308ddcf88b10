"""The sixth H200 session's study (issue 30's job, stopped after three trials) says what docs/benchmarks.md says.

The device's database is committed inside ``research/results/h200-study-30b-r3/raw.tar.xz``; this test unpacks
it, reads the study back through the project's own queries and re-derives the trial times, levels and knees the
docs quote, and checks the profile's held-out errors (``heldout.json``, written by ``profile_check.py heldout`` on
that database) against the docs' table.
"""

from __future__ import annotations

import statistics

import pytest

from research.tests.gpu_records import ROOT, recorded_study
from search_spaces import TrialState

RESULTS = ROOT / "research" / "results" / "h200-study-30b-r3"
STUDY = "h200-study-30b-r3"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return recorded_study(RESULTS, STUDY, tmp_path_factory.mktemp("h200-r3"))


def test_trial_times_levels_and_knees_are_what_the_docs_say(recorded) -> None:
    t, docs = recorded["trials"], recorded["docs"]
    assert [t[n].proposer for n in range(4)] == ["baseline", "model", "sampler", "sampler"]
    assert [t[n].state for n in range(3)] == [TrialState.COMPLETE] * 3
    assert t[3].state is TrialState.INTERRUPTED and "SIGTERM" in (t[3].reason or "") and not t[3].measurements
    total = [t[n].deploy_s + t[n].warmup_s + t[n].measure_s + t[n].teardown_s for n in range(3)]
    assert " / ".join(f"{s:.0f}" for s in total) in docs  # "233 / 233 / 241 s"
    assert f"**Median trial {statistics.median(total) / 60:.1f} minutes**" in docs
    for n in range(3):
        assert f"{t[n].deploy_s:.1f}" in docs and f"{t[n].measure_s:.1f}" in docs
    levels = [len(t[n].measurements) for n in range(3)]
    assert levels == [2, 6, 4] and "Full-length levels per knee: 2, 6 and 4" in docs
    knees = [next(m for m in t[n].measurements if m.purpose == "knee") for n in range(3)]
    assert [k.concurrency for k in knees] == [61, 38, 70]
    for k in knees:
        assert f"{k.throughput_per_gpu:,.0f}" in docs
    # every level of this job is full length (bracket_prompts_per_concurrency 0): 2 x c prompts, 4 x c re-measured
    for n in range(3):
        for m in t[n].measurements:
            assert "short" not in m.flags
            assert m.num_requests == (4 if "remeasured" in m.flags else 2) * m.concurrency, m


def test_the_profiles_held_out_errors_are_the_docs_table(recorded) -> None:
    h, docs = recorded["heldout"], recorded["docs"]
    assert h["study"] == STUDY and h["profile"].startswith("profile #1")
    under, every = h["pooled_under_knee"], h["pooled"]
    assert under["profile"]["n"] == 30 and every["profile"]["n"] == 60
    assert f"**{under['profile']['median']:.1%} with the profile, {under['defaults']['median']:.1%} with the\ndefaults**" in docs
    assert f"(all 12 levels: {every['profile']['median']:.1%} / {every['defaults']['median']:.1%})" in docs
    assert under["profile"]["median"] < 0.2 < under["defaults"]["median"]  # the bar, and the defaults miss it
    assert [h["trials"][str(n)]["levels_to_bracket"] for n in range(3)] == [2, 4, 3]
