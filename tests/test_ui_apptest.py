"""The dashboard's pages, driven headlessly by Streamlit's AppTest: empty states, filters, read-only mode,
starting a study; plus the pure parts (figures, filters, settings) and `advisor dashboard`'s bad input.

A real simulated study fills the database once per module; every page run asserts ``not at.exception``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import db
from advisor import api
from advisor.errors import BadInput
from advisor.exports import FORMATS
from advisor.job import TuningJob, job_from_dict
from advisor.tune import EXECUTED_ATTR, STATE_ATTR, tune
from db import queries
from search_spaces import Measurement, TrialState
from ui import advice, common, data, importance, jobs, plots, tables, trial_plots
from ui.settings import settings

APP = str(Path(__file__).resolve().parent.parent / "ui" / "app.py")
STUDY = "ui-at"
OTHER = "ui-at-other"
FAILED_TRIAL = 900
BASELINE_TRIAL = 800


def _fill(url: str) -> None:
    """A small real study (simulated executor) plus one failed trial with a reason and a log tail, vLLM's
    defaults measured as a baseline trial (as a real study does first), and a second study of another job."""
    job = job_from_dict({"name": STUDY, "preset": "h200-qwen3-235b", "budget": {"trials": 8},
                         "objective": {"mode": "pareto"}})
    tune(job, storage=url)
    database = db.connect(url)
    try:
        tid = database.start_trial(STUDY, FAILED_TRIAL, params={"mode": "aggregated"})
        database.finish_trial(tid, TrialState.FAILED, failure_kind="deploy_failed", reason="engine died: CUDA OOM",
                              log_tail="loading weights\nRuntimeError: CUDA error: out of memory\n", executed=True)
        add_baseline(database, job, BASELINE_TRIAL)
    finally:
        database.close()
    tune(job_from_dict({"name": OTHER, "preset": "h200-qwen3-235b", "budget": {"trials": 5},
                        "objective": {"mode": "pareto"}, "sampler": {"seed": 7}}), storage=url)


def add_baseline(database: db.Database, job: TuningJob, number: int) -> None:
    """vLLM's defaults (``advisor.baseline``) predicted by the simulated executor and recorded as the tuner
    records a baseline trial (proposer "baseline"); the simulated executor itself measures none."""
    from advisor.baseline import baseline_config
    from advisor.objectives import score
    from executors import place
    from executors.simulated.executor import SimulatedExecutor, default_params

    cfg = baseline_config(job)
    topo = place(cfg, job.cluster)
    run = SimulatedExecutor(job.model_profile(), default_params(job.cluster.gpu)).evaluate(topo, job.workload)
    outcome = score(job, run.measurements)
    tid = database.start_trial(job.name, number, params={}, config=cfg, topology=topo.to_dict(), proposer="baseline",
                               baseline=True)
    database.finish_trial(tid, TrialState.COMPLETE, measurements=run.measurements, objectives=outcome.as_dict(job),
                          violation=outcome.violation, executed=True)


ROUTED = "ui-at-routed"
ROUTED_BASELINE = 0


def _record(database: db.Database, job: TuningJob, number: int, cfg, proposer: str,  # noqa: ANN001 — a config
            routing: str | None) -> None:
    """One trial of ``cfg`` predicted by the simulated executor, each level stored with ``routing`` as the
    real executors store what the servers routed with (``Measurement.expert_routing``)."""
    from advisor.objectives import score
    from executors import place
    from executors.simulated.executor import SimulatedExecutor, default_params

    topo = place(cfg, job.cluster)
    run = SimulatedExecutor(job.model_profile(), default_params(job.cluster.gpu)).evaluate(topo, job.workload)
    levels = [m.model_copy(update={"expert_routing": routing}) for m in run.measurements]
    outcome = score(job, levels)
    tid = database.start_trial(job.name, number, params={}, config=cfg, topology=topo.to_dict(), proposer=proposer,
                               baseline=proposer == "baseline")
    database.finish_trial(tid, TrialState.COMPLETE, measurements=levels, objectives=outcome.as_dict(job),
                          violation=outcome.violation, executed=True)


def _fill_routed(url: str) -> None:
    """A study measured under simulated expert routing (``zipf 1.1`` stored with every level, as a real study
    with ``workload.expert_routing: zipf 1.1`` stores it) whose SLO vLLM's defaults meet: its baseline trial
    (proposer "baseline", as ``advisor.tune`` records it) and two searched deployments."""
    import optuna

    from advisor.baseline import baseline_config
    from search_spaces import check

    job = job_from_dict({"name": ROUTED, "preset": "h200-qwen3-235b", "objective": {"mode": "pareto"},
                         "workload": {"expert_routing": "zipf 1.1", "load_levels": [32, 128]},
                         "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 100000}]})
    database = db.connect(url)
    try:
        database.upsert_study(ROUTED, job.to_document(), executor="local", hardware=job.cluster.describe())
        base = baseline_config(job)
        _record(database, job, ROUTED_BASELINE, base, "baseline", "zipf 1.1")
        search = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
        number = ROUTED_BASELINE + 1
        while number < 4:
            cfg = job.space.suggest(search.ask())
            if cfg.key() != base.key() and not check(cfg, job.model_profile(), job.cluster, job.workload.max_model_len):
                _record(database, job, number, cfg, "sampler", "zipf 1.1")
                number += 1
    finally:
        database.close()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    u = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'advisor.db'}"
    _fill(u)
    _fill_routed(u)
    return u


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str) -> Path:
    """The dashboard's settings for one test: the filled database, read-only, a run folder of its own."""
    monkeypatch.setenv("ADVISOR_STORAGE", url)
    monkeypatch.delenv("ADVISOR_ALLOW_NEW_STUDIES", raising=False)
    monkeypatch.setenv("ADVISOR_UI_RUN_DIR", str(tmp_path / "runs"))
    return tmp_path


