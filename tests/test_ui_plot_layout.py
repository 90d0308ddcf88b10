"""Axis titles never lie on tick labels, on a second axis's title or under a legend: every chart builder of the
dashboard (``ui.plots``, ``ui.trial_plots``) leaves each axis room for its ticks and title (``automargin``, the
title set off from the numbers by ``plots.TITLE_STANDOFF``), and a legend laid out below the plot sits at the
figure's bottom edge, not a share of the plot's height down where the x-axis title is.

The figures are built from the real H200 study r7 (``tests.r7_study``) as the pages build them; the checks read
the figure objects the browser is sent.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
import pytest

from advisor import api
from tests import r7_study
from ui import data, plots, trial_plots

STUDY = r7_study.STUDY


def _builders() -> set[str]:
    """Every chart builder: the modules' functions named ``*_figure``."""
    return {f"{mod.__name__}.{n}" for mod in (plots, trial_plots)
            for n, f in inspect.getmembers(mod, inspect.isfunction) if n.endswith("_figure") and f.__module__ ==
            mod.__name__}


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, go.Figure]:
    url = r7_study.unpack(tmp_path_factory.mktemp("r7"))
    info = data.study(url, STUDY)
    assert info is not None
    x, y, objective = info.x_metric, info.y_metric, info.objectives[0]
    levels = data.levels(url, STUDY, info.stamp, x, y)
    hist = data.history(url, STUDY, info.stamp)
    trials_df, params_df = data.trials(url, STUDY, info.stamp)
    answer = api.answer(url, STUDY)
    assert answer is not None
    t = data.trial(url, STUDY, answer.trial, info.stamp)
    assert t is not None and t.topology and t.timings
    measured = trials_df[(trials_df["state"] == "complete") & trials_df["repeat_of"].isna()]
    p = params_df.set_index("trial").loc[measured["trial"]].reset_index()
    builds: dict[str, Callable[[], Any]] = {
        "ui.plots.pareto_figure": lambda: plots.pareto_figure(levels, x, y, info.slos,
                                                              answer=(answer.trial, answer.point.concurrency)),
        "ui.plots.curves_figure": lambda: plots.curves_figure(levels, x, y, [answer.trial], [0]),
        "ui.plots.history_figure": lambda: plots.history_figure(hist, objective, {0: "baseline"}),
        "ui.plots.parcoords_figure": lambda: plots.parcoords_figure(p, measured[objective].reset_index(drop=True),
                                                                    objective),
        "ui.plots.importance_figure": lambda: plots.importance_figure({"max_num_seqs": 0.7, "tp": 0.3}),
        "ui.plots.compare_figure": lambda: plots.compare_figure(levels, [0, answer.trial], x, y),
        "ui.plots.studies_front_figure": lambda: plots.studies_front_figure({STUDY: levels[levels["pareto"]]}, x, y),
        "ui.plots.studies_history_figure": lambda: plots.studies_history_figure({STUDY: hist}, objective),
        "ui.trial_plots.topology_figure": lambda: trial_plots.topology_figure(t.topology),
        "ui.trial_plots.levels_figure": lambda: trial_plots.levels_figure(list(t.measurements), info.slos),
        "ui.trial_plots.timings_figure": lambda: trial_plots.timings_figure(t.timings),
        "ui.trial_plots.imbalance_figure": lambda: trial_plots.imbalance_figure(list(t.measurements)),
    }
    assert set(builds) == _builders()  # a new chart builder is checked here too
    out = {name: build() for name, build in builds.items()}
    assert all(isinstance(f, go.Figure) for f in out.values()), out
    return out


def _axes(fig: go.Figure) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in fig.layout.to_plotly_json().items() if k.startswith(("xaxis", "yaxis"))}


def test_every_axis_of_every_chart_makes_room_for_its_ticks_and_title(figures: dict[str, go.Figure]) -> None:
    for name, fig in figures.items():
        axes = _axes(fig)
        assert axes, name
        for key, axis in axes.items():
            assert axis.get("automargin") is True, (name, key)
            assert (axis.get("title") or {}).get("standoff") == plots.TITLE_STANDOFF, (name, key)


def test_the_level_chart_s_two_axes_each_have_their_own_room(figures: dict[str, go.Figure]) -> None:
    """Throughput on the left, tokens/s per user on the right: each title is pushed out past its own ticks, and
    neither margin is a fixed width the other axis's labels could outgrow."""
    axes = _axes(figures["ui.trial_plots.levels_figure"])
    assert axes["yaxis2"]["side"] == "right" and axes["yaxis2"]["overlaying"] == "y"
    for key in ("yaxis", "yaxis2", "xaxis"):
        assert axes[key]["title"]["text"] and axes[key]["automargin"] is True, key


def test_a_legend_below_the_plot_sits_under_the_x_axis_title(figures: dict[str, go.Figure]) -> None:
    below = 0
    for name, fig in figures.items():
        legend = fig.layout.legend
        if legend.orientation == "h" and legend.y is not None and legend.yanchor == "bottom" and \
                legend.yref == "container":
            below += 1
            assert legend.y == 0, name
        else:  # no legend below the plot in paper coordinates, where it met the x-axis title
            assert legend.y is None or legend.y >= 0 or legend.yref == "container", name
    assert below >= 6  # the charts with a horizontal legend


def test_readable_is_idempotent() -> None:
    fig = plots.readable(go.Figure(layout={"legend": {"orientation": "h", "y": -0.2}, "yaxis2": {"side": "right"}}))
    again = plots.readable(go.Figure(fig))
    assert again.layout == fig.layout and again.layout.legend.yref == "container"
    assert again.layout.yaxis2.automargin is True
