"""The dashboard's figures: pure functions from the tables ``ui.data`` returns to Plotly figures.

No Streamlit here, so every figure can be built (and its data checked) in a plain test. Figures that a test
or a reader looks for carry ``layout.meta`` (``"pareto"``, ``"curves"``, ``"topology"`` …), and the traces of
the Pareto plot say what they hold in their own ``meta`` (``"levels"``: every measured trial × load level,
each exactly once; ``"pareto"``: the front, drawn again on top).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ui import advice

#: Above this many points scatter plots switch to WebGL (SVG gets slow to draw).
WEBGL_POINTS = 2500
ROLE_COLORS = {"prefill": "#4C78A8", "decode": "#F58518", "mixed": "#54A24B"}
#: Alternating shades so that two neighbouring instances of one role stay apart.
ROLE_SHADES = {"prefill": ["#4C78A8", "#9ECAE9"], "decode": ["#F58518", "#FFBF79"], "mixed": ["#54A24B", "#88D27A"]}
IDLE = "#E6E6E6"
ROUTER = "#B279A2"
MEETS, MISSES, FRONT = "#1F77B4", "#BBBBBB", "#D62728"

LABELS = {
    "throughput_per_gpu": "throughput per GPU (tok/s)",
    "output_throughput_per_gpu": "output throughput per GPU (tok/s)",
    "request_throughput": "requests/s",
    "p50_tokens_per_s_per_user": "P50 tokens/s per user",
    "p90_tokens_per_s_per_user": "P90 tokens/s per user",
    "p99_tokens_per_s_per_user": "P99 tokens/s per user",
}


def label(metric: str) -> str:
    """An axis title for a metric: its words when known, else its short name with the unit (``P90 TTFT (ms)``)."""
    return LABELS.get(metric) or advice.short(metric)


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


def pareto_figure(levels: pd.DataFrame, x: str, y: str, slos: Sequence[Any] = (),
                  names: Mapping[str, str] | None = None) -> go.Figure:
    """Every trial × load level (x vs y), SLO bounds on these axes drawn as lines, the Pareto front on top.

    Points meeting every SLO are blue, others grey; hover shows the deployment in words — its short form from
    ``names`` (configuration text → ``DeploymentConfig.short()``) where given, which keeps the figure a quarter
    of the size the browser has to take in.
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
    front = pts[pts["pareto"]].sort_values(x)
    fig.add_trace(go.Scatter(x=_floats(front[x]), y=_floats(front[y]), mode="lines+markers", name="Pareto front",
                             meta="pareto", line={"color": FRONT, "width": 2, "shape": "hv"},
                             marker={"color": FRONT, "size": 11, "symbol": "star"}, customdata=custom(front),
                             hovertemplate=hover))
    others = []
    for slo in slos:
        text = f"SLO {slo.metric} {slo.op} {slo.value:g}"
        if slo.metric == x:
            fig.add_vline(x=slo.value, line={"dash": "dash", "color": "#555"}, annotation_text=text)
        elif slo.metric == y:
            fig.add_hline(y=slo.value, line={"dash": "dash", "color": "#555"}, annotation_text=text,
                          annotation_position="bottom right")
        else:
            others.append(f"{slo.metric} {slo.op} {slo.value:g}")
    title = f"{len(pts)} trial × load-level points"
    if others:
        title += f" — also required: {', '.join(others)} (grey points miss one)"
    fig.update_layout(meta="pareto", title={"text": title, "font": {"size": 13}}, xaxis_title=label(x),
                      yaxis_title=label(y), height=480, legend={"orientation": "h", "y": -0.18},
                      margin={"t": 50, "l": 60, "r": 20, "b": 40})
    return fig


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


