"""The tenth H200 session's study (r6: the baseline, 5 search trials, the repeat of the best, the baseline's repeat
stopped by SIGTERM) says what docs/benchmarks.md says.

The device's database and bench JSONs are committed inside ``research/results/h200-study-30b-r6/raw.tar.xz``;
this test unpacks them, reads the study back through the project's own queries and re-derives the trial times,
the levels in the order they ran, the interrupted trial, the two close calls whose second run stalled (from the
bench JSONs themselves), the replay without those stalled runs and the held-out errors the docs quote.
"""

from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path

import pytest

from executors.measuring import bench
from executors.measuring.bench_result import stall_of
from research.tests.gpu_records import ROOT, raw_or_skip, recorded_study, written_record
from search_spaces import TrialState

RESULTS = ROOT / "research" / "results" / "h200-study-30b-r6"
STUDY = "h200-study-30b-r6"
MARKS = {"stall-remeasured": " S", "remeasured": " R"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("h200-r6")
    r = recorded_study(RESULTS, STUDY, out)
    r["out"] = out
    return r


def _in_order(trial):
    return sorted(trial.measurements, key=lambda m: str(m.raw["date"]))


def _label(m) -> str:
    pooled_stall = "stalled" in m.flags and "stall-remeasured" not in m.flags
    return f"{m.concurrency:g}" + "".join(v for k, v in MARKS.items() if k in m.flags) + ("!" if pooled_stall else "")


def test_the_trials_their_times_and_levels_are_the_docs(recorded) -> None:
    t, docs = recorded["trials"], recorded["docs"]
    assert [t[n].proposer for n in range(8)] == ["baseline", "model", "sampler", "sampler", "sampler", "model",
                                                 "repeat", "repeat"]
    assert all(t[n].state is TrialState.COMPLETE for n in range(7)) and (t[6].repeat_of, t[7].repeat_of) == (2, 0)
    total = [t[n].deploy_s + t[n].warmup_s + t[n].measure_s + t[n].teardown_s for n in range(8)]
    for n in range(8):
        assert f"| {t[n].warmup_s:.1f} | {t[n].measure_s:.1f} | {total[n]:.0f} s | " \
            + ", ".join(_label(m) for m in _in_order(t[n])) + " |" in docs
        assert f"| {t[n].deploy_s:.1f}" in docs
        assert all("short" not in m.flags for m in t[n].measurements)
    med = statistics.median(total)
    assert f"**Median trial {med / 60:.1f} minutes** ({med:.0f} s over the eight; the eight {sum(total):,.0f} s" in docs
    counts = [len(t[n].measurements) for n in range(7)]
    listed = ", ".join(map(str, counts))
    assert f"Levels per knee: {listed} (and {len(t[7].measurements)} in the interrupted" in docs
    assert sum(c > 4 for c in counts) == 1 and counts[1] == 5
    for n in range(7):
        knee = next(m for m in t[n].measurements if m.purpose == "knee")
        assert f"c = {knee.concurrency:g}, {knee.throughput_per_gpu:,.0f}" in docs
    ov = [(m.raw["bench_wall_s"] - m.raw["duration"]) / m.raw.get("pooled_runs", 1)
          for n in range(8) for m in t[n].measurements]
    assert f"1.6–3.1 s per run\n  (median {statistics.median(ov):.1f} s" in docs and 1.6 <= min(ov) and max(ov) < 3.15
    hits = [m.prefix_cache_hit_rate for n in range(8) for m in t[n].measurements]
    assert f"0–{max(hits):.1%} (median {statistics.median(hits):.2%})" in docs and min(hits) == 0


def test_the_repeat_stopped_by_sigterm_kept_its_levels(recorded) -> None:
    last = recorded["trials"][7]
    assert last.state is TrialState.INTERRUPTED and "SIGTERM" in (last.reason or "")
    assert len(last.measurements) == 3 and not any(m.purpose == "knee" for m in last.measurements)
    assert f"{len(last.measurements)} level(s) measured before it kept" in last.reason
    assert f"the repeat of the baseline, {last.deploy_s + last.warmup_s + last.measure_s + last.teardown_s:.0f} s in" \
        in recorded["docs"]


def _p90_speed(path: Path, c: int) -> float:
    return bench.parse_result(json.loads(path.read_text()), concurrency=c, gpus=1).p90_tokens_per_s_per_user


def test_the_close_calls_whose_second_run_stalled(recorded) -> None:
    """What the docs say of c = 93 (baseline) and c = 99 (trial 1), from the bench JSONs: a clean first run, a second
    run that paused, and the pooled level in the database."""
    t, docs, out = recorded["trials"], recorded["docs"], recorded["out"]
    for n, c in ((0, 93), (1, 99)):
        pooled = next(m for m in t[n].measurements if m.concurrency == c)
        assert {"stalled", "remeasured"} <= set(pooled.flags) and "stall-remeasured" not in pooled.flags
        folder = out / "da-runs" / "h200-study-30b" / Path(t[n].resources["run_dir"]).name / "bench"
        first, second = folder / f"c{c}.json", folder / f"c{c}-2.json"
        s1, s2 = stall_of(json.loads(first.read_text())), stall_of(json.loads(second.read_text()))
        assert s1 is not None and s2 is not None and not s1["stalled"] and s2["stalled"]
        assert f"paused {s2['longest_pause_s']:.2f} s" in docs
        clean, stalled = _p90_speed(first, c), _p90_speed(second, c)
        assert stalled < pooled.p90_tokens_per_s_per_user < clean
        assert f"{clean:.1f}" in docs and f"{stalled:.1f}" in docs and f"{pooled.p90_tokens_per_s_per_user:.1f}" in docs
        assert (clean >= 30) == (c == 93)  # c = 93 met the bound clean; c = 99 fails clean too, by less


def test_replayed_without_the_stalled_runs_trial_1_takes_three_levels(recorded) -> None:
    from research import knee_replay

    out = recorded["out"]
    rows = knee_replay.replay(str(ROOT / "research/gpu/h200-study-30b.yaml"), str(out / "da-gpu/results.db"), STUDY,
                              reparse=str(out / "da-runs"))
    by = {r["trial"]: r for r in rows}
    assert [c for c, _ in by[1]["real"]] == [99, 39, 67, 77, 87]
    assert [c for c, _ in by[1]["replay"]] == [99, 77, 87] and by[1]["replay_knee"] == 87
    assert "trial 1 99− 77+ 87+, **5 → 3**" in recorded["docs"]
    committed = json.loads((RESULTS / "knee_replay_close_call_stalls.json").read_text())
    assert [r["replay"] for r in committed["trials"]] == [r["replay"] for r in rows]


def test_the_held_out_errors_are_the_docs(recorded) -> None:
    docs = recorded["docs"]
    steady = json.loads((RESULTS / "heldout.json").read_text())
    sent = json.loads((RESULTS / "heldout-as-sent.json").read_text())
    assert steady["study"] == sent["study"] == STUDY and (steady["levels"], sent["levels"]) == ("steady", "as sent")
    under, every = steady["pooled_under_knee"], steady["pooled"]
    assert under["profile"]["n"] == 70 and every["profile"]["n"] == 135
    assert f"over 70 values **{under['profile']['median']:.1%} with the profile, {under['defaults']['median']:.1%} " \
           f"with the defaults** (as sent: {sent['pooled_under_knee']['profile']['median']:.1%} / " \
           f"{sent['pooled_under_knee']['defaults']['median']:.1%}); all 27 levels {every['profile']['median']:.1%}\n" \
           f"  / {every['defaults']['median']:.1%}" in docs
    p = under["profile"]
    assert f"tok/s/GPU {p['throughput_per_gpu']:.1%}, P90 tok/s/user {p['p90_tokens_per_s_per_user']:.1%}, P50 TPOT " \
           f"{p['p50_tpot_ms']:.1%}, P50 TTFT {p['p50_ttft_ms']:.1%}, P90 TTFT {p['p90_ttft_ms']:.1%}" in docs
    assert under["profile"]["median"] > 0.20  # issue 29's bar is not met on these levels, and the docs say so


def test_the_raw_tarball_holds_every_bench_json() -> None:
    with tarfile.open(raw_or_skip(RESULTS / "raw.tar.xz")) as tar:
        names = tar.getnames()
    assert "da-gpu/results.db" in names
    assert sum(n.endswith(".json") and "/bench/c" in n for n in names) >= 27


def test_no_fit_of_the_profile_meets_twenty_percent_on_these_levels() -> None:
    """The refits of profile #1's probes held to r6 (docs: "No view and no fit … meets issue 29's 20%")."""
    docs = written_record()
    steady = json.loads((RESULTS / "heldout-refits.json").read_text())["pooled_under_knee"]
    sent = json.loads((RESULTS / "heldout-refits-as-sent.json").read_text())["pooled_under_knee"]
    both = steady["steadyfit"]["median"], sent["steadyfit"]["median"]
    assert f"the steady refit {both[0]:.1%} (as sent\n  {both[1]:.1%})" in docs
    assert f"the as-sent refit {steady['asfit']['median']:.1%} (as sent {sent['asfit']['median']:.1%}" in docs
    best = min(v["median"] for d in (steady, sent) for v in d.values())
    assert 0.20 < best and f"the closest are {best:.1%}" in docs
