"""Where the model's curve, scaled by what was measured, puts the knee: the knee search's aim.

A model's predicted knee (``MeasurePlan.start``) is often off by 1.5–3× on a machine it does not know, while the
way each SLO metric moves with load is known better than its level. So when the knee search has measured a level,
each SLO metric's predicted curve is scaled by measured / predicted at the measured loads — one load: a constant
factor; several: the factor interpolated in log load between them and held beyond them (a secant on the model's
curve) — and the knee is estimated where the scaled curves cross their bounds (``PredictedCurve.knee``). The
search (``executors.measuring.loop``) aims its next level there, with a safety margin. Where the scaled curve meets a
bound at no load at all (the model's curve has a floor — a lone request's prefill — that the factor blows up past
the bound), the curve is shifted along the load axis instead: the machine shows at load x what the model predicts
at s·x (``_shifted``). On the perturbed truths of ``benchmarks/knee_search.py`` the vertical scaling took fewer
levels than the shift (118 against 120 levels on 36 runs), so the shift is the second choice.

The model saying nothing is an answer too: no curve, a metric the model does not predict that a measured level
fails, or a scaled curve whose feasible loads have a hole (non-monotone) give no estimate, and the search takes
its widening steps as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from search_spaces import SLO, Measurement


@dataclass(frozen=True)
class PredictedCurve:
    """The model's SLO metrics over a grid of loads (increasing): what ``MeasurePlan.curve`` carries to the search.

    ``metrics`` pairs each metric name with its predicted values at ``loads`` (None: not predicted there)."""

    loads: tuple[float, ...]
    metrics: tuple[tuple[str, tuple[float | None, ...]], ...]

    def values(self, metric: str) -> tuple[float, ...] | None:
        """The metric's predicted values, or None where the model does not predict it everywhere (or ≤ 0)."""
        vals = dict(self.metrics).get(metric)
        if vals is None or any(v is None or not math.isfinite(v) or v <= 0 for v in vals):
            return None
        return vals  # type: ignore[return-value]

    def at(self, metric: str, load: float) -> float | None:
        """The prediction at ``load``, interpolated in log-log between grid loads (None off the grid)."""
        vals = self.values(metric)
        if vals is None or not self.loads or not self.loads[0] <= load <= self.loads[-1]:
            return None
        i = next(j for j, x in enumerate(self.loads) if x >= load)
        if self.loads[i] == load or i == 0:
            return vals[i]
        return _loglog(self.loads[i - 1], vals[i - 1], self.loads[i], vals[i], load)

    def knee(self, slos: Sequence[SLO], measured: Sequence[Measurement]) -> float | None:
        """The highest load at which every SLO's scaled curve meets its bound (``math.inf``: all of the grid;
        0: none of it), or None where the model says nothing about an SLO a measured level fails, has it better
        at the top of the grid than at the bottom, a scaled curve's feasible loads are not one interval from the
        bottom, or nothing measured can scale it."""
        best = math.inf
        for slo in slos:
            if slo.metric == "error_rate":
                continue
            vals = self.values(slo.metric)
            pts = _ratios(self, slo.metric, measured) if vals is not None else []
            if vals is None or not pts:
                if all(slo.met(m) for m in measured):
                    continue  # the model says nothing of it, and it has not bound yet
                return None
            if slo.excess(vals[0]) > slo.excess(vals[-1]):
                return None  # the model has the metric getting better with load: no knee of its to aim at
            cross = _crossing(slo, self.loads, [v * _ratio_at(pts, x) for x, v in zip(self.loads, vals, strict=True)])
            if cross is None or cross == 0.0:  # scaled, no load meets it: the model's level is off, not its load
                cross = self._shifted(slo, vals, measured) or cross
            if cross is None:
                return None
            best = min(best, cross)
        return best

    def _shifted(self, slo: SLO, vals: tuple[float, ...], measured: Sequence[Measurement]) -> float | None:
        """The knee of one SLO with the model's curve shifted along the load axis: at each measured load x the
        machine shows what the model predicts at s·x; s is interpolated in log load between measured loads
        (held beyond them), and the knee is where x·s(x) reaches the model's own crossing. None where the model's
        curve does not reach a measured value (or never crosses the bound on its grid)."""
        own = _crossing(slo, self.loads, list(vals))
        if own is None or own in (0.0, math.inf):
            return None
        pts: list[tuple[float, float]] = []
        for m in measured:
            got = getattr(m, slo.metric, None)
            if not m.completed or got is None or got <= 0:
                continue
            at = _inverse(slo, self.loads, vals, got)
            if at is None:
                return None
            pts.append((m.load, math.log(at / m.load)))
        if not pts:
            return None
        pts.sort()
        x = own / math.exp(pts[0][1])
        for _ in range(30):  # x = own / s(x): s varies slowly in log load, so this settles in a few rounds
            x = own / _ratio_at(pts, x)
        return x


def _crossing(slo: SLO, loads: Sequence[float], scaled: list[float]) -> float | None:
    """Where the curve ``scaled`` over ``loads`` crosses the SLO's bound (log-log between grid loads): ``math.inf``
    if it meets it on the whole grid, 0 if nowhere, None if its feasible loads are not one interval from the bottom."""
    ok = [slo.excess(v) <= 0 for v in scaled]
    n_ok = sum(ok)
    if ok != [True] * n_ok + [False] * (len(ok) - n_ok):
        return None  # non-monotone: no single crossing to aim at
    if n_ok == len(ok):
        return math.inf
    if n_ok == 0:
        return 0.0
    i = n_ok  # first grid load that fails the bound; i - 1 meets it
    cross = _loglog(scaled[i - 1], loads[i - 1], scaled[i], loads[i], slo.value) \
        if slo.value > 0 and scaled[i - 1] != scaled[i] else loads[i - 1]
    return min(max(cross, loads[i - 1]), loads[i])


def _inverse(slo: SLO, loads: Sequence[float], vals: Sequence[float], got: float) -> float | None:
    """The load at which the model's curve takes the value ``got`` (log-log between grid loads; the curve taken as
    getting worse with load), or None outside the curve's range."""
    bad = slo.excess(got)
    ex = [slo.excess(v) for v in vals]
    if not ex[0] <= bad <= ex[-1]:
        return None
    i = next(j for j, e in enumerate(ex) if e >= bad)
    if i == 0 or vals[i] == vals[i - 1]:
        return loads[i]
    return _loglog(vals[i - 1], loads[i - 1], vals[i], loads[i], got)


def _loglog(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    """y at x on the line through (x0, y0), (x1, y1) in log-log space (all positive)."""
    t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))


def _ratios(curve: PredictedCurve, metric: str, measured: Sequence[Measurement]) -> list[tuple[float, float]]:
    """(load, log(measured / predicted)) at each measured load where both are known and positive, by load."""
    pts: dict[float, list[float]] = {}
    for m in measured:
        got, pred = getattr(m, metric, None), curve.at(metric, m.load)
        if m.completed and got is not None and pred is not None and got > 0 and math.isfinite(got):
            pts.setdefault(m.load, []).append(math.log(got / pred))
    return sorted((x, sum(r) / len(r)) for x, r in pts.items())


def _ratio_at(pts: list[tuple[float, float]], load: float) -> float:
    """measured / predicted at ``load``: log-linear in log load between measured loads, held beyond them."""
    if load <= pts[0][0]:
        return math.exp(pts[0][1])
    for (x0, r0), (x1, r1) in zip(pts, pts[1:], strict=False):
        if load <= x1:
            t = (math.log(load) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(r0 + t * (r1 - r0))
    return math.exp(pts[-1][1])
