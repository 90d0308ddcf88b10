"""One trial's figures: where its instances run (the topology map, also the Study page's recommendation), what
each load level measured, per-rank imbalance and where the time went. Pure functions, as ``ui.plots``."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ui import advice
from ui.plots import FRONT, MEETS, error_bars, label, readable

ROLE_COLORS = {"prefill": "#4C78A8", "decode": "#F58518", "mixed": "#54A24B"}
#: Alternating shades so that two neighbouring instances of one role stay apart.
ROLE_SHADES = {"prefill": ["#4C78A8", "#9ECAE9"], "decode": ["#F58518", "#FFBF79"], "mixed": ["#54A24B", "#88D27A"]}
IDLE = "#E6E6E6"
ROUTER = "#B279A2"
#: Pixels per GPU square (plus its gap) in the topology drawing, the widest it gets, the narrowest (its legend's
#: room) and the legend's height.
PX_PER_UNIT, MAX_PX, MIN_PX, LEGEND_PX = 44.0, 900.0, 360, 70


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
    labels: list[dict[str, Any]] = []  # the nodes' names, sized to the strip above the GPUs once the scale is known
    hx: list[float] = []
    hy: list[float] = []
    htext: list[str] = []
    lx: list[float] = []
    ly: list[float] = []
    ltext: list[str] = []
    for n in range(nodes):
        ox, oy = node_origin(n)
        # a translucent grey reads on a light and a dark page alike (no white box in dark mode)
        shapes.append({"type": "rect", "x0": ox, "y0": oy, "x1": ox + node_w, "y1": oy + node_h,
                       "line": {"color": "#888"}, "fillcolor": "rgba(128,128,128,0.08)", "layer": "below"})
        labels.append({"x": ox + 0.15, "y": oy + node_h - 0.08, "text": f"node {n}", "showarrow": False,
                       "xanchor": "left", "yanchor": "top"})
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
    x0, x1 = min(-0.3, rx0 - 0.2), max(width + 0.3, rx1 + 0.2)
    y0, y1 = bottom - 0.3, top + 1.2
    # drawn to scale: a GPU square is the same size whatever the deployment, until the drawing would be wider
    # than MAX_PX (a 1-GPU deployment is a small picture, not a page-wide router box)
    scale = min(PX_PER_UNIT, MAX_PX / (x1 - x0))
    # the strip above a node's GPUs is 0.7 units high: its name fits it at any scale, never over the squares
    size = max(6, min(11, int(0.55 * scale)))
    annotations += [{**a, "font": {"size": size}} for a in labels]
    fig.update_layout(
        meta="topology", shapes=shapes, annotations=annotations,
        width=max(MIN_PX, int((x1 - x0) * scale) + 20), height=int((y1 - y0) * scale) + 20 + LEGEND_PX,
        xaxis={"visible": False, "range": [x0, x1]},
        yaxis={"visible": False, "range": [y0, y1], "scaleanchor": "x"},
        margin={"t": 10, "l": 10, "r": 10, "b": 10}, legend={"orientation": "h", "y": -0.02},
        plot_bgcolor="rgba(0,0,0,0)", paper_bgcolor="rgba(0,0,0,0)",
    )
    return readable(fig)


def _index(instance: str) -> int:
    """``decode-3`` → 3 (0 when the name has no index)."""
    tail = instance.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def levels_figure(measurements: Sequence[Any], slos: Sequence[Any] = ()) -> go.Figure:
    """One trial's load levels: throughput per GPU (bars, left axis) and P90 tokens/s per user (line, right
    axis) by concurrency, each SLO on either metric a dashed line on that metric's own axis (``meta``
    "slo:METRIC")."""
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
    axes = {"throughput_per_gpu": ("y", MEETS), "p90_tokens_per_s_per_user": ("y2", FRONT)}
    ranges: dict[str, list[float]] = {}
    for slo in slos:
        if slo.metric not in axes:
            continue
        ref, color = axes[slo.metric]
        v = float(slo.value)
        fig.add_trace(go.Scatter(x=[conc[0], conc[-1]] if conc else [], y=[v, v], yaxis=ref, mode="lines",
                                 meta=f"slo:{slo.metric}", name=f"SLO {advice.slo_text(slo)}", hoverinfo="name",
                                 line={"color": color, "dash": "dash", "width": 2}))
        seen = [float(a) for a in df[slo.metric].dropna()]
        ranges[ref] = [0.0, max([v, *seen]) * 1.15]
    fig.update_layout(meta="levels", xaxis={"title": "concurrency", "type": "category"},
                      yaxis={"title": label("throughput_per_gpu"), **({"range": ranges["y"]} if "y" in ranges else {})},
                      yaxis2={"title": label("p90_tokens_per_s_per_user"), "overlaying": "y", "side": "right",
                              **({"range": ranges["y2"]} if "y2" in ranges else {})},
                      height=360, margin={"t": 20, "l": 70, "r": 70, "b": 40}, legend={"orientation": "h", "y": -0.3})
    return readable(fig)


def timings_figure(timings: Mapping[str, float]) -> go.Figure:
    """Where a trial's wall time went: deploy, warm-up, measure, teardown, as one stacked bar."""
    fig = go.Figure()
    for k, v in timings.items():
        fig.add_trace(go.Bar(x=[v], y=["trial"], orientation="h", name=k.removesuffix("_s"),
                             hovertemplate=f"{k.removesuffix('_s')}: %{{x:.1f}} s<extra></extra>"))
    fig.update_layout(meta="timings", barmode="stack", height=160, xaxis_title="seconds",
                      yaxis={"visible": False}, margin={"t": 10, "l": 10, "r": 10, "b": 40},
                      legend={"orientation": "h", "y": -0.6})
    return readable(fig)


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
        return readable(fig)
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
    return readable(fig)