def _run(page: str | None = None, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if page:
        at.switch_page(page)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _texts(at: AppTest) -> str:
    parts = [e.value for kind in ("title", "subheader", "caption", "markdown", "info", "warning", "error", "success",
                                  "code") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def _df(at: AppTest, columns: set[str]):
    """The first dataframe whose columns include ``columns``."""
    for d in at.dataframe:
        if columns <= set(d.value.columns):
            return d.value
    raise AssertionError(f"no dataframe with columns {columns}")


# ---------------------------------------------------------------------------------------------- empty states


def test_missing_database_says_what_to_do_and_creates_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "none.db"
    monkeypatch.setenv("ADVISOR_STORAGE", f"sqlite:///{path}")
    for page in (None, "views/study.py", "views/trial.py", "views/compare.py"):
        at = _run(page)
        assert "No database at" in _texts(at)
        assert any("advisor tune" in c.value for c in at.code)
    assert not path.exists()


def test_empty_database_shows_the_tune_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    u = f"sqlite:///{tmp_path / 'empty.db'}"
    db.connect(u).close()
    monkeypatch.setenv("ADVISOR_STORAGE", u)
    at = _run()
    assert "No studies in" in _texts(at)
    assert any(c.value.startswith("advisor tune ") and u in c.value for c in at.code)
    assert not at.error


def test_unreachable_database_is_one_line_without_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVISOR_STORAGE", "postgresql://advisor:s3cret@127.0.0.1:1/none")
    at = _run()
    assert len(at.error) == 1
    assert "s3cret" not in at.error[0].value and "***" in at.error[0].value
    assert all("s3cret" not in c.value for c in at.caption)


# ---------------------------------------------------------------------------------------------- studies


def test_studies_page_lists_the_study_and_filters(env: Path, url: str) -> None:
    at = _run()
    table = _df(at, {"study", "state", "trials", "best", "best trial"})
    row = table[table["study"] == STUDY].iloc[0]
    # the counts and the best in the words `advisor studies` prints, cell for cell
    cols, rows = api.studies_table(url)
    cli = dict(zip(cols, next(r for r in rows if r[0] == STUDY), strict=True))
    assert (row["state"], row["trials"], row["best"], row["best trial"]) == \
        (cli["state"], cli["trials"], cli["best"], cli["best trial"])
    assert row["best trial"] == _best_level(url).trial_number
    assert row["state"] == "finished" and row["trials"].startswith("9 of 8 search trials run")  # + the failed one
    at.text_input(key="studies_filter").input("no-such-study").run()
    assert not at.exception
    assert any("No study matches" in i.value for i in at.info)
    at.text_input(key="studies_filter").input("").run()
    at.multiselect(key="studies_state").select("running").run()
    assert any("No study matches" in i.value for i in at.info)


# ---------------------------------------------------------------------------------------------- study


def _measured_points(url: str, x: str = "throughput_per_gpu", y: str = "p90_tokens_per_s_per_user") -> int:
    database = db.connect(url)
    try:
        return sum(1 for lv in queries.measurements(database, STUDY) if lv.metric(x) is not None
                   and lv.metric(y) is not None)
    finally:
        database.close()


def _best_level(url: str, study: str = STUDY) -> db.Best:
    """What `advisor best` recommends: the study's answer (``advisor.answer``) at its operating point."""
    from advisor import api

    answer = api.answer(url, study)
    assert answer is not None
    return db.Best(answer.first, answer.point)


def test_study_page_shows_every_point_failures_and_importance(env: Path, url: str) -> None:
    at = _run("views/study.py", study=STUDY)
    text = _texts(at)
    assert "whole cluster:" in text  # the verdict `advisor best` prints, under the progress panel
    assert "the best single run so far" in text  # Convergence: the open tab of a page opened without ?tab=
    assert "trial × load-level points" not in text and "Optuna's get_param_importances" not in text  # only it runs
    at = _run("views/study.py", study=STUDY, tab="Pareto front")
    assert f"{_measured_points(url)} trial × load-level points" in _texts(at)
    at = _run("views/study.py", study=STUDY, tab="Parameters")
    assert "Optuna's get_param_importances" in _texts(at)
    at = _run("views/study.py", study=STUDY, tab="Failures")
    fails = _df(at, {"trial", "state", "kind", "reason"})
    failed = fails[fails["trial"] == FAILED_TRIAL].iloc[0]
    assert failed["state"] == "failed" and "CUDA OOM" in failed["reason"]
    assert any("CUDA error" in c.value for c in at.code)  # the failed trial's log tail


def test_trial_table_filters_and_sorts(env: Path) -> None:
    at = _run("views/study.py", study=STUDY, tab="Trials")
    k = lambda w: common.key(STUDY, w)  # noqa: E731
    cols = {"trial", "state", "deployment", "throughput_per_gpu", "at c", "p90_tokens_per_s_per_user"}
    full = _df(at, cols)
    values = full["throughput_per_gpu"].dropna().tolist()
    assert values == sorted(values, reverse=True)  # a metric sorts best first without being asked
    assert at.selectbox(key=k("trials_sort")).value == "throughput_per_gpu"
    assert full["at c"].notna().sum() == full["throughput_per_gpu"].notna().sum()  # every number has its level
    at.multiselect(key=k("trials_states")).select("failed").run()
    assert not at.exception
    assert list(_df(at, cols)["trial"]) == [FAILED_TRIAL]
    at.multiselect(key=k("trials_states")).unselect("failed").run()
    at.selectbox(key=k("trials_sort")).select("trial").run()
    assert list(_df(at, cols)["trial"]) == sorted(full["trial"])  # the trial number sorts ascending
    at.selectbox(key=k("trials_sort")).select("throughput_per_gpu").run()
    at.checkbox(key=k("trials_feasible")).check().run()
    feasible = _df(at, cols)
    assert len(feasible) < len(full) and set(feasible["state"]) == {"complete"}
    word = full["deployment"].dropna().iloc[0].split()[0]
    at.checkbox(key=k("trials_feasible")).uncheck().run()
    at.text_input(key=k("trials_text")).input(word).run()
    assert all(word.lower() in d.lower() for d in _df(at, cols)["deployment"])


def test_recommendation_names_the_best_deployment_under_the_slos(env: Path, url: str) -> None:
    at = _run("views/study.py", study=STUDY)
    best = _best_level(url)
    heads = [m.value for m in at.markdown if m.value.startswith("#### Run trial")]
    assert heads and heads[0].startswith(f"#### Run trial {best.trial_number}:")
    text = _texts(at)
    point = (f"{advice.num(best.throughput_per_gpu)} tok/s/GPU @ c={best.concurrency}, "
             f"{advice.num(best.p90_tokens_per_s_per_user)} tok/s/user")
    assert point in text
    assert "P90 TTFT (ms):" in text and "headroom" in text  # a margin per SLO
    # vLLM's defaults (the baseline trial) reach no level meeting these SLOs in the performance model: said so,
    # and the two compared at a load both were measured at
    assert "vLLM's defaults (baseline trial 800) met every SLO at none of their measured loads" in text
    assert "At equal load this recommendation does better than vLLM's defaults" in text
    labels = {b.label for b in at.get("download_button")}
    assert {"Launch script", "Kubernetes", "Ray Serve"} <= labels
    # the reader's operating point: more tokens/s per user than the SLO asks
    faster = at.number_input(key=common.key(STUDY, "op_y"))
    faster.set_value(30.0).run()
    assert not at.exception
    heads = [m.value for m in at.markdown if m.value.startswith("#### Run trial")]
    text = _texts(at)
    if heads:
        n = int(heads[0].split()[3].rstrip(":"))
        assert n != best.trial_number or best.p90_tokens_per_s_per_user >= 30
    else:
        assert "No measured load level meets every SLO with P90 tok/s/user ≥ 30" in text


def test_recommendation_states_its_gain_over_vllms_defaults(env: Path, url: str) -> None:
    """A study whose baseline trial (vLLM's defaults) meets the SLOs: the page states the recommendation's gain
    over it — best x / baseline x at their own operating points, as ``advice.recommend`` computes it."""
    at = _run("views/study.py", study=ROUTED)
    info = data.study(url, ROUTED)
    x, y = info.x_metric, info.y_metric
    levels = data.levels(url, ROUTED, info.stamp, x, y)
    trials_df, _ = data.trials(url, ROUTED, info.stamp)
    rec = advice.recommend(levels, trials_df, info.slos, x, y)
    assert rec.baseline is not None and rec.baseline.trial == ROUTED_BASELINE and rec.gain is not None
    base = max((lv for lv in levels.to_dict("records") if lv["trial"] == ROUTED_BASELINE and lv["meets_slo"]),
               key=lambda lv: lv[x])
    assert rec.gain == pytest.approx(rec.best.x / base[x])
    text = _texts(at)
    # the gain is `advisor best`'s sentence, word for word (mean over mean of the runs, each run named)
    gain = api.verdict_of(url, ROUTED).gain
    assert gain is not None and gain.ratio == pytest.approx(rec.gain)  # one run each: the ratio of the levels
    assert f"**{gain.ratio:.2f}× vLLM's defaults** — {common.plain(gain.text())}" in text
    assert "This study measured no baseline" not in text and "reach no load level" not in text


def test_simulated_routing_is_shown_beside_the_numbers(env: Path, url: str) -> None:
    """Levels stored with a simulated expert routing say so on the recommendation and on the trial page, as
    `advisor best` does ("simulated routing: zipf 1.1 (N of N levels)"); a study of the real router does not."""
    at = _run("views/study.py", study=ROUTED)
    info = data.study(url, ROUTED)
    n = len(data.levels(url, ROUTED, info.stamp, info.x_metric, info.y_metric))
    assert n >= 8
    assert any(c.value.startswith(f"simulated routing: zipf 1.1 ({n} of {n} levels)") for c in at.caption), _texts(at)
    at = _run("views/trial.py", study=ROUTED, trial=str(ROUTED_BASELINE))
    assert any(c.value.startswith("simulated routing: zipf 1.1 (2 of 2 levels)") for c in at.caption)
    for page, query in (("views/study.py", {"study": STUDY}), ("views/trial.py", {"study": STUDY, "trial": "0"})):
        assert not any("simulated routing" in c.value for c in _run(page, **query).caption)
    assert advice.routing_lines(["zipf 1.1", "zipf 1.1", "real", None]) == \
        ["simulated routing: zipf 1.1 (2 of 4 levels)"]
    assert advice.routing_lines(["real", None]) == []


def _levels(rows: list[tuple[int, int, float, float, bool, int, str]]):  # noqa: ANN202 — a DataFrame
    import pandas as pd

    df = pd.DataFrame(rows, columns=["trial", "concurrency", "throughput_per_gpu", "p90_tokens_per_s_per_user",
                                     "meets_slo", "gpus", "config"])
    df["state"] = "complete"
    df["p90_ttft_ms"] = 500.0
    df["pareto"] = False
    x, y = "throughput_per_gpu", "p90_tokens_per_s_per_user"
    ok = df[df["meets_slo"]]
    df.loc[ok.index[queries.pareto_mask(ok[x].tolist(), ok[y].tolist(), x, y)], "pareto"] = True
    return df


def test_recommend_picks_gain_and_alternatives() -> None:
    import pandas as pd

    x, y = "throughput_per_gpu", "p90_tokens_per_s_per_user"
    levels = _levels([
        (0, 64, 1000.0, 40.0, True, 8, "baseline cfg"), (0, 256, 1500.0, 20.0, False, 8, "baseline cfg"),
        (1, 64, 2000.0, 45.0, True, 16, "big"), (1, 256, 3000.0, 26.0, True, 16, "big"),
        (2, 64, 1800.0, 50.0, True, 8, "small"), (2, 256, 2500.0, 24.0, False, 8, "small"),
        (3, 256, 3000.0, 26.0, True, 16, "big"),  # a repeat of trial 1: the same deployment
        (4, 32, 900.0, 80.0, True, 16, "fast"),
    ])
    trials = pd.DataFrame({"trial": [0, 1, 2, 3, 4], "by": ["baseline", "sampler", "sampler", "repeat", "model"],
                           "deployment": ["B", "BIG", "SMALL", "BIG", "FAST"]})
    slos = [data.SLOLine(y, ">=", 25.0), data.SLOLine("p90_ttft_ms", "<=", 2000.0)]
    rec = advice.recommend(levels, trials, slos, x, y)
    assert (rec.best.trial, rec.best.concurrency, rec.best.gpus) == (1, 256, 16)
    assert rec.best.text() == "3,000 tok/s/GPU @ c=256, 26.0 tok/s/user"
    assert rec.gain == pytest.approx(3.0) and rec.baseline.trial == 0 and rec.baseline.concurrency == 64
    assert rec.cheaper.trial == 2 and rec.cheaper.concurrency == 64  # the best on fewer GPUs
    assert rec.faster.y >= 26.0 * 1.1 and rec.faster.trial != 1
    assert [m.headroom for m in rec.margins] == pytest.approx([1 / 25, 0.75])
    assert rec.front_deployments == len(advice.front_by_deployment(levels, x, y)) == 3  # big, small, fast
    # the reader's operating point: at least 60 tokens/s per user
    rec = advice.recommend(levels, trials, slos, x, y, 60.0)
    assert rec.best.trial == 4 and rec.gain is None and "reach no load level" in rec.baseline_note
    assert advice.recommend(levels, trials, slos, x, y, 500.0).best is None


def test_every_throughput_shown_carries_its_concurrency(env: Path) -> None:
    """Wherever a page writes "N tok/s/GPU", the concurrency of that measurement follows."""
    import re

    pages = [("views/study.py", {"study": STUDY}), ("views/studies.py", {}),
             ("views/compare.py", {"study": STUDY}), ("views/compare_studies.py", {"studies": f"{STUDY},{OTHER}"})]
    seen = 0
    for page, query in pages:
        at = _run(page, **query)
        text = _texts(at) + "\n".join(str(m.value) for m in at.metric)
        for m in re.finditer(r"\d[\d,.]* tok/s/GPU", text):
            seen += 1
            assert re.match(r" @ c=\d+", text[m.end():]), text[max(0, m.start() - 80):m.end() + 40]
    assert seen >= 4


def test_switching_studies_keeps_nothing_of_the_first(env: Path, url: str) -> None:
    at = _run("views/study.py", study=STUDY, tab="Trials")
    at.multiselect(key=common.key(STUDY, "trials_states")).select("failed").run()
    at.text_input(key=common.key(STUDY, "trials_text")).input("TP").run()
    at.selectbox(key="pick_study").select(OTHER).run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.title[0].value == f"Study {common.md(OTHER)}"  # the name as Markdown shows it as written
    assert at.multiselect(key=common.key(OTHER, "trials_states")).value == []
    assert at.text_input(key=common.key(OTHER, "trials_text")).value in ("", None)
    table = _df(at, {"trial", "state", "deployment"})
    database = db.connect(url)
    try:
        others = {t.number for t in queries.list_trials(database, OTHER)}
    finally:
        database.close()
    assert set(table["trial"]) == others  # the other study's trials, none filtered out
    at = _run("views/study.py", study=STUDY, tab="Curves")
    curves = at.multiselect(key=common.key(STUDY, "curves_trials"))
    extra = next(int(o) for o in curves.options if int(o) not in curves.value)
    curves.select(extra).run()
    chosen = set(at.multiselect(key=common.key(STUDY, "curves_trials")).value)
    assert extra in chosen
    at.selectbox(key="pick_study").select(OTHER).run()
    assert not at.exception
    info = data.study(url, OTHER)
    levels = data.levels(url, OTHER, info.stamp, info.x_metric, info.y_metric)
    front = [int(t) for t in advice.front_by_deployment(levels, info.x_metric, info.y_metric)["trial"]][:8]
    assert at.multiselect(key=common.key(OTHER, "curves_trials")).value == front
    assert chosen  # the first study highlighted its own front


def test_unknown_study_or_trial_in_the_url_says_so(env: Path) -> None:
    for page in ("views/study.py", "views/trial.py", "views/compare.py"):
        at = _run(page, study="no-such-study")
        assert any("no study named **no\\-such\\-study**" in w.value for w in at.warning), page
        # and shows none: no other study's title, recommendation, table or figure
        assert not at.title and not at.dataframe and not at.get("plotly_chart"), page
        assert at.selectbox(key="pick_study_instead").value is None
    at = _run("views/trial.py", study=STUDY, trial="12345")
    assert any("no trial **12345**" in w.value for w in at.warning)
    at = _run("views/study.py", study=STUDY)
    assert not any("no study named" in w.value for w in at.warning)


def test_pareto_axes_are_chosen_from_the_stored_metrics(env: Path) -> None:
    at = _run("views/study.py", study=STUDY, tab="Pareto front")
    x = at.selectbox(key=common.key(STUDY, "axis_x"))
    assert "P90 TTFT (ms)" in x.options and x.value == "throughput_per_gpu"
    at.selectbox(key=common.key(STUDY, "axis_y")).select("p90_ttft_ms").run()
    assert not at.exception
    fig = next(c for c in at.get("plotly_chart") if '"meta":"pareto"' in c.proto.spec.replace(" ", ""))
    assert "P90 TTFT (ms)" in fig.proto.spec


def test_compare_studies_overlays_both_fronts(env: Path) -> None:
    at = _run("views/compare_studies.py", studies=f"{STUDY},{OTHER}")
    assert at.multiselect(key="compare_studies").value == [STUDY, OTHER]
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    front = next(sp for sp in specs if "studies_front" in sp)
    assert f'"name":"{STUDY}"' in front.replace(" ", "") and f'"name":"{OTHER}"' in front.replace(" ", "")
    assert any("studies_history" in sp for sp in specs)
    table = _df(at, {"study", "best trial", "first run @ c", "run range"})
    assert list(table["study"]) == [STUDY, OTHER] and any(c.startswith("% vs") for c in table.columns)
    at = _run("views/compare_studies.py", studies=f"{STUDY},nope")
    assert any("No study named **nope**" in w.value for w in at.warning)
    assert at.multiselect(key="compare_studies").value == [STUDY]  # the link's study, no other to fill the gap
    assert not at.get("plotly_chart")
    at = _run("views/compare_studies.py", studies="nope,nada")
    assert at.multiselect(key="compare_studies").value == [] and not at.get("plotly_chart") and not at.dataframe


#: What a shared link could plant: a link, an image the browser fetches, HTML.
INJECTED = ('[Session expired](http://evil.example/login) ![i](http://127.0.0.1:9/t.png) '
            '<a href="http://evil.example/">click</a> :red[x] $x^2$')


def test_injected_markdown_and_html_in_a_url_are_shown_as_text(env: Path) -> None:
    """A study name from the URL is shown as written: rendered as CommonMark it makes no link, image or HTML,
    and no bare URL is left for GitHub-style autolinking."""
    from markdown_it import MarkdownIt

    render = MarkdownIt("commonmark").render
    for page, query in (("views/study.py", {"study": INJECTED}), ("views/trial.py", {"study": INJECTED}),
                        ("views/compare.py", {"study": INJECTED}),
                        ("views/compare_studies.py", {"studies": f"{STUDY},{INJECTED}"})):
        at = _run(page, **query)
        shown = [w.value for w in at.warning if "Session expired" in w.value]
        assert shown, (page, [w.value for w in at.warning])
        for text in shown:
            html = render(text)
            assert "<a " not in html and "<img" not in html and "&lt;a href" in html, (page, html)
            assert "http://" not in text and ":red[" not in text and "$x" not in text.replace("\\$x", ""), (page, text)


def test_study_names_in_plotly_labels_are_text(env: Path, url: str) -> None:
    name = '<a href="http://evil.example/">click</a> %{x}'
    info = data.study(url, STUDY)
    lv = data.levels(url, STUDY, info.stamp, info.x_metric, info.y_metric)
    for fig in (plots.studies_front_figure({name: lv[lv["pareto"]]}, info.x_metric, info.y_metric),
                plots.studies_history_figure({name: data.history(url, STUDY, info.stamp)}, info.objectives[0])):
        trace = fig.data[0]
        assert trace.name == '&lt;a href="http://evil.example/"&gt;click&lt;/a&gt; %&#123;x}'
        assert "<a " not in (trace.hovertemplate or "") and "%{x}</b>" not in (trace.hovertemplate or "")


def test_too_few_trials_for_importance_is_said_not_raised(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    u = f"sqlite:///{tmp_path / 'two.db'}"
    tune(job_from_dict({"name": "two", "preset": "h200-qwen3-235b", "budget": {"trials": 2}}), storage=u)
    monkeypatch.setenv("ADVISOR_STORAGE", u)
    at = _run("views/study.py", study="two", tab="Parameters")
    assert any("importance needs at least" in i.value for i in at.info)


def test_importance_of_a_big_study_waits_for_its_toggle(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``IMPORTANCE_AT_ONCE_TRIALS`` the first paint leaves importance out; turning it on shows Optuna's."""
    monkeypatch.setattr(importance, "IMPORTANCE_AT_ONCE_TRIALS", 0)
    at = _run("views/study.py", study=STUDY, tab="Parameters")
    assert at.toggle(key="importance_on").value is False
    assert "Optuna's get_param_importances" not in _texts(at)
    assert any("Turn on *Parameter importance*" in i.value for i in at.info)
    charts = len(at.get("plotly_chart"))
    at.toggle(key="importance_on").set_value(True).run()
    assert not at.exception, [e.message for e in at.exception]
    assert "Optuna's get_param_importances" in _texts(at)
    assert len(at.get("plotly_chart")) == charts + 1  # the importance bars


def test_importance_ranks_what_reaches_a_high_objective(env: Path, url: str) -> None:
    """PED-ANOVA ranks what reaches *low* targets, so a maximized objective is negated: the measured trials'
    importance equals Optuna's own on their negated first objective."""
    import optuna

    info = data.study(url, STUDY)
    imp = importance.importance(url, info.optuna_study_name, -1)  # a bucket of its own: computed here
    stored = optuna.load_study(study_name=info.optuna_study_name, storage=db.normalize_url(url))
    measured = [t for t in stored.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
                if t.user_attrs.get(EXECUTED_ATTR) and t.user_attrs.get(STATE_ATTR) == "complete"]
    scratch = optuna.create_study(directions=stored.directions)
    scratch.add_trials(measured)
    want = optuna.importance.get_param_importances(scratch, target=lambda t: -t.values[0])
    assert imp.trials_used == len(measured)
    assert imp.values == pytest.approx(want)


# ---------------------------------------------------------------------------------------------- trial, compare


def test_trial_page_of_the_best_trial(env: Path, url: str) -> None:
    database = db.connect(url)
    try:
        best = queries.get_study(database, STUDY).best_trial
        trial = queries.get_trial(database, STUDY, best)
    finally:
        database.close()
    at = _run("views/trial.py", study=STUDY, trial=str(best))
    assert at.title[0].value == f"Trial {best} of {common.md(STUDY)}"
    assert {s.value for s in at.subheader} >= {"Configuration", "Operating point", "Topology",
                                              "Measurements per load level", "Per-rank imbalance", "Timings", "Export"}
    levels = _df(at, {f"c={m.concurrency}" for m in trial.measurements})
    assert len(levels.columns) == len(trial.measurements)
    marks = levels.loc[[i for i in levels.index if str(i).startswith("meets ")]]
    assert list(marks.index) == ["meets P90 tok/s/user ≥ 25.0", "meets P90 TTFT (ms) ≤ 2,000",
                                 "meets error rate ≤ 1.0 %"]
    slos = list(job_from_dict({"name": "x", "preset": "h200-qwen3-235b"}).slos)
    for m in trial.measurements:
        want = ["✓ yes" if sl.met(m) else "✗ no" for sl in slos]
        assert marks[f"c={m.concurrency}"].tolist() == want
    assert any("No phase timings: the simulated executor" in c.value for c in at.caption)
    assert not [m for m in at.metric if m.label in ("deploy", "measure", "teardown")]  # no 0.0 s for a simulation
    assert len([b for b in at.get("download_button")]) == len(FORMATS)


def test_trial_page_of_failed_and_invalid_trials(env: Path, url: str) -> None:
    at = _run("views/trial.py", study=STUDY, trial=str(FAILED_TRIAL))
    assert any("CUDA OOM" in e.value for e in at.error)
    assert any("Only complete trials can be exported" in c.value for c in at.caption)
    database = db.connect(url)
    try:
        invalid = queries.list_trials(database, STUDY, states=["invalid"])
    finally:
        database.close()
    if invalid:
        at = _run("views/trial.py", study=STUDY, trial=str(invalid[0].number))
        assert any("broke a validity rule" in i.value for i in at.info)


def test_compare_page_two_to_four_trials(env: Path, url: str) -> None:
    at = _run("views/compare.py", study=STUDY)
    key = common.key(STUDY, "compare_trials")
    chosen = at.multiselect(key=key).value
    assert len(chosen) == 2
    options = at.multiselect(key=key).options
    third = next(int(o) for o in options if int(o) not in chosen)
    at.multiselect(key=key).select(third).run()
    assert not at.exception
    a, b = chosen[0], chosen[1]
    table = _df(at, {f"trial {n}" for n in [*chosen, third]}
                | {f"Δ trial {b} − trial {a}", f"% trial {b} vs trial {a}"})
    assert list(table.index) == sorted(table.index)
    assert "None" not in table.to_string() and "nan" not in table.to_string()  # an empty cell is "—"
    both = table[(table[f"trial {a}"] != "—") & (table[f"trial {b}"] != "—")]

    def number(col: str) -> pd.Series:
        return both[col].str.replace(",", "").str.removesuffix(" %").astype(float)

    assert not both.empty
    assert number(f"Δ trial {b} − trial {a}").tolist() == pytest.approx(
        (number(f"trial {b}") - number(f"trial {a}")).tolist(), abs=1.0)  # shown rounded: to the unit
    assert number(f"% trial {b} vs trial {a}").tolist() == pytest.approx(
        ((number(f"trial {b}") / number(f"trial {a}") - 1) * 100).tolist(), abs=0.2)
    at = _run("views/compare.py", study=STUDY, trials=str(chosen[0]))
    assert any("Pick two" in i.value for i in at.info)


# ---------------------------------------------------------------------------------------------- new study


def test_new_study_is_read_only_by_default(env: Path) -> None:
    at = _run("views/new_study.py")
    assert any("read-only" in i.value for i in at.info)
    assert any("--allow-new-studies" in c.value for c in at.code)
    assert not at.get("form")


@pytest.fixture
def started_tuners() -> Iterator[None]:
    """Whatever the New study page started is stopped by its process group afterwards, even on failure."""
    yield
    for tp in list(jobs.registry().values()):
        if tp.proc.poll() is None:
            os.killpg(tp.pgid, signal.SIGKILL)
            tp.proc.wait(timeout=10)
    jobs.registry().clear()


def test_new_study_from_a_preset_runs_the_tuner(env: Path, url: str, monkeypatch: pytest.MonkeyPatch,
                                                started_tuners: None) -> None:
    monkeypatch.setenv("ADVISOR_ALLOW_NEW_STUDIES", "1")
    at = _run("views/new_study.py")
    at.selectbox(key="new_preset").select("h200-qwen3-235b")
    at.text_input(key="new_name").input("from-ui")
    at.number_input(key="new_trials").set_value(3)
    at.selectbox(key="new_executor").select("simulated")
    at.button(key="new_submit").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("Started tuning 'from-ui'" in m.value for m in at.success), _texts(at)
    tp = jobs.registry()["from-ui"]
    assert tp.proc.wait(timeout=120) == 0, jobs.log_tail(tp.log)
    assert "--storage" in tp.command and (env / "runs" / "from-ui.yaml").exists()
    database = db.connect(url)
    try:
        s = queries.get_study(database, "from-ui")
    finally:
        database.close()
    assert s is not None and s.done >= 3
    data.clear()  # the studies list was cached (in this process) before the tuner created 'from-ui'
    at = _run("views/study.py", study="from-ui")
    assert "finished" in [m.value for m in at.metric]
    assert any("Tuner started from this dashboard" in c.value for c in at.caption), _texts(at)


def test_uploaded_job_file_is_validated_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="budget"):
        jobs.save_upload(b"name: x\npreset: h200-qwen3-235b\nbudget: {trials: 0}\n", "job.yaml", tmp_path)
    with pytest.raises(BadInput, match="not valid YAML"):
        jobs.save_upload(b"name: [\n", "../../evil.yaml", tmp_path)
    assert (tmp_path / "uploads" / "evil.yaml").exists()  # kept inside the run folder, whatever its name
    path, job = jobs.save_upload(b"name: ok\npreset: h200-qwen3-235b\n", "ok.yml", tmp_path)
    assert job.name == "ok" and path.parent == tmp_path / "uploads"


# ---------------------------------------------------------------------------------------------- pure parts


def test_settings_precedence_and_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVISOR_STORAGE", "postgresql://u:pw@h/db")
    monkeypatch.delenv("ADVISOR_ALLOW_NEW_STUDIES", raising=False)
    s = settings([])
    assert s.storage == "postgresql://u:pw@h/db" and s.storage_for_display == "postgresql://u:***@h/db"
    assert not s.allow_new_studies
    s = settings(["--storage", "sqlite:///x.db", "--allow-new-studies", "--unrelated"])
    assert s.storage == "sqlite:///x.db" and s.allow_new_studies


def test_filter_trials_is_a_pure_function(env: Path, url: str) -> None:
    info = data.study(url, STUDY)
    df, _ = data.trials(url, STUDY, info.stamp)
    assert len(tables.filter_trials(df)) == len(df)
    assert set(tables.filter_trials(df, states=["invalid"])["state"]) <= {"invalid"}
    gpus = tables.filter_trials(df, gpus=(8, 8))
    assert set(gpus["gpus"]) <= {8}
    assert tables.filter_trials(df.iloc[0:0], text="x").empty


def test_pareto_figure_holds_every_level_once(env: Path, url: str) -> None:
    info = data.study(url, STUDY)
    levels = data.levels(url, STUDY, info.stamp, info.x_metric, info.y_metric)
    fig = plots.pareto_figure(levels, info.x_metric, info.y_metric, info.slos)
    assert fig.layout.meta == "pareto"
    assert sum(len(t.x) for t in fig.data if t.meta == "levels") == _measured_points(url)
    database = db.connect(url)
    try:
        front = queries.pareto_front(database, STUDY, slos=list(job_from_dict(
            queries.get_study(database, STUDY).job).slos))
    finally:
        database.close()
    assert sum(len(t.x) for t in fig.data if t.meta == "pareto") == len(front)
    hlines = [s for s in fig.layout.shapes if s.y0 == s.y1]
    assert any(s.y0 == 25 for s in hlines)  # the preset's P90 tokens/s/user >= 25 SLO


def test_topology_figure_draws_every_gpu_and_the_router() -> None:
    topo = {"cluster": {"nodes": 2, "gpus_per_node": 8},
            "instances": [{"name": "prefill-0", "role": "prefill", "gpus": 4,
                           "shards": [{"node": 0, "gpus": [0, 1, 2, 3], "start_rank": 0, "local_ranks": 4}]},
                          {"name": "decode-0", "role": "decode", "gpus": 16,
                           "shards": [{"node": 0, "gpus": [4, 5, 6, 7], "start_rank": 0, "local_ranks": 4},
                                      {"node": 1, "gpus": list(range(8)), "start_rank": 4, "local_ranks": 8}]}]}
    fig = trial_plots.topology_figure(topo, "router (round_robin)")
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == 2 + 16 + 1  # nodes, GPUs, router
    hover = fig.data[0].hovertext
    assert "node 1 GPU 7: decode-0, DP rank 11" in hover and "node 0 GPU 0: prefill-0, DP rank 0" in hover
    kv = [s for s in fig.layout.shapes if s.type == "line" and s.line.dash == "dot"]
    assert len(kv) == 1  # prefill head → decode head


def test_imbalance_uses_measured_tokens_per_rank() -> None:
    m = Measurement(concurrency=8, source="measured", gpus=2, num_requests=8, completed=8,
                    raw={"metrics": {"mixed-0": {"role": "mixed", "tokens_per_rank": {"0": 100.0, "1": 300.0}}}})
    fig = trial_plots.imbalance_figure([m])
    assert fig is not None and list(fig.data[0].y) == [100.0, 300.0]
    assert trial_plots.imbalance_figure([Measurement(concurrency=8, source="measured", gpus=1, num_requests=1,
                                               completed=1)]) is None


def test_parcoords_puts_missing_parameters_at_a_tick_of_their_own() -> None:
    import pandas as pd

    params = pd.DataFrame({"trial": [0, 1, 2], "state": ["complete"] * 3, "mode": ["aggregated", "disaggregated",
                                                                                  "aggregated"],
                           "prefill_dp": [None, 4.0, None], "same": [1, 1, 1]})
    fig = plots.parcoords_figure(params, pd.Series([1.0, 2.0, 3.0]), "throughput_per_gpu")
    dims = {d.label: d for d in fig.data[0].dimensions}
    assert "same" not in dims  # one value: nothing to see
    assert list(dims["prefill_dp"].ticktext) == ["–", "4"] and list(dims["prefill_dp"].values) == [0, 1, 0]


# ---------------------------------------------------------------------------------------------- the CLI command


def _advisor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, timeout=timeout)


def test_dashboard_bad_input_is_one_line() -> None:
    r = _advisor("dashboard", "--storage", "mysql://u:pw@h/db")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--storage" in r.stderr and "pw" not in r.stderr
    r = _advisor("dashboard", "--port", "0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_dashboard_refuses_a_port_in_use() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = _advisor("dashboard", "--port", str(s.getsockname()[1]))
    assert r.returncode == 2 and "pick another --port" in r.stderr


def test_dashboard_starts_and_stops_on_ctrl_c(tmp_path: Path, url: str) -> None:
    """`advisor dashboard` serves, says where, and Ctrl-C (SIGINT to its group) stops its Streamlit group."""
    import re
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "dash.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "advisor", "dashboard", "--storage", url, "--port", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    server_group = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"the dashboard did not answer: {log.read_text()}")
        m = re.search(r"process group (\d+)", log.read_text())
        assert m, log.read_text()
        server_group = int(m.group(1))
        assert f"http://127.0.0.1:{port}" in log.read_text() and "read-only" in log.read_text()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        time.sleep(0.5)
        with pytest.raises(ProcessLookupError):
            os.killpg(server_group, 0)
        assert "dashboard stopped" in log.read_text()
    finally:
        m = re.search(r"process group (\d+)", log.read_text())
        server_group = int(m.group(1)) if m else server_group
        for group in (proc.pid, server_group):
            if group is not None:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg_fresh(pg_url: str) -> Iterator[str]:
    """A database of its own on the test server (dropped afterwards)."""
    import uuid

    import psycopg
    from sqlalchemy import make_url

    base = make_url(db.normalize_url(pg_url))
    libpq = base.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"advisor_ui_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        data.clear()
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
def test_every_page_on_postgresql(pg_fresh: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every page reads a PostgreSQL study; the password never shows."""
    from sqlalchemy import make_url

    monkeypatch.setenv("ADVISOR_STORAGE", pg_fresh)
    monkeypatch.setenv("ADVISOR_UI_RUN_DIR", str(tmp_path))
    at = _run()
    assert "No studies in" in _texts(at)
    _fill(pg_fresh)
    data.clear()
    at = _run()
    assert STUDY in set(_df(at, {"study"})["study"])
    at = _run("views/study.py", study=STUDY, tab="Parameters")  # only the open tab runs
    assert "Optuna's get_param_importances" in _texts(at)
    secret = make_url(pg_fresh).password
    for page in ("views/trial.py", "views/compare.py", "views/new_study.py"):
        at = _run(page, study=STUDY)
        shown = _texts(at) + "\n".join(c.value for c in at.caption)
        assert "***@" in shown and (not secret or f":{secret}@" not in shown)


def test_error_bars_only_where_the_levels_carry_intervals() -> None:
    import pandas as pd

    df = pd.DataFrame({"throughput_per_gpu": [100.0, 200.0], "intervals": [{"throughput_per_gpu": [90.0, 120.0]}, {}]})
    bars = plots.error_bars(df, "throughput_per_gpu")
    assert bars["array"] == [20.0, 0.0] and bars["arrayminus"] == [10.0, 0.0]
    assert plots.error_bars(df.assign(intervals=[{}, {}]), "throughput_per_gpu") is None  # simulated: no bars


def test_numbers_for_people() -> None:
    assert advice.num(25028.2104) == "25,028" and advice.num(40.06) == "40.1" and advice.num(None) == "–"
    assert advice.short("p90_ttft_ms") == "P90 TTFT (ms)" and advice.short("throughput_per_gpu") == "tok/s/GPU"
    assert common.fmt(30389.7) == "30,390" and common.fmt(float("nan")) == "–"


def test_viewer_toolbar_and_a_local_page_icon() -> None:
    """No "Deploy" button in a deployment tool, and no page icon fetched from the internet."""
    import tomllib

    ui = Path(APP).parent
    config = tomllib.loads((ui / ".streamlit" / "config.toml").read_text())
    assert config["client"]["toolbarMode"] == "viewer" and config["browser"]["gatherUsageStats"] is False
    source = (ui / "app.py").read_text()
    assert "assets" in source and ":material/" not in source.split("set_page_config", 1)[1].split("\n", 1)[0]
    assert (ui / "assets" / "icon.png").read_bytes().startswith(b"\x89PNG")


def _snapshot(*paths: Path) -> dict[Path, bytes]:
    """Every file under ``paths`` (the database file and its WAL among them), byte for byte."""
    return {f: f.read_bytes() for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*"))) if f.is_file()}


def test_read_only_dashboard_writes_nothing_whatever_is_clicked(env: Path, url: str) -> None:
    """Read-only means no write of any kind: every page rendered, every button pressed and every download made
    (what a download button runs when clicked) leave the database and the disk byte-identical."""
    from ui import downloads

    dbfile = Path(url.removeprefix("sqlite:///"))
    best = _best_level(url).trial_number
    before = _snapshot(dbfile.parent, env)
    for page, query in (("views/studies.py", {}), ("views/study.py", {"study": STUDY}),
                        ("views/trial.py", {"study": STUDY, "trial": str(best)}),
                        ("views/compare.py", {"study": STUDY}), ("views/compare_studies.py", {}),
                        ("views/new_study.py", {})):
        at = _run(page, **query)
        for i in range(len(at.button)):
            at.button[i].click().run()
            assert not at.exception, [e.message for e in at.exception]
    made = {fmt: downloads.exporter(url, STUDY, best, fmt)() for fmt in FORMATS}
    assert made["vllm"].startswith(b"#!") and all(made.values())
    assert all(b"export failed" not in b for b in made.values())
    assert _snapshot(dbfile.parent, env) == before  # no export row, no file under the run folder
