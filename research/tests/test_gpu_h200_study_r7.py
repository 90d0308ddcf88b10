"""The eleventh H200 session's study (r7: the baseline, 5 search trials, the repeats of the best and of the baseline, in
one device allowance) and profile #1 under today's stall rule say what docs/benchmarks.md says.

The device's database and bench JSONs are committed inside ``research/results/h200-study-30b-r7/raw.tar.xz`` (and
profile #1's probe runs inside ``h200-study-30b/raw.tar.xz``, r6's baseline inside ``h200-study-30b-r6/raw.tar.xz``);
this test unpacks them, reads the study back through the project's own queries and re-derives the trial times, the
levels per knee, the answer, the stalled probe and the gaps between tokens the docs quote.
"""

from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path

import pytest

from executors.measuring.bench_result import stall_of
from research import itl_modes
from research.tests.gpu_records import ROOT, raw_or_skip, recorded_study, written_record
from search_spaces import TrialState

RESULTS = ROOT / "research" / "results"
R7 = RESULTS / "h200-study-30b-r7"
STALL_RULE = RESULTS / "profile1-stall-rule"
STUDY = "h200-study-30b-r7"
MARKS = {"stall-remeasured": " S", "remeasured": " R"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return recorded_study(R7, STUDY, tmp_path_factory.mktemp("h200-r7"))


def _label(m) -> str:
    return f"{m.concurrency:g}" + "".join(v for k, v in MARKS.items() if k in m.flags)


def _total(t) -> float:
    return t.deploy_s + t.warmup_s + t.measure_s + t.teardown_s


def test_the_whole_study_ran_and_every_knee_took_at_most_four_levels(recorded) -> None:
    t, docs = recorded["trials"], recorded["docs"]
    assert [t[n].proposer for n in range(8)] == ["baseline", "model", "sampler", "sampler", "sampler", "sampler",
                                                 "repeat", "repeat"]
    assert all(t[n].state is TrialState.COMPLETE for n in range(8)) and (t[6].repeat_of, t[7].repeat_of) == (4, 0)
    for n in range(8):
        ms = sorted(t[n].measurements, key=lambda m: str(m.raw["date"]))
        knee = next(m for m in ms if m.purpose == "knee")
        assert f"| {t[n].deploy_s:.1f}" in docs
        assert f"| {t[n].warmup_s:.1f} | {t[n].measure_s:.1f} | {_total(t[n]):.0f} s | " \
            + ", ".join(_label(m) for m in ms) + f" | c = {knee.concurrency:g}, {knee.throughput_per_gpu:,.0f}" in docs
        assert all("short" not in m.flags for m in ms) and ms[0].raw["knee_start"] == "model"
    counts = [len(t[n].measurements) for n in range(8)]
    assert max(counts) <= 4 and f"levels per knee {', '.join(map(str, counts))}**" in docs
    totals = [_total(t[n]) for n in range(8)]
    med = statistics.median(totals)
    assert med < 240 and f"**median trial {med / 60:.1f} minutes** ({med:.0f} s over the eight; the eight\n  " \
        f"{sum(totals):,.0f} s" in docs
    ov = [(m.raw["bench_wall_s"] - m.raw["duration"]) / m.raw.get("pooled_runs", 1)
          for n in range(8) for m in t[n].measurements]
    assert f"duration {min(ov):.1f}–{max(ov):.1f} s per run (median {statistics.median(ov):.1f} s)" in docs
    hits = [m.prefix_cache_hit_rate for n in range(8) for m in t[n].measurements]
    assert f"0–{max(hits):.1%} (median {statistics.median(hits):.2%}; {sum(h > 0.01 for h in hits)} of " \
           f"{len(hits)} levels over 1%)" in docs


def test_the_stalled_first_run_was_measured_again(recorded) -> None:
    m = next(m for m in recorded["trials"][0].measurements if m.concurrency == 70)
    got = m.raw["stall_remeasured"]
    assert "stall-remeasured" in m.flags and got["kept"] == "rerun"
    assert f"paused {got['first_pause_s']:.2f} s" in recorded["docs"]
    assert f"re-run paused {got['rerun_pause_s']:.2f} s" in recorded["docs"]


def test_the_answer_is_trial_4_in_every_line(recorded) -> None:
    t = recorded["trials"]
    best = (R7 / "best.txt").read_text()
    four, again = t[4].objectives["throughput_per_gpu"], t[6].objectives["throughput_per_gpu"]
    base = [t[0].objectives["throughput_per_gpu"], t[7].objectives["throughput_per_gpu"]]
    assert f"measured 2× on fresh deploys: {four:,.1f} / {again:,.1f}" in best
    assert f"vs vLLM's defaults (trial 0, {statistics.fmean(base):,.1f} over 2 run(s)): trial 4 is " \
           f"{statistics.fmean([four, again]) / statistics.fmean(base):.2f}×" in best
    assert f"(range {min(four, again) / max(base):.2f}–{max(four, again) / min(base):.2f}×): a gain" in best
    assert min(four, again) > max(base)  # a gain, not a tie: the ranges do not overlap
    lines = [ln for ln in best.splitlines() if ln.startswith(("best:", "run to run:", "vs vLLM", "whole cluster"))]
    assert len(lines) == 4 and all("trial 4" in ln for ln in lines)
    assert all(f"{b:,.0f}" in recorded["docs"] for b in base)


def test_the_held_out_errors_are_the_docs(recorded) -> None:
    docs = recorded["docs"]
    steady = json.loads((R7 / "heldout.json").read_text())
    sent = json.loads((R7 / "heldout-as-sent.json").read_text())
    assert steady["study"] == sent["study"] == STUDY and (steady["levels"], sent["levels"]) == ("steady", "as sent")
    under, every = steady["pooled_under_knee"], steady["pooled"]
    assert under["profile"]["n"] == 70 and every["profile"]["n"] == 115
    assert f"**{under['profile']['median']:.1%} with the profile, {under['defaults']['median']:.1%} with the " \
           f"defaults** (as sent: {sent['pooled_under_knee']['profile']['median']:.1%} / " \
           f"{sent['pooled_under_knee']['defaults']['median']:.1%}); all 23 levels " \
           f"{every['profile']['median']:.1%} / {every['defaults']['median']:.1%}" in docs
    p = under["profile"]
    assert f"tok/s/GPU {p['throughput_per_gpu']:.1%}, P90 tok/s/user {p['p90_tokens_per_s_per_user']:.1%}, P50 TPOT " \
           f"{p['p50_tpot_ms']:.1%}, P50 TTFT {p['p50_ttft_ms']:.1%}, P90 TTFT {p['p90_ttft_ms']:.1%}" in docs


def _row(steady: dict, sent: dict) -> str:
    s, a = steady["pooled_under_knee"], sent["pooled_under_knee"]
    return (f"| {s['profile']['median']:.1%} | {a['profile']['median']:.1%} | {s['stall-rule']['median']:.1%} | "
            f"**{a['stall-rule']['median']:.1%}** | {s['defaults']['median']:.1%} / {a['defaults']['median']:.1%} |")


def test_the_stall_rule_refit_is_the_docs_table() -> None:
    docs = written_record()
    sets = {"r4": [STALL_RULE / "heldout-r4.json", STALL_RULE / "heldout-r4-as-sent.json"],
            "r6": [STALL_RULE / "heldout-r6.json", STALL_RULE / "heldout-r6-as-sent.json"],
            "r7": [R7 / "heldout.json", R7 / "heldout-as-sent.json"]}
    fitted = "research/results/profile1-stall-rule/profile1-refit-as-sent-no-stall.json"
    for name, (a, b) in sets.items():
        steady, sent = json.loads(a.read_text()), json.loads(b.read_text())
        line = next(ln for ln in docs.splitlines() if ln.startswith(f"  | {name} ("))
        assert line.endswith(_row(steady, sent)), (name, line)
        assert sent["pooled_under_knee"]["stall-rule"]["median"] <= 0.20  # issue 29's bar, as sent
    report = json.loads((STALL_RULE / "profile1-refit-as-sent-no-stall.report.json").read_text())
    assert report["dropped"] == ["L3/decode/2048/c256"] and report["level_model"] == "as sent"
    assert f"cross-validated\n  by probe {report['error_after']['held_out']['overall']:.1%}, in sample " \
           f"{report['error_after']['in_sample']['overall']:.1%}" in docs
    assert (ROOT / fitted).exists()


def test_the_one_stalled_probe_of_profile_1(tmp_path: Path) -> None:
    """The stall detector over profile #1's 16 probe runs (14 levels and their warm-ups' folders) flags one level:
    depth 3, decode, c = 256 — the level the refit leaves out."""
    with tarfile.open(raw_or_skip(RESULTS / "h200-study-30b" / "raw.tar.xz")) as tar:
        tar.extractall(tmp_path, filter="data")
    runs = tmp_path / "da-runs" / "h200-study-30b-profile"
    stalled = []
    for f in sorted(runs.glob("*/bench/c*.json")):
        depth = "L3" if "profile-models/d9763b2a9bd0dfad-L3" in (f.parent.parent / "mixed-0.log").read_text() else "L12"
        got = stall_of(json.loads(f.read_text()))
        if got is not None and got["stalled"]:
            stalled.append((depth, f.stem, round(got["longest_pause_s"], 2)))
    assert stalled == [("L3", "c256", 1.46)]
    committed = json.loads((STALL_RULE / "stalls-profile1.json").read_text())
    assert committed["summary"]["levels"]["stalled"] == 1
    assert "paused 1.46 s (303× its reference gap)" in written_record()


def test_the_gaps_between_tokens_of_r6s_baseline(tmp_path: Path) -> None:
    with tarfile.open(raw_or_skip(RESULTS / "h200-study-30b-r6" / "raw.tar.xz")) as tar:
        names = [n for n in tar.getnames() if "20261205-104223-fa6e24/bench/c" in n and n.endswith(("c70.json",
                                                                                                     "c81.json",
                                                                                                     "c93.json"))]
        tar.extractall(tmp_path, members=[tar.getmember(n) for n in names], filter="data")
    rows = [itl_modes.modes(json.loads((tmp_path / n).read_text())) for n in sorted(names)]
    committed = json.loads((RESULTS / "h200-study-30b-r6" / "itl_modes_baseline.json").read_text())["levels"]
    assert [r["prompts_per_prefill_step"] for r in rows] == \
        [v["prompts_per_prefill_step"] for _, v in sorted(committed.items())]
    docs = written_record()
    lo = min(r["prompts_per_prefill_step"] for r in rows)
    hi = max(r["prompts_per_prefill_step"] for r in rows)
    assert lo > 2 and f"**a prefill step carried {lo:.1f}–{hi:.1f} prompts on average**" in docs
    assert all(r["short_median_ms"] < 25 and r["long_median_ms"] > 60 for r in rows)
