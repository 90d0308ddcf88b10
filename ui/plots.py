"""The dashboard's figures: pure functions from the tables ``ui.data`` returns to Plotly figures.

No Streamlit here, so every figure can be built (and its data checked) in a plain test. Figures that a test
or a reader looks for carry ``layout.meta`` (``"pareto"``, ``"curves"``, ``"topology"`` …), and the traces of
the Pareto plot say what they hold in their own ``meta`` (``"levels"``: every measured trial × load level,
each exactly once; ``"pareto"``: the front, drawn again on top). One trial's figures (its topology, levels,
imbalance, timings) are in ``ui.trial_plots``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from search_spaces.metrics import metric as declared
from ui import advice

#: Above this many points scatter plots switch to WebGL (SVG gets slow to draw).
WEBGL_POINTS = 2500
MEETS, MISSES, FRONT = "#1F77B4", "#BBBBBB", "#D62728"

#: Room between an axis title and its tick labels (px).
TITLE_STANDOFF = 10


def readable(fig: go.Figure) -> go.Figure:
    """Room for every axis title and the legend, whatever the width of the tick labels: each axis pushes the
    figure's margin out to fit its ticks and title (``automargin``), its title ``TITLE_STANDOFF`` px off the
    numbers, so a title never lies on the tick labels, a second axis's title or the figure's edge; a legend laid
    out below the plot sits at the figure's bottom edge (container coordinates), under the x-axis title, not a
    share of the plot's height down, where the title met it. Every chart builder ends with it."""
    fig.update_xaxes(automargin=True, title_standoff=TITLE_STANDOFF)
    fig.update_yaxes(automargin=True, title_standoff=TITLE_STANDOFF)
    legend = fig.layout.legend
    if legend.orientation == "h" and legend.y is not None and legend.y < 0:
        fig.update_layout(legend={"yref": "container", "y": 0, "yanchor": "bottom"})
    return fig


def label(name: str) -> str:
    """An axis title for a metric: its declared label (``search_spaces.metrics``), else ``advice.short``."""
    m = declared(name)
    return m.title if m is not None else advice.short(name)


def error_bars(df: pd.DataFrame, metric: str) -> dict[str, Any] | None:
    """Plotly ``error_x``/``error_y`` from the levels' bootstrap intervals (``intervals[metric] = [low, high]``);
    ``None`` when no level of ``df`` carries one (a simulated study: no made-up bars)."""
    if "intervals" not in df or df.empty:
        return None
    lo, hi, any_ = [], [], False
    for v, iv in zip(df[metric].tolist(), df["intervals"].tolist(), strict=True):
        pair = (iv or {}).get(metric) if isinstance(iv, dict) else None
        if pair and len(pair) == 2 and v is not None and not (isinstance(v, float) and math.isnan(v)):
            hi.append(max(0.0, float(pair[1]) - float(v)))
            lo.append(max(0.0, float(v) - float(pair[0])))
            any_ = True
        else:
            hi.append(0.0)
            lo.append(0.0)
    if not any_:
        return None
    return {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo, "thickness": 1, "width": 3}


def _scatter(n_points: int) -> type[go.Scatter] | type[go.Scattergl]:
    return go.Scattergl if n_points > WEBGL_POINTS else go.Scatter


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def _floats(values: pd.Series | np.ndarray) -> np.ndarray:
    """A column as a float array, missing → NaN (a gap in a line). Plotly takes an array whole (and sends it
    base64-encoded); a list it validates and copies item by item, which costs a second per page of thousands."""
    return np.asarray(values, dtype=float)