def curves_figure(levels: pd.DataFrame, x: str, y: str, highlight: Iterable[int] = ()) -> go.Figure:
    """Each deployment's curve across its load levels; highlighted trials in colour, the rest as grey lines
    (one trace with gaps, so thousands of trials stay one trace)."""
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
            x=_floats(g[x]), y=_floats(g[y]), mode="lines+markers+text", name=f"trial {t}", meta=int(t),
            text=ends, textposition="top right", textfont={"size": 10}, customdata=g["concurrency"].astype(int),
            error_x=error_bars(g, x), error_y=error_bars(g, y),
            hovertemplate=f"trial {t} @ c=%{{customdata}}<br>{_wrap(str(g['config'].iloc[0]))}<br>"
                          f"{label(x)} %{{x:,.1f}}<br>{label(y)} %{{y:,.1f}}<extra></extra>",
        ))
    fig.update_layout(meta="curves", xaxis_title=label(x), yaxis_title=label(y), height=420,
                      margin={"t": 30, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.2})
    return fig


def history_figure(history: pd.DataFrame, objective: str) -> go.Figure:
    """Convergence: each trial's objective value and the best so far."""
    fig = go.Figure()
    h = history[history["value"].notna()]
    colors = np.where(h["feasible"].astype(bool).to_numpy(), MEETS, MISSES)
    fig.add_trace(_scatter(len(h))(x=_floats(h["trial"]), y=_floats(h["value"]), mode="markers", name="trial",
                                   marker={"color": colors, "size": 6}))
    b = history[history["best"].notna()]
    fig.add_trace(go.Scatter(x=_floats(b["trial"]), y=_floats(b["best"]), mode="lines", name="best so far",
                             line={"color": FRONT, "shape": "hv"}))
    fig.update_layout(meta="history", xaxis_title="trial", yaxis_title=label(objective), height=320,
                      margin={"t": 20, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.25})
    return fig


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
    return fig


def importance_figure(values: Mapping[str, float], top: int = 15) -> go.Figure:
    items = sorted(values.items(), key=lambda kv: kv[1])[-top:]
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[k for k, _ in items], orientation="h",
                           marker={"color": MEETS}))
    fig.update_layout(meta="importance", xaxis_title="importance", height=max(240, 24 * len(items) + 80),
                      margin={"t": 20, "l": 10, "r": 20, "b": 40})
    return fig


# ---------------------------------------------------------------------------------------------- trial page


