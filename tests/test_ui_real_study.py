"""The dashboard on a real study (the committed H200 knee study, ``tests.knee_study``), headlessly: the answer
against vLLM's defaults at equal load where the defaults met the SLOs nowhere, the headline's knee, interval and
spread, exports that say why they cannot be made and ask for the model, and the small words (``repeat of 0``, one
GPU, margins that never round to 0 %); plus the pure parts (topology to scale, whole-number trial ticks, SLOs by
label).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import db
from advisor import api
from advisor.answer import study_answer
from advisor.job import job_from_dict
from db import queries
from tests import knee_study
from tests.test_ui_apptest import _run, env  # noqa: F401 — env: the dashboard's settings, on this url
from ui import advice, common, data, downloads, plots, trial_plots

STUDY = knee_study.STUDY


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return knee_study.unpack(tmp_path_factory.mktemp("knee"))


def _study_page(**query: str) -> AppTest:
    return _run("views/study.py", study=STUDY, **query)


def test_the_answer_against_the_defaults_at_equal_load(url: str) -> None:
    """The defaults met the SLOs at none of c = 99…263: no gain can be stated, but at c=99, which both measured,
    the recommended trial made 10,332 tok/s/GPU against the defaults' 24,584 — `advisor best` says so too."""
    database = db.connect(url)
    try:
        answer = study_answer(database, STUDY, job_from_dict(queries.get_study(database, STUDY).job))
    finally:
        database.close()
    assert answer is not None and answer.trial == 1 and answer.baseline is None
    equal = answer.equal_load
    assert equal is not None and equal.concurrency == 99 and equal.defaults_trial == 0
    assert round(equal.answer.throughput_per_gpu) == 10_332 and round(equal.defaults.throughput_per_gpu) == 24_584
    assert equal.worse("throughput_per_gpu") and equal.ratio("throughput_per_gpu") == pytest.approx(0.42, abs=0.005)
    assert [(t, c) for t, _, c in answer.runs] == [(1, 37), (2, 37)]
    notes = api.best_report(url, STUDY).notes
    assert any("at equal load (c=99" in n and "10,331.9" in n and "24,584.4" in n and "worse" in n for n in notes)


def test_the_headline_carries_knee_interval_spread_and_the_defaults(env: Path, url: str) -> None:
    at = _study_page()
    heads = [m.value for m in at.markdown]
    facts = next(v for v in heads if "Knee: c=37" in v)
    assert "c=65 missed an SLO" in facts and "bracket-open" in facts
    assert "11,051–11,622 tok/s/GPU @ c=37" in facts
    # the spread and the whole cluster are `advisor best`'s own sentences, word for word
    notes = api.best_report(url, STUDY).notes
    spread = next(n for n in notes if n.startswith("run to run:"))
    assert "11,331.3 @ c=37 / 11,267.8 @ c=37 throughput_per_gpu (spread 0.6%)" in spread
    assert common.plain(spread) in facts
    assert common.plain(next(n for n in notes if n.startswith("whole cluster:"))) in facts
    (box,) = [e.value for e in at.error if "At equal load vLLM's defaults do better" in e.value]
    assert "10,332 tok/s/GPU @ c=99, 14.2 tok/s/user" in box and "24,584 tok/s/GPU @ c=99, 28.6 tok/s/user" in box
    assert "c = 99, 173, 229, 263" in box and "0.42×" in box
    assert any("on **1 GPU**" in v for v in heads) and not any("1 GPUs" in v for v in heads)
    # the headline comes before the SLO margins, the exports and the progress
    order = [e.value for e in at.main if getattr(e, "type", "") in ("markdown", "error")]
    assert order.index(facts) < order.index(box) < next(i for i, v in enumerate(order) if "Margins to the SLOs" in v)


def test_a_failing_export_says_why_and_asks_for_the_model(env: Path, url: str) -> None:
    problem = api.export_problem(url, STUDY, trial=1)
    assert problem is not None and problem.needs_model and "is a folder on this machine" in problem.reason
    assert api.export_problem(url, STUDY, trial=1, model="Qwen/Qwen3-30B-A3B") is None
    with pytest.raises(downloads.ExportFailed, match="--model"):  # no error text downloaded as a file
        downloads.exporter(url, STUDY, 1, "json")()
    at = _study_page()
    assert not at.get("download_button")
    assert any("To export trial 1, name the model the cluster loads" in w.value for w in at.warning)
    at.text_input(key="rec_export_model").set_value("Qwen/Qwen3-30B-A3B").run()
    assert not at.exception
    assert {b.label for b in at.get("download_button")} == {"Launch script", "Kubernetes", "Ray Serve", "JSON"}
    assert not any("To export trial 1" in w.value for w in at.warning)  # given: no longer a warning
    script = downloads.exporter(url, STUDY, 1, "vllm", "Qwen/Qwen3-30B-A3B")()
    assert script.startswith(b"#!") and b"Qwen/Qwen3-30B-A3B" in script