def topology_svg(fig: go.Figure) -> str:
    """``topology_figure`` as a static SVG picture: the same boxes, squares, lines and labels at the same scale,
    without Plotly. The study page's headline shows the deployment at a glance (no hovers: the trial page has
    them), so its first picture needs neither Plotly's 4.7 MB bundle nor its drawing."""
    lay = fig.to_plotly_json()["layout"]
    (x0, x1), (y0, y1) = lay["xaxis"]["range"], lay["yaxis"]["range"]
    width, height = int(lay["width"]), int(lay["height"]) - LEGEND_PX
    s = min((width - 20) / (x1 - x0), (height - 20) / (y1 - y0))

    def px(x: float) -> float:
        return round(10 + (x - x0) * s, 1)

    def py(y: float) -> float:
        return round(10 + (y1 - y) * s, 1)

    # the legend in rows that fit the picture's width (a 1-GPU picture is narrower than one row of five names)
    legend: list[tuple[float, int, Any]] = []
    lx, row = 10.0, 0
    for trace in fig.data:
        if trace.name and trace.x is not None and list(trace.x) == [None] and trace.mode != "text":
            step = 22 + 6.5 * len(trace.name)
            if lx > 10.0 and lx + step - 6 > width:
                lx, row = 10.0, row + 1
            legend.append((lx, row, trace))
            lx += step
    tall = height + 30 + 18 * row
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{tall}" '
           f'viewBox="0 0 {width} {tall}" font-family="sans-serif">']
    for sh in sorted(lay.get("shapes", []), key=lambda sh: sh.get("layer") != "below"):  # Plotly's order
        line = sh.get("line") or {}
        stroke = f'stroke="{line.get("color", "#444")}" stroke-width="{line.get("width", 1)}"'
        if line.get("dash") == "dot":
            stroke += ' stroke-dasharray="2,3"'
        if sh["type"] == "rect":
            w, h = round((sh["x1"] - sh["x0"]) * s, 1), round((sh["y1"] - sh["y0"]) * s, 1)
            out.append(f'<rect x="{px(sh["x0"])}" y="{py(sh["y1"])}" width="{w}" height="{h}" '
                       f'fill="{sh.get("fillcolor", "none")}" {stroke}/>')
        elif sh["type"] == "line":
            out.append(f'<line x1="{px(sh["x0"])}" y1="{py(sh["y0"])}" x2="{px(sh["x1"])}" y2="{py(sh["y1"])}" '
                       f'{stroke}/>')
    for a in lay.get("annotations", []):
        font = a.get("font") or {}
        anchor = {"left": "start", "right": "end"}.get(a.get("xanchor", ""), "middle")
        base = {"top": "hanging", "bottom": "auto"}.get(a.get("yanchor", ""), "central")
        out.append(f'<text x="{px(a["x"])}" y="{py(a["y"])}" font-size="{font.get("size", 12)}" '
                   f'fill="{font.get("color", "#888")}" text-anchor="{anchor}" dominant-baseline="{base}">'
                   f'{html.escape(str(a["text"]))}</text>')
    for trace in fig.data:
        if trace.mode == "text" and trace.text is not None:
            for x, y, t in zip(trace.x, trace.y, trace.text, strict=True):
                out.append(f'<text x="{px(x)}" y="{py(y)}" font-size="9" fill="#222" text-anchor="middle" '
                           f'dominant-baseline="central">{html.escape(str(t))}</text>')
    for x, row, trace in legend:
        y = height + 10 + 18 * row
        out.append(f'<rect x="{x}" y="{y}" width="11" height="11" fill="{trace.marker.color}"/>'
                   f'<text x="{x + 15}" y="{y + 6}" font-size="11" fill="#888" '
                   f'dominant-baseline="central">{html.escape(trace.name)}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_markdown(svg: str, alt: str) -> str:
    """An SVG picture as a Markdown image (a ``data:`` URL): drawn with the text around it by the Markdown code
    the page has loaded already. ``st.image`` waits for a chunk of its own, and an ``<img>`` in raw HTML for the
    Markdown's raw-HTML plugin, each fetched and run only when the picture arrives — on a busy machine up to
    seconds after the text beside it."""
    data = base64.b64encode(svg.encode()).decode()
    words = alt.replace("[", "").replace("]", "")
    return f"![{words}](data:image/svg+xml;base64,{data})"