def topology_figure(topology: Mapping[str, Any], router_label: str = "router") -> go.Figure:
    """Instances on nodes and GPUs (``Topology.to_dict()``): one box per node, one square per GPU coloured by
    the role of the instance on it (prefill, decode, mixed; grey when idle), the router above, a line from it
    to each instance's head rank, and dashed prefill → decode lines for the KV transfer."""
    cluster = topology.get("cluster") or {}
    nodes = int(cluster.get("nodes") or 1)
    gpn = int(cluster.get("gpus_per_node") or 8)
    gcols = gpn if gpn <= 8 else 8
    grows = math.ceil(gpn / gcols)
    cell, gap = 1.0, 0.2
    node_w, node_h = gcols * (cell + gap) + gap, grows * (cell + gap) + gap + 0.7
    per_row = max(1, min(nodes, 4 if gcols >= 8 else 6))
    node_rows = math.ceil(nodes / per_row)
    pad = 0.6

    def node_origin(n: int) -> tuple[float, float]:
        r, c = divmod(n, per_row)
        return c * (node_w + pad), -(r * (node_h + pad))

    def gpu_center(node: int, gpu: int) -> tuple[float, float]:
        ox, oy = node_origin(node)
        r, c = divmod(gpu, gcols)
        return ox + gap + c * (cell + gap) + cell / 2, oy + node_h - 0.7 - gap - r * (cell + gap) - cell / 2

    owner: dict[tuple[int, int], tuple[str, str, int]] = {}
    heads: list[tuple[str, str, tuple[float, float]]] = []
    for inst in topology.get("instances", []):
        role, name = str(inst.get("role")), str(inst.get("name"))
        for shard in inst.get("shards", []):
            gpus = list(shard.get("gpus", []))
            ranks = max(1, int(shard.get("local_ranks") or 1))
            per_rank = max(1, len(gpus) // ranks)
            for k, g in enumerate(gpus):
                owner[(int(shard["node"]), int(g))] = (role, name, int(shard.get("start_rank", 0)) + k // per_rank)
            if int(shard.get("start_rank", 0)) == 0 and gpus:
                heads.append((role, name, gpu_center(int(shard["node"]), int(gpus[0]))))

    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    hx: list[float] = []
    hy: list[float] = []
    htext: list[str] = []
    lx: list[float] = []
    ly: list[float] = []
    ltext: list[str] = []
    for n in range(nodes):
        ox, oy = node_origin(n)
        shapes.append({"type": "rect", "x0": ox, "y0": oy, "x1": ox + node_w, "y1": oy + node_h,
                       "line": {"color": "#888"}, "fillcolor": "#FAFAFA", "layer": "below"})
        annotations.append({"x": ox + 0.15, "y": oy + node_h - 0.35, "text": f"node {n}", "showarrow": False,
                            "xanchor": "left", "font": {"size": 11}})
        for g in range(gpn):
            cx, cy = gpu_center(n, g)
            role, name, rank = owner.get((n, g), ("idle", "", -1))
            shades = ROLE_SHADES.get(role, [IDLE])
            color = shades[_index(name) % len(shades)]
            shapes.append({"type": "rect", "x0": cx - cell / 2, "y0": cy - cell / 2, "x1": cx + cell / 2,
                           "y1": cy + cell / 2, "fillcolor": color, "line": {"color": "#444", "width": 1}})
            hx.append(cx)
            hy.append(cy)
            htext.append(f"node {n} GPU {g}: " + (f"{name}, DP rank {rank}" if name else "idle"))
            if name and gpn <= 16:
                lx.append(cx)
                ly.append(cy)
                ltext.append(f"{name[0].upper()}{_index(name)}")
    width = min(nodes, per_row) * (node_w + pad) - pad
    top = node_h + 1.0
    half = max(1.6, 0.09 * len(router_label) + 0.4)
    rx0, rx1 = width / 2 - half, width / 2 + half
    shapes.append({"type": "rect", "x0": rx0, "y0": top, "x1": rx1, "y1": top + 0.9, "fillcolor": ROUTER,
                   "line": {"color": "#444"}})
    annotations.append({"x": width / 2, "y": top + 0.45, "text": router_label, "showarrow": False,
                        "font": {"color": "white", "size": 12}})
    for role, _name, (cx, cy) in heads:
        shapes.append({"type": "line", "x0": width / 2, "y0": top, "x1": cx, "y1": cy + cell / 2,
                       "line": {"color": ROLE_COLORS.get(role, "#666"), "width": 1.5}, "layer": "below"})
    prefill = [h for h in heads if h[0] == "prefill"]
    decode = [h for h in heads if h[0] == "decode"]
    for _, _, (px, py) in prefill[:8]:
        for _, _, (dx, dy) in decode[:8]:
            shapes.append({"type": "line", "x0": px, "y0": py, "x1": dx, "y1": dy,
                           "line": {"color": "#999", "width": 1, "dash": "dot"}})
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=hx, y=hy, mode="markers", marker={"size": 14, "opacity": 0}, hovertext=htext,
                             hoverinfo="text", showlegend=False))
    if lx:
        fig.add_trace(go.Scatter(x=lx, y=ly, mode="text", text=ltext, textfont={"size": 9}, hoverinfo="skip",
                                 showlegend=False))
    for name, color in (("prefill", ROLE_COLORS["prefill"]), ("decode", ROLE_COLORS["decode"]),
                        ("mixed (prefill + decode)", ROLE_COLORS["mixed"]), ("idle GPU", IDLE), ("router", ROUTER)):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker={"size": 12, "color": color, "symbol": "square"}))
    bottom = -(node_rows - 1) * (node_h + pad)
    units_w, units_h = width + 0.6, top + 1.5 - bottom
    fig.update_layout(
        meta="topology", shapes=shapes, annotations=annotations,
        height=int(min(900, max(220, 1000 * units_h / units_w)) + 60),
        xaxis={"visible": False, "range": [-0.3, width + 0.3]},
        yaxis={"visible": False, "range": [bottom - 0.3, top + 1.2], "scaleanchor": "x"},
        margin={"t": 10, "l": 10, "r": 10, "b": 10}, legend={"orientation": "h", "y": -0.02},
        plot_bgcolor="white",
    )
    return fig