def plottable(levels: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The levels the Pareto plot draws: those with both metrics measured."""
    if levels.empty:
        return levels
    return levels[levels[x].notna() & levels[y].notna()]


# ---------------------------------------------------------------------------------------------- study page


def baseline_name(trials: Iterable[int]) -> str:
    """The legend's name for vLLM's defaults: ``vLLM's defaults (trial 0, 3)``."""
    return f"vLLM's defaults (trial {', '.join(map(str, sorted(set(trials))))})"


def trial_axis(trials: pd.Series) -> dict[str, Any]:
    """An x axis of trial numbers: whole numbers only (no trial 0.5), about ten ticks."""
    span = float(trials.max() - trials.min()) if len(trials) else 0.0
    return {"title": "trial", "tick0": 0, "dtick": max(1, math.ceil(span / 10))}


def pareto_figure(levels: pd.DataFrame, x: str, y: str, slos: Sequence[Any] = (),
                  names: Mapping[str, str] | None = None, baseline: Iterable[int] = (),
                  external: pd.DataFrame | None = None, answer: tuple[int, int] | None = None) -> go.Figure:
    """Every trial × load level (x vs y), SLO bounds on these axes drawn as lines, the Pareto front on top.

    Points meeting every SLO are blue, others grey; hover shows the deployment in words — its short form from
    ``names`` (configuration text → ``DeploymentConfig.short()``) where given, which keeps the figure a quarter
    of the size the browser has to take in. The levels of vLLM's defaults (``baseline`` trials) are ringed and
    named in the legend (trace ``meta`` "baseline"). ``external``: imported operating points of the study's model
    and GPU (``ui.data.external``) drawn as a trace of their own (``meta`` "external"), never on the front.
    ``answer`` (trial, concurrency): the study's answer at its operating point, ringed (``meta`` "answer") —
    ranked for the whole cluster it may lie off the front of these per-GPU axes.
    """
    pts = plottable(levels, x, y)
    kind = _scatter(len(pts))
    fig = go.Figure()
    hover = (f"<b>trial %{{customdata[0]}}</b> @ c=%{{customdata[1]}}<br>%{{customdata[2]}}<br>"
             f"{label(x)}: %{{x:,.1f}}<br>{label(y)}: %{{y:,.1f}}<br>P90 TTFT %{{customdata[3]}} ms"
             "<extra></extra>")

    wrapped = {c: _wrap((names or {}).get(c) or c)  # once per deployment, not per level
               for c in pts["config"].astype(str).unique()}

    def custom(df: pd.DataFrame) -> np.ndarray:
        """Per point: trial, concurrency, deployment (wrapped), P90 TTFT — one object array, which Plotly takes
        as a whole instead of validating thousands of small lists."""
        out = np.empty((len(df), 4), dtype=object)
        out[:, 0] = df["trial"].to_numpy(dtype=int)
        out[:, 1] = df["concurrency"].to_numpy(dtype=int)
        out[:, 2] = df["config"].astype(str).map(wrapped).to_numpy()
        out[:, 3] = [_fmt(v) for v in df["p90_ttft_ms"].astype(float).tolist()]
        return out

    for name, part, color in (("meets every SLO", pts[pts["meets_slo"]], MEETS),
                              ("misses an SLO", pts[~pts["meets_slo"]], MISSES)):
        fig.add_trace(kind(x=_floats(part[x]), y=_floats(part[y]), mode="markers", name=name, meta="levels",
                           marker={"color": color, "size": 7, "opacity": 0.8}, customdata=custom(part),
                           hovertemplate=hover, error_x=error_bars(part, x), error_y=error_bars(part, y)))
    base_trials = sorted({int(t) for t in baseline})
    base = pts[pts["trial"].isin(base_trials)]
    if not base.empty:
        fig.add_trace(go.Scatter(x=_floats(base[x]), y=_floats(base[y]), mode="markers",
                                 name=baseline_name(base_trials),
                                 meta="baseline", marker={"color": "rgba(0,0,0,0)", "size": 15, "symbol": "diamond",
                                                          "line": {"color": "#2CA02C", "width": 2}},
                                 customdata=custom(base), hovertemplate=hover))
    front = pts[pts["pareto"]].sort_values(x)
    fig.add_trace(go.Scatter(x=_floats(front[x]), y=_floats(front[y]), mode="lines+markers", name="Pareto front",
                             meta="pareto", line={"color": FRONT, "width": 2, "shape": "hv"},
                             marker={"color": FRONT, "size": 11, "symbol": "star"}, customdata=custom(front),
                             hovertemplate=hover))
    if answer is not None:
        mine = pts[(pts["trial"] == answer[0]) & (pts["concurrency"] == answer[1])]
        if not mine.empty:
            fig.add_trace(go.Scatter(x=_floats(mine[x]), y=_floats(mine[y]), mode="markers", meta="answer",
                                     name=f"the answer (trial {answer[0]} @ c={answer[1]})",
                                     marker={"color": "rgba(0,0,0,0)", "size": 20, "symbol": "circle",
                                             "line": {"color": ANSWER, "width": 3}},
                                     customdata=custom(mine), hovertemplate=hover))
    if (ext := external_trace(external, x, y)) is not None:
        fig.add_trace(ext)
    others = []
    for slo in slos:
        text = f"SLO {advice.slo_text(slo)}"
        if slo.metric == x:
            fig.add_vline(x=slo.value, line={"dash": "dash", "color": "#555"}, annotation_text=text)
        elif slo.metric == y:
            fig.add_hline(y=slo.value, line={"dash": "dash", "color": "#555"}, annotation_text=text,
                          annotation_position="bottom right")
        else:
            others.append(advice.slo_text(slo))
    title: dict[str, Any] = {"text": f"{len(pts)} trial × load-level points", "font": {"size": 13},
                             "automargin": True, "x": 0, "xanchor": "left"}
    if others:  # a subtitle, wrapped: a narrow column would cut one long line
        title["subtitle"] = {"text": _wrap(f"also required: {', '.join(others)} (grey points miss one)"),
                             "font": {"size": 12}}
    fig.update_layout(meta="pareto", title=title,
                      xaxis_title=label(x),
                      yaxis_title=label(y), height=480, legend={"orientation": "h", "y": -0.18},
                      margin={"t": 50, "l": 60, "r": 20, "b": 40})
    return readable(fig)


def external_trace(points: pd.DataFrame | None, x: str, y: str) -> go.Scatter | None:
    """Imported operating points with both metrics as one labelled trace (``meta`` "external"), or None. Their
    text comes from files others wrote (a published table's source, a batch label): escaped, never markup."""
    if points is None or points.empty or x not in points or y not in points:
        return None
    pts = points[points[x].notna() & points[y].notna()]
    if pts.empty:
        return None
    batches = sorted({str(b) for b in pts["batch"]})
    custom = np.empty((len(pts), 4), dtype=object)
    custom[:, 0] = [html.escape(str(v)) for v in pts["batch"]]
    custom[:, 1] = [html.escape(f"{e}, c={c}") for e, c in zip(pts["engine"], pts["concurrency"], strict=True)]
    custom[:, 2] = [_wrap(html.escape(str(d))) for d in pts["deployment"]]
    custom[:, 3] = [html.escape(str(s)[:120]) for s in pts["source"]]
    hover = (f"<b>imported: %{{customdata[0]}}</b> (%{{customdata[1]}})<br>%{{customdata[2]}}<br>"
             f"{label(x)}: %{{x:,.1f}}<br>{label(y)}: %{{y:,.1f}}<br>%{{customdata[3]}}<extra></extra>")
    name = html.escape(f"imported ({', '.join(batches)[:60]}): {len(pts)}")
    return go.Scatter(x=_floats(pts[x]), y=_floats(pts[y]), mode="markers", name=name, meta="external",
                      marker={"color": "#FF7F0E", "size": 9, "symbol": "diamond-open", "line": {"width": 2}},
                      customdata=custom, hovertemplate=hover)


def _wrap(text: str, width: int = 70) -> str:
    """Hover text on several lines (Plotly does not wrap)."""
    out, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    out.append(line)
    return "<br>".join(out)


def curves_figure(levels: pd.DataFrame, x: str, y: str, highlight: Iterable[int] = (),
                  baseline: Iterable[int] = ()) -> go.Figure:
    """Each deployment's curve across its load levels; highlighted trials in colour, the rest as grey lines
    (one trace with gaps, so thousands of trials stay one trace); vLLM's defaults (``baseline`` trials) named
    so in the legend and dashed."""
    base_trials = {int(t) for t in baseline}
    pts = plottable(levels, x, y).sort_values(["trial", "concurrency"])
    chosen = list(dict.fromkeys(int(t) for t in highlight))
    rest = pts[~pts["trial"].isin(chosen)]
    # every trial's levels, then a NaN gap before the next trial: one array pair, no loop over thousands of trials
    trial = rest["trial"].to_numpy()
    gaps = np.flatnonzero(trial[1:] != trial[:-1]) + 1
    xs = np.insert(_floats(rest[x]), gaps, np.nan)
    ys = np.insert(_floats(rest[y]), gaps, np.nan)
    fig = go.Figure()
    fig.add_trace(_scatter(len(xs))(x=xs, y=ys, mode="lines", name="other trials", hoverinfo="skip",
                                    line={"color": "rgba(150,150,150,0.35)", "width": 1}))
    for t in chosen:
        g = pts[pts["trial"] == t]
        if g.empty:
            continue
        # the concurrency is in the hover and on the curve's two ends only: labels on every point overlap
        ends = [f"c={c}" if k in (0, len(g) - 1) else "" for k, c in enumerate(g["concurrency"].astype(int))]
        fig.add_trace(go.Scatter(
            x=_floats(g[x]), y=_floats(g[y]), mode="lines+markers+text", meta=int(t),
            name=f"trial {t} (vLLM's defaults)" if t in base_trials else f"trial {t}",
            line={"dash": "dash"} if t in base_trials else None,
            text=ends, textposition="top right", textfont={"size": 10}, customdata=g["concurrency"].astype(int),
            error_x=error_bars(g, x), error_y=error_bars(g, y),
            hovertemplate=f"trial {t} @ c=%{{customdata}}<br>{_wrap(str(g['config'].iloc[0]))}<br>"
                          f"{label(x)} %{{x:,.1f}}<br>{label(y)} %{{y:,.1f}}<extra></extra>",
        ))
    fig.update_layout(meta="curves", xaxis_title=label(x), yaxis_title=label(y), height=420,
                      margin={"t": 30, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.2})
    return readable(fig)


#: How convergence draws each kind of trial: vLLM's defaults and repeats on fresh deploys are measured outside
#: the search, so they are told apart from its trials (``history_figure``).
KINDS = {"search": ("search trial", "circle"), "baseline": ("vLLM's defaults (each run)", "diamond"),
         "repeat": ("repeat on a fresh deploy", "x")}
ANSWER = "#FF7F0E"


def history_figure(history: pd.DataFrame, objective: str, kinds: Mapping[int, str] | None = None,
                   answer: tuple[int, float] | None = None) -> go.Figure:
    """Convergence: each trial's objective value and the best so far, the search's trials, vLLM's defaults and
    the repeats each as a trace of its own (``meta`` "search", "baseline", "repeat"; ``kinds``: trial →
    kind, search when absent), filled when the trial met the SLOs; and ``answer`` (trial, value): the
    study's answer ringed (``meta`` "answer"), which a best-so-far of single runs may not reach."""
    fig = go.Figure()
    h = history[history["value"].notna()]
    kind = h["trial"].map(lambda t: (kinds or {}).get(int(t), "search"))
    for k, (name, symbol) in KINDS.items():
        part = h[kind == k]
        if part.empty:
            continue
        colors = np.where(part["feasible"].astype(bool).to_numpy(), MEETS, MISSES)
        fig.add_trace(_scatter(len(part))(x=_floats(part["trial"]), y=_floats(part["value"]), mode="markers",
                                          name=name, meta=k,
                                          marker={"color": colors, "size": 6 if k == "search" else 10,
                                                  "symbol": symbol}))
    b = history[history["best"].notna()]
    fig.add_trace(go.Scatter(x=_floats(b["trial"]), y=_floats(b["best"]), mode="lines",
                             name="best single run so far", line={"color": FRONT, "shape": "hv"}))
    if answer is not None:
        fig.add_trace(go.Scatter(x=[float(answer[0])], y=[float(answer[1])], mode="markers", meta="answer",
                                 name=f"the answer (trial {answer[0]})",
                                 marker={"color": "rgba(0,0,0,0)", "size": 18, "symbol": "circle",
                                         "line": {"color": ANSWER, "width": 3}}))
    fig.update_layout(meta="history", xaxis=trial_axis(history["trial"]), yaxis_title=label(objective), height=320,
                      margin={"t": 20, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.25})
    return readable(fig)


def _encode(values: pd.Series) -> tuple[np.ndarray, list[float], list[str]]:
    """A parameter column as positions on a parallel-coordinates axis: every value a tick, missing ones
    (the parameter does not exist in that branch of the space) at "–"."""
    present = [v for v in values.dropna().unique().tolist()]
    try:
        present.sort()
    except TypeError:
        present.sort(key=str)
    ticks = ["–", *map(_tick, present)]
    index = {str(v): i + 1 for i, v in enumerate(present)}
    pos = _floats(values.map(lambda v: index[str(v)], na_action="ignore").fillna(0))
    return pos, [float(i) for i in range(len(ticks))], ticks


def _tick(v: Any) -> str:
    """8.0 → "8" (a parameter column with gaps is float in pandas; its values are counts)."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def parcoords_figure(params: pd.DataFrame, objective: pd.Series, objective_name: str,
                     order: Sequence[str] = (), max_dims: int = 6) -> go.Figure:
    """Parameters (one axis each, categorical) against the objective (last axis, and the line colour)."""
    cols = [c for c in params.columns if c not in ("trial", "state") and params[c].nunique(dropna=False) > 1]
    ranked = [c for c in order if c in cols] + sorted(c for c in cols if c not in order)
    dims = []
    for c in ranked[:max_dims]:
        pos, tickvals, ticktext = _encode(params[c])
        dims.append({"label": c, "values": pos, "tickvals": tickvals, "ticktext": ticktext,
                     "range": [0, max(tickvals) if tickvals else 1]})
    obj = _floats(objective)
    dims.append({"label": objective_name, "values": obj})
    fig = go.Figure(go.Parcoords(dimensions=dims, line={"color": obj, "colorscale": "Viridis", "showscale": True}))
    fig.update_layout(meta="parcoords", height=440, margin={"t": 70, "l": 50, "r": 50, "b": 30},
                      font={"size": 11})
    return readable(fig)


def importance_figure(values: Mapping[str, float], top: int = 15) -> go.Figure:
    items = sorted(values.items(), key=lambda kv: kv[1])[-top:]
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[k for k, _ in items], orientation="h",
                           marker={"color": MEETS}))
    fig.update_layout(meta="importance", xaxis_title="importance", height=max(240, 24 * len(items) + 80),
                      margin={"t": 20, "l": 10, "r": 20, "b": 40})
    return readable(fig)


# ---------------------------------------------------------------------------------------------- compare page


def compare_figure(levels: pd.DataFrame, trials: Sequence[int], x: str, y: str) -> go.Figure:
    """The chosen trials' curves on the study's two axes, everything else left out."""
    fig = curves_figure(levels[levels["trial"].isin(list(trials))], x, y, highlight=trials)
    fig.update_layout(meta="compare")
    return fig


# ---------------------------------------------------------------------------------------------- compare studies


def plain(text: str) -> str:
    """User text (a study name) for a Plotly label: Plotly renders a subset of HTML in names, hover texts and
    titles (``<a href>`` becomes a clickable link) and fills ``%{…}`` in hover templates; escaped, it shows as
    written."""
    return html.escape(text, quote=False).replace("%{", "%&#123;")


def studies_front_figure(fronts: Mapping[str, pd.DataFrame], x: str, y: str) -> go.Figure:
    """Several studies' Pareto fronts (their SLO-meeting non-dominated levels) overlaid, one colour each; each
    trace's ``meta`` is its study's name."""
    fig = go.Figure()
    for name, front in fronts.items():
        f = front.sort_values(x)
        fig.add_trace(go.Scatter(
            x=_floats(f[x]), y=_floats(f[y]), mode="lines+markers", name=plain(name), meta=name,
            line={"shape": "hv", "width": 2}, marker={"size": 9},
            customdata=np.stack([f["trial"].to_numpy(dtype=int), f["concurrency"].to_numpy(dtype=int)], axis=1)
            if len(f) else None,
            hovertemplate=f"<b>{plain(name)}</b>: trial %{{customdata[0]}} @ c=%{{customdata[1]}}<br>{label(x)} "
                          f"%{{x:,.1f}}<br>{label(y)} %{{y:,.1f}}<extra></extra>"))
    fig.update_layout(meta="studies_front", xaxis_title=label(x), yaxis_title=label(y), height=440,
                      margin={"t": 20, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.2})
    return readable(fig)


def studies_history_figure(histories: Mapping[str, pd.DataFrame], objective: str) -> go.Figure:
    """Several studies' best-so-far curves (objective against trial number) overlaid."""
    fig = go.Figure()
    for name, h in histories.items():
        b = h[h["best"].notna()]
        fig.add_trace(go.Scatter(x=_floats(b["trial"]), y=_floats(b["best"]), mode="lines", name=plain(name), meta=name,
                                 line={"shape": "hv", "width": 2}))
    trials = pd.concat([h["trial"] for h in histories.values()]) if histories else pd.Series(dtype=float)
    fig.update_layout(meta="studies_history", xaxis=trial_axis(trials), yaxis_title=f"best {label(objective)} so far",
                      height=340, margin={"t": 20, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.25})
    return readable(fig)
