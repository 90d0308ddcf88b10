"""Which deployment to run, and why: pure functions from the tables ``ui.data`` returns to a recommendation.

Every number here is an *operating point*: one trial measured at one load level (concurrency), so that a
throughput per GPU always travels with the concurrency it was measured at and the tokens/s per user of that
same level (``OperatingPoint.text``). Nothing here imports Streamlit, so it is tested without a page.

The recommendation is the study's answer (``advisor.answer``, handed in as a ``Chosen``): the trial and level
``advisor best`` names, vLLM's defaults when no searched deployment beats them — unless the reader names an
operating point the answer does not reach (at least that many ``y``, tokens/s per user), or there is no answer
to hand in; then it is the level with the most ``x`` among levels of complete trials that meet every SLO (and
that ``y``). The front is deduplicated by deployment: a deployment measured at several levels, or repeated,
counts once.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from search_spaces.metrics import metric as declared
from search_spaces.workload import LEVEL_FLAGS, routing_label, slo_excess


def short(name: str) -> str:
    """A caption or table header: a declared metric's short name (``P90 TTFT (ms)``, ``tok/s/GPU``), else the
    column's words with ``_ms``/``_s`` as a unit."""
    m = declared(name)
    if m is not None:
        return m.short
    words = name.split("_")
    unit = {"ms": "ms", "s": "s"}.get(words[-1])
    if unit:
        words = words[:-1]
    head = " ".join(w.upper() if w in ("ttft", "tpot", "itl", "e2el", "kv", "dp", "eplb") or
                    (w[:1] == "p" and w[1:].isdigit()) else w for w in words)
    return f"{head} ({unit})" if unit else head


def has_unit(name: str) -> bool:
    """Whether ``name`` is a metric SLOs may bound (its values are shown with their unit by ``value_text``)."""
    m = declared(name)
    return m is not None and m.slo


def higher(name: str) -> bool:
    """Whether more of ``name`` is better (a declared metric; other columns: no)."""
    m = declared(name)
    return m is not None and m.higher_is_better


def num(v: Any, digits: int | None = None) -> str:
    """A number for people: thousands separators; no decimals above 1,000, one above 10, two below;
    "–" for no data (never 0)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return f"{v:,}"
    v = float(v)
    if digits is None:
        digits = 0 if abs(v) >= 1000 else 1 if abs(v) >= 10 else 2
    return f"{v:,.{digits}f}"


def value_text(name: str, v: Any) -> str:
    """A value with its unit: ``812 ms``, ``40.1 tok/s/user``, ``0.4 %`` for an error rate."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if not has_unit(name) or _share(name):
        return bare(name, v)
    return f"{num(v)} {declared(name).unit}"  # type: ignore[union-attr]


def _share(name: str) -> bool:
    m = declared(name)
    return m is not None and m.slo and m.unit == "share"


def bare(name: str, v: Any) -> str:
    """A value without its unit (the label carries it); a share (the error rate) in percent."""
    if v is not None and not (isinstance(v, float) and math.isnan(v)) and _share(name):
        return f"{float(v) * 100:.1f} %"
    return num(v)


def bound_text(slo: Any) -> str:
    """``≥ 25`` / ``≤ 2,000`` / ``≤ 1.0 %``."""
    v = slo.bound if hasattr(slo, "bound") else slo.value
    return f"{'≥' if slo.op == '>=' else '≤'} {bare(slo.metric, v)}"


def slo_text(slo: Any) -> str:
    """``P90 TTFT (ms) ≤ 2,000``."""
    return f"{short(slo.metric)} {bound_text(slo)}"


