"""The dashboard and the CLI say one thing of a real study: the H200 study r7 (``tests.r7_study``: vLLM's defaults
measured twice, five search trials, the best measured again) and the earlier sessions' studies in its database.

The gain, the counts and the best are computed once (``advisor.verdict``, ``advisor.study_counts``,
``advisor.answer.best_text``) and each screen shows those sentences as ``advisor best`` and ``advisor studies``
print them; the plots tell the defaults, the repeats and the answer apart; the pages never show a literal None, a
raw mapping or a study as running that no tuner runs.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import db
from advisor import api
from db import queries
from tests import r7_study
from tests.test_ui_apptest import _run, _texts
from ui import common, importance, trial_plots

STUDY = r7_study.STUDY


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return r7_study.unpack(tmp_path_factory.mktemp("r7"))


@pytest.fixture
def env(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ADVISOR_STORAGE", url)
    monkeypatch.setenv("ADVISOR_UI_RUN_DIR", str(tmp_path / "runs"))
    return tmp_path


def _cli_studies(url: str) -> dict[str, dict[str, object]]:
    cols, rows = api.studies_table(url)
    return {r[0]: dict(zip(cols, r, strict=True)) for r in rows}


def _figures(at: AppTest) -> dict[str, dict]:
    """Every Plotly figure the page drew, by its ``layout.meta``."""
    out = {}
    for el in at.get("plotly_chart"):
        fig = json.loads(el.proto.spec)
        out[fig.get("layout", {}).get("meta")] = fig
    return out


def test_the_gain_names_every_run_and_says_mean_over_mean(url: str) -> None:
    """1.08× is the mean of trial 4's runs over the mean of the defaults' runs: both of the defaults' runs are
    named (not only the first, whose 19,117 against 22,213 would read as 1.16×), and so is the range."""
    said = api.verdict_of(url, STUDY)
    g = said.gain
    assert g is not None and not g.defaults_best and (g.subject.trial, g.defaults.trial) == (4, 0)
    assert round(g.ratio, 2) == 1.08 and (round(g.low, 2), round(g.high, 2)) == (1.01, 1.16)
    text = g.text()
    assert "1.08× the defaults, mean over mean" in text
    assert "22,213.4 (trial 4 @ c=85) / 21,479.5 (trial 6 @ c=85), mean 21,846.5" in text
    assert "19,117.1 (trial 0 @ c=70) / 21,249.9 (trial 7 @ c=82), mean 20,183.5" in text
    assert text.endswith("run against run 1.01–1.16×: a gain")
    assert text in api.best_report(url, STUDY).notes  # what `advisor best` prints
    # the cluster's figure is the same mean, not the first run's 22,213 "in all"
    assert said.cluster.endswith("21,846 tok/s for the cluster at the SLOs")


def test_the_study_page_says_advisor_best_s_sentences(env: Path, url: str) -> None:
    at = _run("views/study.py", study=STUDY)
    text = _texts(at)
    said = api.verdict_of(url, STUDY)
    assert f"**1.08× vLLM's defaults** — {common.plain(said.gain.text())}" in text
    assert common.plain(said.spread) in text and common.plain(said.cluster) in text
    assert "in all" not in text and "19,117 tok/s/GPU" not in text  # no first-run-only figure of the defaults
    # who found the answer: the line `advisor best` prints, in the answer's own list (not a caption further down)
    assert said.found == "found by: the study's sampler" and said.found in api.best_report(url, STUDY).notes
    assert f"- {common.plain(said.found)}" in [ln for m in at.markdown for ln in str(m.value).splitlines()]
    # counts: the progress panel's sentence is `advisor studies`'s, and each number is labelled
    cli = _cli_studies(url)[STUDY]
    assert cli["trials"] == ("5 of 5 search trials run, plus 2 runs of vLLM's defaults and 1 repeat of a searched "
                             "deployment on fresh deploys; 8 complete, 0 failed, 0 invalid")
    assert common.plain(str(cli["trials"])) in text
    metrics = {m.label: m.value for m in at.metric}
    assert (metrics["search trials run"], metrics["defaults' runs"], metrics["repeats"], metrics["complete"]) == \
        ("5 of 5", "2", "1", "8")
    assert metrics["state"] == cli["state"] == "finished"


def test_the_studies_page_says_advisor_studies_words(env: Path, url: str) -> None:
    """The best is the mean of the answer's runs on both screens (r6: 24,232.7 over 2 runs, never the first run's
    25,988 beside the CLI's mean); studies whose tuner was cut off with trials RUNNING are not "running"."""
    at = _run()
    table = next(d.value for d in at.dataframe if "best trial" in d.value.columns)
    cli = _cli_studies(url)
    for row in table.to_dict("records"):
        mine = cli[row["study"]]
        best = row["best"] if isinstance(row["best"], str) else None  # no answer yet: an empty cell
        assert (row["state"], row["trials"], best) == (mine["state"], mine["trials"], mine["best"]), row
    assert cli["h200-study-30b-r6"]["best"] == "24,232.7 throughput_per_gpu (mean of 2 runs)"
    for left in ("h200-study-30b-r2", "h200-study-30b-r5"):
        assert cli[left]["state"] == "left running" and "left running with no tuner's heartbeat" in \
            str(cli[left]["trials"])
    assert not any("running" == r for r in table["state"])
    cards = [c.value for c in at.caption if c.value.startswith(("finished", "stopped", "left running"))]
    assert any("best 24,232.7 throughput_per_gpu (mean of 2 runs) (trial 2)" in c for c in cards), cards


