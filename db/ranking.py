"""Which way is better, and what is best: metric directions, the Pareto mask, the best objective so far.

Pure functions on plain numbers (no session, no SQL), apart from the queries that read the rows, so that a page
holding levels as columns ranks them exactly as ``db.queries`` does: throughput and tokens/s per user
(``search_spaces.HIGHER_IS_BETTER``) are maximized, latencies (``*_ms``) minimized.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from search_spaces import HIGHER_IS_BETTER, SLO_METRICS, TrialState


def metric_sign(metric: str) -> int:
    """+1 when more is better, -1 when less is; only metrics whose direction is known may rank levels."""
    if metric not in SLO_METRICS:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(SLO_METRICS)}")
    return 1 if metric in HIGHER_IS_BETTER else -1


def objective_maximized(name: str) -> bool:
    """An objective is minimized when it is a latency (``*_ms``), maximized otherwise."""
    return not name.endswith("_ms")


def first_objective(objs: Iterable[dict[str, Any] | None]) -> str | None:
    """The first objective name any of these trials recorded (the study's main one)."""
    for o in objs:
        if o:
            return next(iter(o))
    return None


def best_of(trials: Sequence[tuple[int, str, dict[str, Any] | None, float | None]]) -> tuple[str | None, float | None, int | None]:
    """(objective, best value, trial number) over complete, feasible trials; trials sorted by number."""
    name = first_objective(t[2] for t in trials)
    if name is None:
        return None, None, None
    sign = 1 if objective_maximized(name) else -1
    best: float | None = None
    best_n: int | None = None
    for number, state, objs, violation in trials:
        value = (objs or {}).get(name)
        if state != TrialState.COMPLETE.value or value is None or (violation is not None and violation > 0):
            continue
        if best is None or sign * value > sign * best:
            best, best_n = value, number
    return name, best, best_n


def pareto_mask(xs: Sequence[float | None], ys: Sequence[float | None], x: str = "throughput_per_gpu",
                y: str = "p90_tokens_per_s_per_user") -> list[bool]:
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