def _index(instance: str) -> int:
    """``decode-3`` → 3 (0 when the name has no index)."""
    tail = instance.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def levels_figure(measurements: Sequence[Any]) -> go.Figure:
    """One trial's load levels: throughput per GPU (bars) and P90 tokens/s per user (line) by concurrency."""
    conc = [str(m.concurrency) for m in measurements]
    df = pd.DataFrame({"throughput_per_gpu": [m.throughput_per_gpu for m in measurements],
                       "p90_tokens_per_s_per_user": [m.p90_tokens_per_s_per_user for m in measurements],
                       "intervals": [m.intervals or {} for m in measurements]})
    fig = go.Figure()
    fig.add_trace(go.Bar(x=conc, y=df["throughput_per_gpu"], name=label("throughput_per_gpu"),
                         marker={"color": MEETS}, error_y=error_bars(df, "throughput_per_gpu")))
    fig.add_trace(go.Scatter(x=conc, y=df["p90_tokens_per_s_per_user"], yaxis="y2",
                             mode="lines+markers", name=label("p90_tokens_per_s_per_user"), line={"color": FRONT},
                             error_y=error_bars(df, "p90_tokens_per_s_per_user")))
    fig.update_layout(meta="levels", xaxis={"title": "concurrency", "type": "category"},
                      yaxis_title=label("throughput_per_gpu"),
                      yaxis2={"title": label("p90_tokens_per_s_per_user"), "overlaying": "y", "side": "right"},
                      height=340, margin={"t": 20, "l": 60, "r": 60, "b": 40}, legend={"orientation": "h", "y": -0.3})
    return fig


def timings_figure(timings: Mapping[str, float]) -> go.Figure:
    """Where a trial's wall time went: deploy, warm-up, measure, teardown, as one stacked bar."""
    fig = go.Figure()
    for k, v in timings.items():
        fig.add_trace(go.Bar(x=[v], y=["trial"], orientation="h", name=k.removesuffix("_s"),
                             hovertemplate=f"{k.removesuffix('_s')}: %{{x:.1f}} s<extra></extra>"))
    fig.update_layout(meta="timings", barmode="stack", height=160, xaxis_title="seconds",
                      yaxis={"visible": False}, margin={"t": 10, "l": 10, "r": 10, "b": 40},
                      legend={"orientation": "h", "y": -0.6})
    return fig


def rank_loads(measurements: Sequence[Any]) -> pd.DataFrame:
    """Tokens per DP rank per instance per level, where the executor scraped them (``raw["metrics"]``)."""
    rows = []
    for m in measurements:
        for inst, rec in ((m.raw or {}).get("metrics") or {}).items():
            for rank, tokens in (rec.get("tokens_per_rank") or {}).items():
                rows.append({"concurrency": m.concurrency, "instance": inst, "role": rec.get("role"),
                             "rank": str(rank), "tokens": tokens})
    return pd.DataFrame(rows, columns=["concurrency", "instance", "role", "rank", "tokens"])


