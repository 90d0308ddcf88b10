"""One answer, never worse than what was measured (issue 30), at one operating point (issue 33).

Studies are built from real database rows as a real study (Ray executor) writes them: vLLM's defaults measured
first (proposer "baseline"), the search, then repeats of the best and of the defaults (``repeat_of``); every
trial's objective is ``advisor.objectives.score`` of its levels, as the tuner records it. The shape of the first
study is the one seen on the GPU: the defaults are the best measured deployment, and one search trial measured
more throughput at a level below its knee (the model's non-monotonic curve, issue 33) than at the knee its
objective comes from — so a "best level anywhere" answer names the wrong trial at the wrong level.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import db
from advisor import api
from advisor.baseline import baseline_config
from advisor.cli import app
from advisor.job import TuningJob, job_from_dict
from advisor.objectives import operating_point, score
from db import queries
from executors import place
from search_spaces import DeploymentConfig, Measurement, TrialState
from tests.test_ui_apptest import _run, _texts
from ui import advice, common, data

X = "throughput_per_gpu"
SLOS = [{"metric": "p90_tokens_per_s_per_user", "op": ">=", "value": 30},
        {"metric": "p90_ttft_ms", "op": "<=", "value": 2000}]
#: A level: (concurrency, tok/s/GPU, P90 tok/s/user, purpose). Below 30 tok/s/user a level misses the SLO.
Level = tuple[int, float, float, str]


def _job(name: str) -> TuningJob:
    return job_from_dict({"name": name, "preset": "h200-qwen3-235b", "executor": {"kind": "ray"}, "slos": SLOS})


def _levels(cfg_gpus: int, levels: list[Level]) -> list[Measurement]:
    return [Measurement(concurrency=c, source="measured", gpus=cfg_gpus, num_requests=4 * c, completed=4 * c,
                        throughput_per_gpu=x, p90_tokens_per_s_per_user=y, p90_ttft_ms=900.0, error_rate=0.0,
                        purpose=purpose) for c, x, y, purpose in levels]


def _search_config(job: TuningJob) -> DeploymentConfig:
    base = baseline_config(job)
    assert base is not None
    return base.model_copy(update={"decode": base.decode.model_copy(update={"data_parallel_size": 8})})


def _study(url: str, name: str, trials: list[tuple[str, int | None, list[Level]]]) -> TuningJob:
    """``trials``: (proposer, repeat_of, levels) numbered from 0; "baseline" and its repeats run vLLM's defaults
    (4 GPUs), the others the search's DEP8 (8 GPUs). Each trial's prediction is stored as the tuner stores it."""
    job = _job(name)
    database = db.connect(url)
    try:
        database.upsert_study(name, job.to_document(), executor="ray", hardware=job.cluster.describe())
        base = {n for n, (by, _, _) in enumerate(trials) if by == "baseline"}
        for number, (proposer, repeat_of, levels) in enumerate(trials):
            cfg = baseline_config(job) if number in base or repeat_of in base else _search_config(job)
            topo = place(cfg, job.cluster)
            ms = _levels(cfg.total_gpus, levels)
            outcome = score(job, ms)
            tid = database.start_trial(name, number, params={}, config=cfg, topology=topo.to_dict(),
                                       proposer=proposer, repeat_of=repeat_of, predicted={X: 15_000.0},
                                       baseline=number in base)
            database.finish_trial(tid, TrialState.COMPLETE, measurements=ms, objectives=outcome.as_dict(job),
                                  violation=outcome.violation, executed=True)
    finally:
        database.close()
    return job


DEFAULTS_BEST = "defaults-best"
TIE = "tie"
#: vLLM's defaults: knee c=64 at 20,224 tok/s/GPU (a level below it made 20,400); the search's trial 1: knee
#: c=20 at 14,587, though c=16 made 20,500 — more than any level of the defaults, and not its operating point.
DEFAULTS_BEST_TRIALS: list[tuple[str, int | None, list[Level]]] = [
    ("baseline", None, [(48, 20_400.0, 36.0, "search"), (64, 20_224.0, 31.0, "knee"), (96, 23_000.0, 25.0, "search")]),
    ("model", None, [(16, 20_500.0, 40.0, "search"), (20, 14_587.0, 35.0, "knee"), (23, 15_000.0, 28.0, "search")]),
    ("repeat", 1, [(20, 14_400.0, 35.0, "knee"), (23, 15_100.0, 28.0, "search")]),
    ("repeat", 0, [(64, 20_100.0, 31.0, "knee"), (96, 23_100.0, 25.0, "search")]),
]
#: The search's best (trial 1: 10,400 and 10,900) has the higher mean, but its runs overlap those of the
#: defaults (10,000 and 10,600): a tie, so the defaults stay the answer.
TIE_TRIALS: list[tuple[str, int | None, list[Level]]] = [
    ("baseline", None, [(32, 10_000.0, 35.0, "knee"), (48, 12_000.0, 20.0, "search")]),
    ("sampler", None, [(32, 10_400.0, 35.0, "knee"), (48, 12_500.0, 20.0, "search")]),
    ("sampler", None, [(16, 9_000.0, 40.0, "knee"), (24, 9_500.0, 20.0, "search")]),
    ("repeat", 1, [(32, 10_900.0, 35.0, "knee")]),
    ("repeat", 0, [(32, 10_600.0, 35.0, "knee")]),
]


ONCE = "once"
#: The 4 Dec H200 study stopped before its repeats: the defaults and the search's best measured once each.
ONCE_TRIALS: list[tuple[str, int | None, list[Level]]] = [
    ("baseline", None, [(61, 17_462.0, 33.8, "knee"), (70, 17_622.0, 25.9, "search")]),
    ("sampler", None, [(70, 19_966.0, 32.0, "knee"), (81, 21_471.0, 29.8, "search")]),
]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    u = f"sqlite:///{tmp_path_factory.mktemp('answer') / 'advisor.db'}"
    _study(u, DEFAULTS_BEST, DEFAULTS_BEST_TRIALS)
    _study(u, TIE, TIE_TRIALS)
    _study(u, ONCE, ONCE_TRIALS)
    return u


def _best(url: str, study: str) -> list[str]:
    res = CliRunner().invoke(app, ["best", study, "--storage", url], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    return res.output.splitlines()


def test_defaults_best_every_line_of_advisor_best_names_them(url: str) -> None:
    out = _best(url, DEFAULTS_BEST)
    rows = [ln for ln in out if ln.startswith("│")]
    assert len(rows) == 1 and rows[0].split("│")[1].strip() == "0" and "c=64" in rows[0] and "20,224" in rows[0]
    best = next(ln for ln in out if ln.startswith("best:"))
    assert best.startswith("best: trial 0 (vLLM's defaults, the best measured deployment) at c=64:"), best
    notes = api.best_report(url, DEFAULTS_BEST).notes
    flat = " ".join(" ".join(out).split())  # the console folds long lines at spaces (keeping them at line ends)
    assert all(line in flat for line in notes), (notes, out)
    ours = [ln for ln in notes if not ln.startswith("found by:")]  # which proposer found it: not the verdict's
    assert [ln.split(":")[0] for ln in ours] == ["run to run", "vLLM's defaults (trial 0) are the best measured "
                                                 "deployment", "whole cluster", "performance model"], notes
    for line in ours:  # every line speaks of the defaults' trial, none of the search's as the answer
        assert "trial 0" in line, line
    assert "run to run: trial 0 (vLLM's defaults, the answer) measured 2× on fresh deploys: 20,224.0 @ c=64 / " \
        "20,100.0 @ c=64" in notes[0]
    # the margin: the search's best (14,587 / 14,400) against the defaults (20,224 / 20,100)
    assert "the search's best, trial 1, is 0.72× the defaults, mean over mean — trial 1's 2 runs 14,587.0 (trial 1 " \
        in notes[1] and "mean 14,493.5; the defaults' 2 runs 20,224.0 (trial 0 @ c=64)" in notes[1]
    assert notes[1].endswith("mean 20,162.0 throughput_per_gpu; run against run 0.71–0.73×: a loss"), notes[1]
    # 4 copies of the defaults' 4 GPUs on 16 GPUs, at the defaults' mean — not the search's 14,587 × 8 × 2
    assert notes[2] == f"whole cluster: 4 copies of trial 0's 4 GPU(s) fit 16 GPUs: {4 * 4 * 20_162.0:,.0f} tok/s " \
        "for the cluster at the SLOs"
    assert "trial 0 was predicted at 15,000.0, measured 20,224.0" in notes[3]


def test_defaults_best_export_studies_and_dashboard_agree(url: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    paths = api.export(url, DEFAULTS_BEST, fmt="json", trial=None, out=tmp_path / "e", model="m")
    doc = json.loads(paths[0].read_text())
    assert doc["evidence"]["trial"] == 0
    cols, rows = api.studies_table(url)
    row = dict(zip(cols, next(r for r in rows if r[0] == DEFAULTS_BEST), strict=True))
    assert row["best trial"] == 0 and row["best"] == "20,162.0 throughput_per_gpu (mean of 2 runs)"
    monkeypatch.setenv("ADVISOR_STORAGE", url)
    monkeypatch.setenv("ADVISOR_UI_RUN_DIR", str(tmp_path / "runs"))
    at = _run("views/study.py", study=DEFAULTS_BEST)
    heads = [m.value for m in at.markdown if m.value.startswith("#### Run trial")]
    assert heads == ["#### Run trial 0 (vLLM’s defaults): agg DEP4 s1024 b8k"], heads
    text = _texts(at)
    line = next(n for n in api.best_report(url, DEFAULTS_BEST).notes if n.startswith("vLLM's defaults (trial 0)"))
    assert f"**vLLM's defaults stay the answer** — {common.plain(line)}" in text  # `advisor best`'s own words
    assert "**20,224 tok/s/GPU @ c=64, 31.0 tok/s/user** on **4 GPUs** (its first run)" in text
    assert "**Best under the SLOs so far:** trial 0, 20,224 tok/s/GPU @ c=64, 31.0 tok/s/user" in text
    assert "vLLM's defaults (trial 0) are the best measured deployment" in text
    studies = _run()
    table = next(d.value for d in studies.dataframe if "best trial" in d.value.columns)
    mine = table[table["study"] == DEFAULTS_BEST].iloc[0]
    assert mine["best trial"] == 0 and mine["best"] == row["best"]  # the mean of the runs, as `advisor studies`


def test_a_tie_within_the_spread_is_called_a_tie_and_keeps_the_defaults(url: str) -> None:
    out = _best(url, TIE)
    best = next(ln for ln in out if ln.startswith("best:"))
    assert best.startswith("best: trial 0 (vLLM's defaults, the best measured deployment) at c=32:"), best
    notes = api.best_report(url, TIE).notes  # the lines `advisor best` prints (unfolded)
    line = next(n for n in notes if n.startswith("vLLM's defaults (trial 0) are the best measured deployment: no "
                                                 "searched deployment beats every run of theirs; the search's best, "
                                                 "trial 1, is 1.03× the defaults, mean over mean"))
    assert "mean 10,650.0;" in line and "mean 10,300.0 throughput_per_gpu" in line
    assert line.endswith("run against run 0.98–1.09×: a tie (within the run-to-run spread)"), line
    assert api.answer(url, TIE).trial == 0


def test_the_answer_is_one_operating_point_everywhere(url: str, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """The best table, the trial's objective (what the tuner's progress bar shows) and the dashboard show the
    level the objective came from — the knee, c=64 — not a better-looking level of the same or another trial."""
    database = db.connect(url)
    try:
        job = api.job_of_study(database, DEFAULTS_BEST)
        first = queries.get_trial(database, DEFAULTS_BEST, 0)
    finally:
        database.close()
    point, _ = operating_point(job, list(first.measurements))
    assert (point.concurrency, point.throughput_per_gpu) == (64, first.objectives[X]) == (64, 20_224.0)
    rep = api.best_report(url, DEFAULTS_BEST)
    assert [rep.rows[0][i] for i in (0, 1, 2)] == [0, point.label(), first.objectives[X]]
    monkeypatch.setenv("ADVISOR_STORAGE", url)
    info = data.study(url, DEFAULTS_BEST)
    levels = data.levels(url, DEFAULTS_BEST, info.stamp, X, info.y_metric)
    trials_df, _ = data.trials(url, DEFAULTS_BEST, info.stamp)
    rec = advice.recommend(levels, trials_df, info.slos, X, info.y_metric,
                           chosen=data.chosen(url, DEFAULTS_BEST, info.stamp))
    assert (rec.best.trial, rec.best.concurrency, rec.best.x) == (0, 64, 20_224.0)


def test_rank_deployments_keeps_the_defaults_unless_beaten() -> None:
    from db.queries import RunRow, rank_deployments

    def rows(*runs: tuple[int, str, float, int | None]) -> list[RunRow]:
        return [RunRow(n, "complete", {"m": v}, 0.0, by, rep, baseline=by == "baseline") for n, by, v, rep in runs]

    # a search trial beats the defaults: every run above every run of theirs
    beaten = rows((0, "baseline", 100.0, None), (1, "sampler", 120.0, None), (2, "repeat", 118.0, 1),
                  (3, "repeat", 101.0, 0))
    assert [(r.trial, r.values) for r in rank_deployments(beaten, "m")] == [(1, [120.0, 118.0]), (0, [100.0, 101.0])]
    # overlapping runs: the defaults lead though the search's mean is higher
    tied = rows((0, "baseline", 100.0, None), (1, "sampler", 110.0, None), (2, "repeat", 99.0, 1))
    assert [r.trial for r in rank_deployments(tied, "m")] == [0, 1]
    # a latency objective: less is better; reused trials, infeasible and failed ones are not runs
    lat = [*rows((0, "baseline", 50.0, None), (1, "sampler", 40.0, None)),
           RunRow(2, "complete", {"m_ms": 1.0}, 0.0, "sampler", None, reused_from=1),
           RunRow(3, "complete", {"m_ms": 1.0}, 0.5, "sampler"), RunRow(4, "failed", {"m_ms": 1.0}, 1.0, "sampler")]
    lat = [r._replace(objectives={"m_ms": (r.objectives or {}).get("m", (r.objectives or {}).get("m_ms"))})
           for r in lat]
    assert [r.trial for r in rank_deployments(lat, "m_ms")] == [1, 0]


def test_a_margin_on_single_runs_says_its_spread_is_not_known(url: str) -> None:
    """One run of each has a range of one value: the word stays, with what it rests on (issue 30: a gain is
    stated with its spread)."""
    notes = api.best_report(url, ONCE).notes
    assert "vs vLLM's defaults (trial 0): trial 1 is 1.14× the defaults, mean over mean — trial 1's 1 run 19,966.0 (trial 1 " \
        "@ c=70); the defaults' 1 run 17,462.0 (trial 0 @ c=61) throughput_per_gpu; run against run 1.14–1.14×: a " \
        "gain (trial 1 and trial 0 measured once: the spread is not known)" in notes, notes
    # with repeats on both sides nothing is added (the defaults-best study above)
    assert not any("measured once" in line for line in api.best_report(url, DEFAULTS_BEST).notes)