def plural(n: int, word: str) -> str:
    """``1 GPU``, ``2 GPUs``, ``1 trial``, ``4 trials``."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def percent(share: float) -> str:
    """A share in percent with the digits that keep it from reading as 0 or 100: ``44%``, ``4.5%``, ``0.25%``."""
    a = abs(share)
    digits = 0 if a >= 0.1 or a == 0 else 1 if a >= 0.01 else 2
    return f"{share:.{digits}%}"


@dataclass(frozen=True)
class OperatingPoint:
    """One trial at one load level."""

    trial: int
    concurrency: int
    x_metric: str
    y_metric: str
    x: float
    y: float
    gpus: int | None
    config: str
    deployment: str
    proposer: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def text(self) -> str:
        """``30,390 tok/s/GPU @ c=4096, 40.1 tok/s/user`` (the study's two axes, whatever they are)."""
        return f"{value_text(self.x_metric, self.x)} @ c={self.concurrency}, {value_text(self.y_metric, self.y)}"


@dataclass(frozen=True)
class Margin:
    """How far one SLO is from its bound at the recommended level."""

    slo: str
    metric: str
    op: str
    bound: float
    measured: float | None
    #: (measured − bound) / bound in the good direction: 0.25 = 25 % of headroom; negative = missed.
    headroom: float | None

    def text(self) -> str:
        if self.measured is None:
            return f"{short(self.metric)}: not measured (bound {self.op} {value_text(self.metric, self.bound)})"
        room = "" if self.headroom is None else (f" — {percent(self.headroom)} headroom" if self.headroom >= 0
                                                 else f" — misses by {percent(-self.headroom)}")
        return f"{short(self.metric)}: {bare(self.metric, self.measured)} {bound_text(self)}{room}"


@dataclass(frozen=True)
class Chosen:
    """The study's answer as ``advisor.answer`` chose it (``ui.data.chosen``): its first trial at its operating
    point, and vLLM's defaults at theirs (when they met the SLOs) with the mean-over-mean gain."""

    trial: int
    concurrency: int
    is_baseline: bool = False
    baseline_trial: int | None = None
    baseline_concurrency: int | None = None
    gain: float | None = None
    #: The answer's runs (``advisor.answer.Answer.runs``: trial, value as recorded, its operating point's
    #: concurrency), its first trial first, then its repeats on fresh deploys: the run-to-run spread.
    runs: tuple[tuple[int, float, int], ...] = ()
    #: Where vLLM's defaults met the SLOs nowhere: the load both they (trial ``equal_defaults_trial``) and the
    #: answer were measured at (``advisor.answer.EqualLoad``).
    equal_concurrency: int | None = None
    equal_defaults_trial: int | None = None


@dataclass
class Recommendation:
    best: OperatingPoint | None
    why_none: str = ""
    margins: list[Margin] = field(default_factory=list)
    baseline: OperatingPoint | None = None
    #: The answer over vLLM's defaults (``proposer == "baseline"``): the mean of their runs' objective values
    #: (``Chosen.gain``), else best.x / baseline.x at the reader's operating point.
    gain: float | None = None
    #: vLLM's defaults are the recommendation: no searched deployment beats them.
    defaults_best: bool = False
    baseline_note: str = ""
    cheaper: OperatingPoint | None = None
    faster: OperatingPoint | None = None
    #: Distinct deployments on the (SLO-feasible) front.
    front_deployments: int = 0
    #: The answer's runs (``Chosen.runs``).
    runs: tuple[tuple[int, float, int], ...] = ()
    #: The answer and vLLM's defaults at a load both measured, where the defaults met the SLOs nowhere.
    equal_answer: OperatingPoint | None = None
    equal_defaults: OperatingPoint | None = None

    @property
    def worse_than_defaults(self) -> bool:
        """At the load both were measured at, the recommendation gives less ``x`` than vLLM's defaults."""
        a, d = self.equal_answer, self.equal_defaults
        return a is not None and d is not None and _better(a.x_metric) * (a.x - d.x) < 0


def margins(point: OperatingPoint, slos: Sequence[Any]) -> list[Margin]:
    out = []
    for s in slos:
        v = point.metrics.get(s.metric)
        measured = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
        room = None
        if measured is not None and s.value:
            room = -slo_excess(s.op, float(s.value), measured)  # the room left is the excess, negated
        elif measured is not None:
            room = None
        out.append(Margin(str(s), s.metric, s.op, float(s.value), measured, room))
    return out


def _points(df: pd.DataFrame, x: str, y: str, by: dict[int, str] | None = None) -> list[OperatingPoint]:
    keep = [c for c in df.columns if c not in ("config", "state", "meets_slo", "pareto")]
    out = []
    for r in df.to_dict("records"):
        out.append(OperatingPoint(
            trial=int(r["trial"]), concurrency=int(r["concurrency"]), x_metric=x, y_metric=y, x=float(r[x]),
            y=float(r[y]), gpus=None if pd.isna(r.get("gpus")) else int(r["gpus"]), config=str(r.get("config") or ""),
            deployment=str(r.get("deployment") or r.get("config") or ""), proposer=(by or {}).get(int(r["trial"])),
            metrics={k: r[k] for k in keep}))
    return out


def _better(name: str) -> int:
    return 1 if higher(name) else -1


def feasible_levels(levels: pd.DataFrame, x: str, y: str, min_y: float | None = None) -> pd.DataFrame:
    """Levels of complete trials meeting every SLO with both axes measured (and ``y`` at the operating point)."""
    if levels.empty:
        return levels
    ok = levels[(levels["state"] == "complete") & levels["meets_slo"] & levels[x].notna() & levels[y].notna()]
    if min_y is not None:
        ok = ok[ok[y] >= min_y] if _better(y) > 0 else ok[ok[y] <= min_y]
    return ok


def best_per_deployment(levels: pd.DataFrame, x: str) -> pd.DataFrame:
    """One level per deployment (its best ``x``; ties → lower trial number): repeats and levels count once."""
    if levels.empty:
        return levels
    key = levels["config"].where(levels["config"] != "", levels["trial"].astype(str))
    order = levels.assign(_key=key, _x=_better(x) * levels[x]).sort_values(["_x", "trial"], ascending=[False, True])
    return order.drop_duplicates("_key").drop(columns=["_key", "_x"])


def front_by_deployment(levels: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The front's points grouped by deployment: one row per deployment with its front levels.

    ``levels`` carries the ``pareto`` flag (``ui.data.levels``). Columns: trial (the first trial of the
    deployment), trials, concurrencies on the front, the best ``x`` and its level's ``y``, GPUs, deployment."""
    cols = ["trial", "trials", "levels", x, y, "gpus", "config"]
    if levels.empty or not levels["pareto"].any():
        return pd.DataFrame(columns=cols)
    front = levels[levels["pareto"]]
    rows = []
    for config, g in front.groupby("config", sort=False):
        top = g.loc[(_better(x) * g[x]).idxmax()]
        rows.append({"trial": int(g["trial"].min()), "trials": ", ".join(map(str, sorted(set(g["trial"].astype(int))))),
                     "levels": ", ".join(f"c={c}" for c in sorted(set(g["concurrency"].astype(int)))),
                     x: float(top[x]), y: float(top[y]), "gpus": top["gpus"], "config": config})
    return pd.DataFrame(rows, columns=cols).sort_values(x, ascending=_better(x) < 0, kind="stable")


def _level(ok: pd.DataFrame, trial: int | None, concurrency: int | None) -> pd.DataFrame:
    return ok[(ok["trial"] == trial) & (ok["concurrency"] == concurrency)].iloc[:1]


def recommend(levels: pd.DataFrame, trials: pd.DataFrame, slos: Sequence[Any], x: str, y: str,
              min_y: float | None = None, chosen: Chosen | None = None) -> Recommendation:
    """The deployment to run: the study's answer (``chosen``) where its level gives at least ``min_y``, else the
    most ``x`` among SLO-meeting levels with ``y`` at least ``min_y``; its margins to each SLO; the gain over
    vLLM's defaults (baseline trials); and the alternatives a person would weigh — the best deployment on fewer
    GPUs, and the best one that gives each user at least 10 % more ``y``."""
    by = {}
    deployment = {}
    if not trials.empty:
        by = {int(t): p for t, p in zip(trials["trial"], trials["by"], strict=False) if isinstance(p, str)}
        deployment = {int(t): d for t, d in zip(trials["trial"], trials["deployment"], strict=False)}
    ok = feasible_levels(levels, x, y, min_y)
    where = "meets every SLO" + (f" with {short(y)} ≥ {num(min_y)}" if min_y is not None else "")
    if ok.empty:
        measured = 0 if levels.empty else int((levels["state"] == "complete").sum())
        why = (f"No measured load level {where} yet" + (f" ({measured} levels measured)." if measured else "."))
        return Recommendation(None, why)
    ok = ok.assign(deployment=ok["trial"].map(lambda t: deployment.get(int(t), "")))
    per = best_per_deployment(ok, x)
    pts = _points(per, x, y, by)
    answer = _level(ok, chosen.trial, chosen.concurrency) if chosen is not None else ok.iloc[0:0]
    best = _points(answer, x, y, by)[0] if not answer.empty else pts[0]
    rec = Recommendation(best, margins=margins(best, slos))
    others = [p for p in pts if (p.config or p.trial) != (best.config or best.trial)]
    if best.gpus is not None:
        fewer = [p for p in others if p.gpus is not None and p.gpus < best.gpus]
        rec.cheaper = fewer[0] if fewer else None
    sy = _better(y)
    faster = [p for p in others if sy * p.y >= sy * best.y * (1.1 if sy > 0 else 1 / 1.1)]
    rec.faster = faster[0] if faster else None
    front = levels[levels["pareto"]] if "pareto" in levels else levels.iloc[0:0]
    rec.front_deployments = int(front["config"].nunique()) if not front.empty else 0
    base_trials = {t for t, p in by.items() if p == "baseline"}
    base_answer = (_level(ok, chosen.baseline_trial, chosen.baseline_concurrency) if chosen is not None
                   and not answer.empty else ok.iloc[0:0])
    if chosen is not None and not answer.empty:
        rec.runs = chosen.runs
        if chosen.equal_concurrency is not None:  # every level, SLOs met or not: the defaults met them nowhere
            both = levels.assign(deployment=levels["trial"].map(lambda t: deployment.get(int(t), "")))
            mine = _level(both, chosen.trial, chosen.equal_concurrency)
            theirs = _level(both, chosen.equal_defaults_trial, chosen.equal_concurrency)
            if not mine.empty and not theirs.empty and mine[[x, y]].notna().all(axis=None) \
                    and theirs[[x, y]].notna().all(axis=None):
                rec.equal_answer, rec.equal_defaults = _points(mine, x, y, by)[0], _points(theirs, x, y, by)[0]
    if not base_answer.empty:  # the answer's own comparison: mean over mean of the runs, as `advisor best` says
        assert chosen is not None
        rec.baseline, rec.gain = _points(base_answer, x, y, by)[0], chosen.gain
        rec.defaults_best = chosen.is_baseline
    elif base_trials:  # from every feasible level: the baseline may be the same deployment as a trial of the search
        base = _points(best_per_deployment(ok[ok["trial"].isin(base_trials)], x), x, y, by)
        if base:
            rec.baseline = base[0]
            rec.gain = best.x / base[0].x if base[0].x else None
        else:
            rec.baseline_note = (f"vLLM's defaults (baseline trial {', '.join(map(str, sorted(base_trials)))}) "
                                 f"reach no load level that {where}.")
    return rec


def knee_text(point: OperatingPoint, levels: pd.DataFrame) -> str:
    """Where the point sits on its trial's load curve: ``knee c=37 — … c=65 missed an SLO (bracket open: …)``
    for the knee the search found, else that it is the best of the levels measured."""
    mine = levels[levels["trial"] == point.trial] if not levels.empty else levels
    above = mine[(mine["concurrency"] > point.concurrency) & ~mine["meets_slo"]] if not mine.empty else mine
    missed = (f"; c={int(above['concurrency'].min())} missed an SLO" if not above.empty else
              "; no higher load was measured")
    flags = [f for f in (point.metrics.get("flags") or []) if f in ("bracket-open", "knee-at-max-load")]
    why = "".join(f" ({f}: {LEVEL_FLAGS[f]})" for f in flags)
    if point.metrics.get("purpose") == "knee":
        return (f"**Knee: c={point.concurrency}**, the highest load at which every SLO held in the knee "
                f"search{missed}{why}")
    return (f"**Operating point: c={point.concurrency}**, the best of the trial's measured loads that meet every "
            f"SLO (no knee search found it){missed}{why}")


def interval_text(point: OperatingPoint) -> str:
    """``95 % interval at c=37: 11,051–11,622 tok/s/GPU · 35.1–36.9 tok/s/user`` from the level's bootstrap
    intervals; "" where the level carries none (the performance model's)."""
    ivs = point.metrics.get("intervals")
    parts = []
    for metric in (point.x_metric, point.y_metric):
        pair = ivs.get(metric) if isinstance(ivs, dict) else None
        if pair and len(pair) == 2:
            unit = value_text(metric, pair[1]).split(" ", 1)[1] if " " in value_text(metric, pair[1]) else ""
            at = f" @ c={point.concurrency}" if metric == point.x_metric else ""
            parts.append(f"{num(pair[0])}–{num(pair[1])} {unit}".strip() + at)
    if not parts:
        return ""
    return f"**95 % interval** (bootstrap over the level's requests): {' · '.join(parts)}"


def trial_points(levels: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Per trial, its operating point: the level with the most ``x`` among those meeting every SLO, else (marked)
    its level with the most ``x``. Columns: trial, ``x``, concurrency, ``y``, meets_slo."""
    cols = ["trial", x, "concurrency", y, "meets_slo"]
    if levels.empty:
        return pd.DataFrame(columns=cols)
    pts = levels[levels[x].notna()]
    if pts.empty:
        return pd.DataFrame(columns=cols)
    ranked = pts.assign(_x=_better(x) * pts[x]).sort_values(["meets_slo", "_x"], ascending=[False, False])
    return ranked.drop_duplicates("trial")[cols].reset_index(drop=True)


def level_marks(measurement: Any, slos: Sequence[Any]) -> dict[str, bool | None]:
    """For one level: per SLO (its text) whether it is met; ``None`` when the metric was not measured."""
    out: dict[str, bool | None] = {}
    for s in slos:
        v = getattr(measurement, s.metric, None)
        out[str(s)] = None if v is None else bool(s.met(measurement))
    return out


#: What a simulated routing means for the numbers beside it.
ROUTING_NOTE = ("the servers picked experts through vLLM's routing simulator, so these numbers are timings under "
                "that routing (the outputs are not valid text)")


def routing_lines(stored: Iterable[str | None]) -> list[str]:
    """``simulated routing: zipf 1.1 (12 of 12 levels)`` for each simulated expert routing among the levels'
    stored ``expert_routing`` values, as ``advisor best`` prints it; nothing for the real router, nor for levels
    that recorded none (the performance model's, or stored before routing was recorded)."""
    counts = Counter(None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in stored)
    total = sum(counts.values())
    return [f"{label} ({n} of {total} levels)" for value, n in counts.most_common()
            if value is not None and (label := routing_label(value))]