def imbalance_figure(measurements: Sequence[Any]) -> go.Figure | None:
    """Per-rank load where measured (tokens per DP rank), else the imbalance factors per level
    (``dp_imbalance`` = max/mean over ranks; the performance model's per-role factors); ``None`` if neither."""
    loads = rank_loads(measurements)
    fig = go.Figure()
    if not loads.empty:
        for (inst, conc), g in loads.groupby(["instance", "concurrency"]):
            fig.add_trace(go.Bar(x=[f"{inst} r{r}" for r in g["rank"]], y=g["tokens"].tolist(),
                                 name=f"{inst} @ c{conc}"))
        fig.update_layout(meta="imbalance", barmode="group", yaxis_title="tokens per DP rank", height=320)
        return fig
    series: dict[str, list[float | None]] = {}
    conc = [str(m.concurrency) for m in measurements]
    for i, m in enumerate(measurements):
        found = {"dp_imbalance (max/mean)": m.dp_imbalance}
        found.update({k: v for k, v in (m.raw or {}).items()
                      if isinstance(v, (int, float)) and k.endswith(("_dp_imbalance", "_expert_imbalance"))})
        for k, v in found.items():
            series.setdefault(k, [None] * len(measurements))[i] = v
    series = {k: v for k, v in series.items() if any(x is not None for x in v)}
    if not series:
        return None
    for k, v in series.items():
        fig.add_trace(go.Bar(x=conc, y=v, name=k))
    fig.add_hline(y=1.0, line={"dash": "dot", "color": "#555"}, annotation_text="balanced")
    fig.update_layout(meta="imbalance", barmode="group", xaxis={"title": "concurrency", "type": "category"},
                      yaxis_title="max / mean load",
                      height=320, margin={"t": 20, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.3})
    return fig


# ---------------------------------------------------------------------------------------------- compare page


def compare_figure(levels: pd.DataFrame, trials: Sequence[int], x: str, y: str) -> go.Figure:
    """The chosen trials' curves on the study's two axes, everything else left out."""
    fig = curves_figure(levels[levels["trial"].isin(list(trials))], x, y, highlight=trials)
    fig.update_layout(meta="compare")
    return fig


# ---------------------------------------------------------------------------------------------- compare studies


def studies_front_figure(fronts: Mapping[str, pd.DataFrame], x: str, y: str) -> go.Figure:
    """Several studies' Pareto fronts (their SLO-meeting non-dominated levels) overlaid, one colour each; each
    trace's ``meta`` is its study's name."""
    fig = go.Figure()
    for name, front in fronts.items():
        f = front.sort_values(x)
        fig.add_trace(go.Scatter(
            x=_floats(f[x]), y=_floats(f[y]), mode="lines+markers", name=name, meta=name,
            line={"shape": "hv", "width": 2}, marker={"size": 9},
            customdata=np.stack([f["trial"].to_numpy(dtype=int), f["concurrency"].to_numpy(dtype=int)], axis=1)
            if len(f) else None,
            hovertemplate=f"<b>{name}</b>: trial %{{customdata[0]}} @ c=%{{customdata[1]}}<br>{label(x)} "
                          f"%{{x:,.1f}}<br>{label(y)} %{{y:,.1f}}<extra></extra>"))
    fig.update_layout(meta="studies_front", xaxis_title=label(x), yaxis_title=label(y), height=440,
                      margin={"t": 20, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.2})
    return fig


def studies_history_figure(histories: Mapping[str, pd.DataFrame], objective: str) -> go.Figure:
    """Several studies' best-so-far curves (objective against trial number) overlaid."""
    fig = go.Figure()
    for name, h in histories.items():
        b = h[h["best"].notna()]
        fig.add_trace(go.Scatter(x=_floats(b["trial"]), y=_floats(b["best"]), mode="lines", name=name, meta=name,
                                 line={"shape": "hv", "width": 2}))
    fig.update_layout(meta="studies_history", xaxis_title="trial", yaxis_title=f"best {label(objective)} so far",
                      height=340, margin={"t": 20, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h", "y": -0.25})
    return fig