def test_a_legacy_study_reads_as_words(env: Path) -> None:
    """The first session's job no longer validates: its cluster is said in words and its one interrupted trial
    is not ticked as meeting the SLOs."""
    at = _run("views/study.py", study="h200-study-30b", tab="Trials")
    text = _texts(at)
    assert "1 × 1 H200 (1 GPU)" in text and "{'gpu'" not in text
    trials = next(d.value for d in at.dataframe if "meets SLOs" in d.value.columns)
    interrupted = trials[trials["state"] == "interrupted"]
    assert len(interrupted) == 1 and interrupted["meets SLOs"].isna().all()


def _values(a: object) -> list[float]:
    """A trace's array as numbers: a plain list, or Plotly's typed-array spec ``{dtype, bdata}``."""
    if isinstance(a, dict):
        return np.frombuffer(base64.b64decode(a["bdata"]), dtype=np.dtype(a["dtype"])).tolist()
    return list(a)  # type: ignore[call-overload]


def test_convergence_and_pareto_mark_the_defaults_the_repeats_and_the_answer(env: Path) -> None:
    figs = _figures(_run("views/study.py", study=STUDY))
    traces = {t.get("meta"): t for t in figs["history"]["data"] if t.get("meta")}
    assert set(traces) >= {"search", "baseline", "repeat", "answer"}
    x = {k: sorted(_values(t["x"])) for k, t in traces.items()}
    assert (x["baseline"], x["repeat"], x["search"], x["answer"]) == ([0, 7], [6], [1, 2, 3, 4, 5], [4])
    assert _values(traces["answer"]["y"]) == [pytest.approx(22_213.4, abs=0.1)]
    figs = _figures(_run("views/study.py", study=STUDY, tab="Pareto front"))
    answer = [t for t in figs["pareto"]["data"] if t.get("meta") == "answer"]
    assert len(answer) == 1 and answer[0]["customdata"][0][:2] == [4, 85]


def test_importance_counts_the_search_trials_only(url: str) -> None:
    """The defaults (no searched parameters) and the repeat (a second draw of trial 4) are left out: 5 trials."""
    imp = importance.importance(url, STUDY, 0)
    assert imp.trials_used == 5, imp


def test_the_trial_page_draws_each_slo_on_its_own_axis(env: Path, url: str) -> None:
    import db
    from db import queries

    database = db.connect(url)
    try:
        trial = queries.get_trial(database, STUDY, 4)
        slos = list(api.job_of_study(database, STUDY).slos)
    finally:
        database.close()
    fig = trial_plots.levels_figure(list(trial.measurements), slos).to_dict()
    lines = {t["meta"]: t for t in fig["data"] if str(t.get("meta", "")).startswith("slo:")}
    assert lines["slo:p90_tokens_per_s_per_user"]["yaxis"] == "y2"
    assert lines["slo:p90_tokens_per_s_per_user"]["y"] == [30.0, 30.0]
    assert fig["layout"]["yaxis2"]["range"][1] > 30.0
    at = _run("views/trial.py", study=STUDY, trial="4")
    assert "levels" in _figures(at)


def test_compare_trials_without_a_shared_concurrency_says_so(env: Path) -> None:
    """Trial 0 was measured at c = 70, 81 and trial 3 at c = 62, 67, 74: no Δ can be stated, and no cell reads
    None."""
    at = _run("views/compare.py", study=STUDY, trials="0,3")
    assert any("no shared concurrency" in i.value for i in at.info)
    table = next(d.value for d in at.dataframe if "trial 0" in d.value.columns)
    assert "None" not in table.to_string() and "nan" not in table.to_string()
    assert not any(c.startswith("Δ") for c in table.columns)
    assert (table == "—").any(axis=None)


