"""Which way is better, and what is best: metric directions, the Pareto mask, the study's answer.

Pure functions on plain numbers (no session, no SQL), apart from the queries that read the rows, so that a page
holding levels as columns ranks them exactly as ``db.queries`` does; which way each metric is better, and how it
scales with the cluster, is its declaration's (``search_spaces.metrics``).

The study's answer is ranked here once (``rank_deployments``), so that the study list's "best trial",
``advisor best``, ``advisor export`` and the dashboard cannot name different deployments. Ranked for the cluster
(``cluster_gpus``), a deployment is worth what the copies of it that fit serve, the GPUs left over serving
nothing (``cluster_factor``): an operator pays for the whole cluster, so 3 copies of 24 GPUs beat 1 of 48 on 72
GPUs even at a lower throughput per used GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from search_spaces import (
    DEFAULT_OBJECTIVE, DEFAULT_PARETO_Y, Scaling, TrialState, higher_is_better, metric, scaling, slo_metrics,
)


def metric_sign(name: str) -> int:
    """+1 when more is better, -1 when less is; only SLO metrics (whose direction is the point) may rank levels."""
    m = metric(name)
    if m is None or not m.slo:
        raise ValueError(f"unknown metric {name!r}; allowed: {', '.join(slo_metrics())}")
    return m.sign


def objective_maximized(name: str) -> bool:
    """Whether objective ``name`` is maximized: its declared direction (``search_spaces.higher_is_better``)."""
    return higher_is_better(name)


def first_objective(objs: Iterable[dict[str, Any] | None]) -> str | None:
    """The first objective name any of these trials recorded (the study's main one)."""
    for o in objs:
        if o:
            return next(iter(o))
    return None


def copies(gpus: int, cluster_gpus: int) -> int:
    """How many copies of a ``gpus``-GPU deployment a cluster of ``cluster_gpus`` GPUs holds."""
    return max(cluster_gpus // max(gpus, 1), 0)


def cluster_factor(name: str, gpus: int | None, cluster_gpus: int) -> float:
    """What one unit of metric ``name`` of a ``gpus``-GPU deployment is worth for the whole cluster: per-GPU
    throughputs become per GPU of the cluster (× copies × GPUs / cluster GPUs: idle GPUs produce nothing),
    request throughput that of every copy (× copies); other metrics (and an unknown GPU count) are unchanged
    (``search_spaces.Scaling``)."""
    how = scaling(name)
    if how is Scaling.NONE or not gpus:
        return 1.0
    n = copies(gpus, cluster_gpus)
    return float(n) if how is Scaling.PER_DEPLOYMENT else n * gpus / cluster_gpus


class RunRow(NamedTuple):
    """What ranking needs of one trial row."""

    number: int
    state: str
    objectives: dict[str, Any] | None
    violation: float | None
    proposer: str | None = None
    repeat_of: int | None = None
    #: A reused trial holds a copy of another trial's values, not a run of its own.
    reused_from: int | None = None
    gpus: int | None = None
    baseline: bool = False


@dataclass
class Runs:
    """Every measured run of one deployment: its first trial and the repeats of it (``budget.repeat_top``)."""

    trial: int
    values: list[float] = field(default_factory=list)
    #: vLLM's defaults (the trial the tuner measured first: ``baseline``).
    baseline: bool = False
    #: GPUs the deployment uses, and ``cluster_factor`` of it: ``values`` are the objective × ``factor`` (1.0
    #: unless ranked for the cluster), so spreads, ties and margins compare what the cluster would serve.
    gpus: int | None = None
    factor: float = 1.0
    #: The trial of each run, in the order of ``values`` (the first trial, then its repeats).
    trials: list[int] = field(default_factory=list)

    @property
    def recorded(self) -> list[float]:
        """The runs' values as the trials recorded them (per GPU the deployment uses, for a per-GPU metric)."""
        return [v / self.factor for v in self.values] if self.factor else list(self.values)

    @property
    def per_used_gpu(self) -> float:
        """The mean of ``recorded``."""
        return self.mean / self.factor if self.factor else self.mean

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def spread(self) -> float:
        """(max − min) / mean of the runs; 0 with one run (then nothing is known of the spread)."""
        return (self.high - self.low) / self.mean if self.mean else 0.0

    def ties(self, other: Runs) -> bool:
        """Whether the two deployments' run ranges overlap (neither is measurably better)."""
        return self.low <= other.high and other.low <= self.high


def deployments(trials: Iterable[RunRow], name: str, cluster_gpus: int | None = None) -> list[Runs]:
    """Complete, feasible runs with a value of objective ``name``, grouped by deployment (a repeat joins the
    trial it repeats; a reused trial is a copy, not a run), by first trial number; with ``cluster_gpus``, each
    value × its ``cluster_factor``."""
    out: dict[int, Runs] = {}
    for t in sorted(trials, key=lambda t: t.number):
        value = (t.objectives or {}).get(name)
        if t.state != TrialState.COMPLETE.value or value is None or (t.violation is not None and t.violation > 0):
            continue
        if t.reused_from is not None:
            continue
        key = t.repeat_of if t.repeat_of is not None else t.number
        runs = out.setdefault(key, Runs(key))
        factor = cluster_factor(name, t.gpus, cluster_gpus) if cluster_gpus else 1.0
        runs.values.append(float(value) * factor)
        runs.trials.append(t.number)
        if t.repeat_of is None:
            runs.baseline, runs.gpus, runs.factor = t.baseline, t.gpus, factor
    return sorted(out.values(), key=lambda r: r.trial)


def rank_deployments(trials: Iterable[RunRow], name: str, cluster_gpus: int | None = None) -> list[Runs]:
    """The study's deployments, its answer first: by the mean of their runs (ties → the lower trial number;
    with ``cluster_gpus``, by what the copies that fit serve on that cluster: ``cluster_factor``),
    except that vLLM's defaults lead unless some searched deployment *beats* them — every run of it better than
    every run of the defaults. A search that only ties the defaults (run ranges overlap) recommends nothing new:
    the answer is never a change the measurements cannot tell from no change."""
    sign = 1 if objective_maximized(name) else -1
    ranked = sorted(deployments(trials, name, cluster_gpus), key=lambda r: (-sign * r.mean, r.trial))
    base = next((r for r in ranked if r.baseline), None)
    if base is None or ranked[0] is base:
        return ranked
    beats = any(r.low > base.high if sign > 0 else r.high < base.low for r in ranked if r is not base)
    return ranked if beats else [base, *(r for r in ranked if r is not base)]


def best_of(trials: Sequence[RunRow], cluster_gpus: int | None = None) -> tuple[str | None, float | None, int | None]:
    """(objective, the answer's mean value as recorded, its first trial) of a study's trial rows
    (``rank_deployments``, for a cluster of ``cluster_gpus`` when given)."""
    name = first_objective(t.objectives for t in trials)
    if name is None:
        return None, None, None
    ranked = rank_deployments(trials, name, cluster_gpus)
    return (name, ranked[0].per_used_gpu, ranked[0].trial) if ranked else (name, None, None)


def pareto_mask(xs: Sequence[float | None], ys: Sequence[float | None], x: str = DEFAULT_OBJECTIVE,
                y: str = DEFAULT_PARETO_Y) -> list[bool]:
    """Which points (``xs[i]``, ``ys[i]``) are non-dominated on metrics ``x`` and ``y`` (directions as in
    ``db.queries.pareto_front``, which uses it; equal points are all kept; a missing or NaN value is never on the front).

    Public so that a page holding levels as columns marks the very front ``pareto_front`` returns, in
    O(n log n), without reading them again.
    """
    sx, sy = metric_sign(x), metric_sign(y)
    keep = [False] * len(xs)
    valid = [i for i, (a, b) in enumerate(zip(xs, ys))
             if a is not None and b is not None and not math.isnan(a) and not math.isnan(b)]
    order = sorted(valid, key=lambda i: (-sx * xs[i], -sy * ys[i]))  # type: ignore[operator]
    best_y: float | None = None  # best y among points with a strictly better x
    i = 0
    while i < len(order):
        gx = sx * xs[order[i]]  # type: ignore[operator]
        j = i
        while j < len(order) and sx * xs[order[j]] == gx:  # type: ignore[operator]
            j += 1
        top = sy * ys[order[i]]  # type: ignore[operator]  # the group's best y: sorted first
        if best_y is None or top > best_y:
            for k in order[i:j]:
                keep[k] = sy * ys[k] == top  # type: ignore[operator]
            best_y = top
        i = j
    return keep