def test_trials_tab_names_repeats_as_the_cli(env: Path) -> None:
    at = _study_page(tab="Trials")
    table = next(d.value for d in at.dataframe if "by" in d.value.columns)
    assert dict(zip(table["trial"], table["by"], strict=True)) == {0: "baseline", 1: "model", 2: "repeat of 1",
                                                                   3: "repeat of 0"}
    assert "same as" not in table.columns and "repeat of" not in table.columns  # no column of None


def test_margins_keep_the_digits_that_matter() -> None:
    m = advice.Margin("p90_tokens_per_s_per_user >= 40", "p90_tokens_per_s_per_user", ">=", 40.0, 40.1, 0.0025)
    assert m.text().endswith("40.1 ≥ 40.0 — 0.25% headroom")
    assert advice.percent(0.44) == "44%" and advice.percent(0.045) == "4.5%" and advice.percent(0.0) == "0%"
    assert advice.plural(1, "GPU") == "1 GPU" and advice.plural(8, "GPU") == "8 GPUs"


def test_topology_is_drawn_to_the_deployments_scale() -> None:
    one = {"cluster": {"nodes": 1, "gpus_per_node": 1}, "instances": [
        {"name": "mixed-0", "role": "mixed", "gpus": 1,
         "shards": [{"node": 0, "gpus": [0], "start_rank": 0, "local_ranks": 1}]}]}
    sixteen = {"cluster": {"nodes": 2, "gpus_per_node": 8}, "instances": [
        {"name": "mixed-0", "role": "mixed", "gpus": 16,
         "shards": [{"node": n, "gpus": list(range(8)), "start_rank": 8 * n, "local_ranks": 8} for n in (0, 1)]}]}
    small, big = trial_plots.topology_figure(one), trial_plots.topology_figure(sixteen)
    assert small.layout.width <= 400 and small.layout.height <= 400
    assert big.layout.width > 2 * small.layout.width


def test_plots_name_slos_by_label_trials_by_whole_numbers_and_the_defaults() -> None:
    from search_spaces import SLO

    levels = pd.DataFrame({"trial": [0, 1], "state": ["complete"] * 2, "config": ["a", "b"], "gpus": [1, 1],
                           "concurrency": [99, 37], "throughput_per_gpu": [24584.0, 11331.0],
                           "p90_tokens_per_s_per_user": [28.6, 36.0], "p90_ttft_ms": [1416.0, 1116.0],
                           "meets_slo": [False, True], "pareto": [False, True]})
    slos = [SLO(metric="p90_ttft_ms", op="<=", value=2000.0), SLO(metric="p90_tokens_per_s_per_user", op=">=",
                                                                  value=30.0)]
    fig = plots.pareto_figure(levels, "throughput_per_gpu", "p90_tokens_per_s_per_user", slos, baseline=[0])
    said = fig.layout.title.subtitle.text  # the SLOs not on the axes, under the title
    assert "P90 TTFT (ms) ≤ 2,000" in said and "p90_ttft_ms" not in said
    assert [a.text for a in fig.layout.annotations] == ["SLO P90 tok/s/user ≥ 30.0"]
    assert "vLLM's defaults (trial 0)" in [t.name for t in fig.data]
    curves = plots.curves_figure(levels, "throughput_per_gpu", "p90_tokens_per_s_per_user", [0, 1], baseline=[0])
    assert "trial 0 (vLLM's defaults)" in [t.name for t in curves.data]
    history = pd.DataFrame({"trial": [0, 1, 2, 3], "state": ["complete"] * 4, "value": [1.0, 2.0, 2.0, 1.0],
                            "feasible": [False, True, True, False], "best": [None, 2.0, 2.0, 2.0]})
    assert plots.history_figure(history, "throughput_per_gpu").layout.xaxis.dtick == 1


def test_studies_list_slos_by_label(env: Path, url: str) -> None:
    frame = data.studies_frame(data.studies(url))
    assert frame["SLOs"].tolist() == ["P90 TTFT (ms) ≤ 2,000 · P90 tok/s/user ≥ 30.0 · error rate ≤ 1.0 %"]