def test_optuna_dashboard_s_note_names_the_answer(url: str) -> None:
    """optuna-dashboard reads the note from the study's system attributes: it names `advisor best`'s trial and
    its sentences; where Optuna's own best is another trial, the note says which and why."""
    import optuna

    from advisor.answer import study_answer
    from advisor.optuna_note import note_text, optuna_best, read_note
    from advisor.study import storage_for

    body = api.note_answer(url, STUDY)
    study = optuna.load_study(study_name=STUDY, storage=storage_for(url))
    assert body is not None and read_note(study) == body
    assert body.startswith("**deploy-advisor's answer (`advisor best`): trial 4** — 21,846.5 throughput_per_gpu "
                           "(mean of 2 runs)")
    assert optuna_best(study) == [4] and "Optuna's best trial is the same trial (4)." in body
    said = api.verdict_of(url, STUDY)
    assert f"- {said.gain.text()}" in body.splitlines()
    assert api.note_answer(url, STUDY) == body  # written again: the same note, one version up
    import db

    database = db.connect(url)
    try:
        answer = study_answer(database, STUDY, api.job_of_study(database, STUDY))
    finally:
        database.close()
    other = note_text(answer, said, "x", [7])
    assert "Optuna's best trial here is trial 7. Optuna ranks single runs by their values" in other
    front = note_text(answer, said, "x", [2, 5])
    assert "Pareto front of single runs (2 trials, the answer not among them)" in front


def test_launch_sh_s_header_marks_the_levels_that_miss_an_slo(url: str, tmp_path: Path) -> None:
    """vLLM's defaults (trial 0) held every SLO at c=70 and missed P90 tok/s/user ≥ 30 at c=81: the header's line
    of c=81 says so, so its 20,318 tok/s/GPU is not read as what the deployment delivers."""
    (path,) = api.export(url, STUDY, fmt="vllm", trial=0, out=tmp_path / "e", model="Qwen/Qwen3-30B-A3B")
    header = [ln for ln in path.read_text().splitlines() if ln.startswith("# concurrency ")]
    assert len(header) == 2
    assert header[0].startswith("# concurrency 70: 19,117.1 tok/s/GPU") and header[0].endswith("— meets every SLO")
    assert header[1].startswith("# concurrency 81: 20,317.7 tok/s/GPU")
    assert header[1].endswith("— MISSES p90_tokens_per_s_per_user >= 30 (28.6)")


def test_compare_studies_weighs_the_means_of_the_runs_with_their_spread(env: Path) -> None:
    """r7 against r6: each answer's two runs, their mean (the figure `advisor studies` prints), range and spread;
    the ranges (21,480–22,213 and 22,477–25,989) do not overlap, and the page says so."""
    at = _run("views/compare_studies.py", studies=f"{STUDY},h200-study-30b-r6")
    table = next(d.value for d in at.dataframe if "run range" in d.value.columns).set_index("study")
    assert table.loc[STUDY, "runs"] == 2 and round(table.loc[STUDY, "mean tok/s/GPU"], 1) == 21_846.5
    assert round(table.loc["h200-study-30b-r6", "mean tok/s/GPU"], 1) == 24_232.7
    assert table.loc[STUDY, "run range"] == "21,479.5–22,213.4 (spread 3.4%)"
    assert table.loc["h200-study-30b-r6", f"vs {STUDY}"] == "apart: the run ranges do not overlap"


def test_topology_labels_fit_above_the_gpus_on_any_page_colour() -> None:
    """18 nodes of 4 GPUs (a GB300 rack) shrink the drawing: each node's name shrinks with it and sits in the strip
    above its GPU squares, and nothing paints a white box on a dark page."""
    rack = {"cluster": {"nodes": 18, "gpus_per_node": 4}, "instances": [
        {"name": "decode-0", "role": "decode", "gpus": 72,
         "shards": [{"node": n, "gpus": [0, 1, 2, 3], "start_rank": 4 * n, "local_ranks": 4} for n in range(18)]}]}
    fig = trial_plots.topology_figure(rack).to_dict()["layout"]
    names = [a for a in fig["annotations"] if str(a["text"]).startswith("node ")]
    assert len(names) == 18
    span = fig["xaxis"]["range"][1] - fig["xaxis"]["range"][0]
    px_per_unit = (fig["width"] - 20) / span
    gpu_tops = {round(s["y1"], 6) for s in fig["shapes"]
                if s.get("type") == "rect" and s.get("fillcolor") != "rgba(128,128,128,0.08)"}
    for a in names:
        assert a["yanchor"] == "top"
        label_bottom = a["y"] - a["font"]["size"] / px_per_unit  # the label's height in plot units
        assert all(label_bottom >= top - 1e-6 for top in gpu_tops if top <= a["y"] and a["y"] - top < 1.0), a
    assert fig["plot_bgcolor"] == fig["paper_bgcolor"] == "rgba(0,0,0,0)"
    assert not any(s.get("fillcolor") in ("white", "#FAFAFA", "#ffffff") for s in fig["shapes"])


def test_the_headline_topology_is_a_static_picture_of_every_gpu() -> None:
    """The headline draws the same boxes and squares as the Plotly figure, as an SVG image (no Plotly bundle)."""
    topo = {"cluster": {"nodes": 2, "gpus_per_node": 8}, "instances": [
        {"name": "prefill-0", "role": "prefill", "gpus": 8,
         "shards": [{"node": 0, "gpus": list(range(8)), "start_rank": 0, "local_ranks": 8}]},
        {"name": "decode-0", "role": "decode", "gpus": 8,
         "shards": [{"node": 1, "gpus": list(range(8)), "start_rank": 0, "local_ranks": 8}]}]}
    fig = trial_plots.topology_figure(topo, "router <rr>")
    svg = trial_plots.topology_svg(fig)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<rect") == len([s for s in fig.layout.shapes if s.type == "rect"]) + 5  # + 5 legend keys
    assert svg.count(">P0<") == 8 and svg.count(">D0<") == 8 and ">node 1<" in svg
    assert "router &lt;rr&gt;" in svg and "<rr>" not in svg  # text is escaped


def test_a_one_gpu_pictures_legend_stays_inside_it() -> None:
    """A 1-GPU deployment is a narrow picture: its five legend names wrap into rows inside its width (none cut off
    at the right edge) and the picture grows to hold them."""
    import re

    topo = {"cluster": {"nodes": 1, "gpus_per_node": 1}, "instances": [
        {"name": "mixed-0", "role": "mixed", "gpus": 1,
         "shards": [{"node": 0, "gpus": [0], "start_rank": 0, "local_ranks": 1}]}]}
    svg = trial_plots.topology_svg(trial_plots.topology_figure(topo, "router"))
    width, height = (float(v) for v in re.search(r'width="([0-9.]+)" height="([0-9.]+)"', svg).groups())
    keys = re.findall(r'<rect x="([0-9.]+)" y="([0-9.]+)" width="11" height="11" fill="[^"]+"/><text x="[0-9.]+" '
                      r'y="[0-9.]+" font-size="11" fill="#888" dominant-baseline="central">([^<]+)</text>', svg)
    assert [name for _, _, name in keys] == ["prefill", "decode", "mixed (prefill + decode)", "idle GPU", "router"]
    for x, y, name in keys:  # the names' width as the layout reckons it (6.5 px a character at 11 px)
        assert float(x) + 15 + 6.5 * len(name) <= width + 6 and float(y) + 11 <= height, (name, x, width)
    assert len({y for _, y, _ in keys}) > 1  # wrapped: one row would not fit


def test_the_headline_topology_is_drawn_with_the_text_beside_it(env: Path, url: str) -> None:
    """The picture is a Markdown image of the answer's topology (drawn by the code that draws the headline's text,
    waiting for no chunk of its own), the SVG the trial's topology gives."""
    at = _run("views/study.py", study=STUDY)
    pictures = [str(m.value) for m in at.markdown if str(m.value).startswith("![")]
    assert len(pictures) == 1
    alt, data = pictures[0].split("](data:image/svg+xml;base64,")
    assert alt == "![where trial 4's instances run" and data.endswith(")")
    database = db.connect(url)
    try:
        trial = queries.get_trial(database, STUDY, 4)
    finally:
        database.close()
    assert trial is not None and trial.topology
    svg = trial_plots.topology_svg(trial_plots.topology_figure(trial.topology, "router"))
    assert base64.b64decode(data[:-1]).decode() == svg


def test_a_run_with_fewer_trials_than_the_job_reads_finished(tmp_path: Path) -> None:
    """`advisor tune --trials 3` on a job of 20: the study's budget is the run's, so every screen says 3 of 3
    search trials run, finished — not "stopped", "3/20"."""
    from advisor.job import job_from_dict

    url = f"sqlite:///{tmp_path / 'a.db'}"
    job = job_from_dict({"name": "short", "preset": "h200-qwen3-235b", "budget": {"trials": 20}})
    api.run_tune(job, trials=3, storage=url)
    row = _cli_studies(url)["short"]
    assert row["state"] == "finished" and str(row["trials"]).startswith("3 of 3 search trials run"), row
