"""Turning a load level's mean times into a ``Measurement``: percentiles from assumed distribution shapes
(uniform prompt lengths, exponential queue waits, normal TPOT spread), and the rule that a non-finite or
negative number is reported as missing. Part of ``executors.perf`` (``docs/performance-model.md`` §4)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from executors.perf.derived import _WorkloadDerived
from executors.perf.step import Arr, _pow
from search_spaces import SLO, Measurement, Workload
from search_spaces.workload import slo_excess

#: Standard-normal quantiles of P90 and P99 (spreads modelled as normal).
_Z90 = 1.2815515655446004
_Z99 = 2.3263478740408408


def _pct_uniform(mean: Arr, r: float) -> tuple[Arr, Arr, Arr]:
    """p50/p90/p99 of a uniform variable on mean × [1 - r, 1 + r]."""
    return mean, mean * (1.0 + 0.8 * r), mean * (1.0 + 0.98 * r)


class _Levels:
    """What ``_finish`` takes: a load level's mean times and spreads (seconds), one element per (deployment, level)."""

    def __init__(self, c: Arr, gpus: Arr, X: Arr, ttft_service: Arr, wait_det: Arr, wait_rand: Arr, tpot: Arr,
                 sd_step: Arr, itl0: Arr, itl1: Arr, f_slow: Arr, imbalance: Arr, raw: dict[str, Any],
                 kv_transfer: bool, expert_balance: Arr, has_balance: Arr) -> None:
        self.c, self.gpus, self.X, self.ttft_service = c, gpus, X, ttft_service
        self.wait_det, self.wait_rand, self.tpot, self.sd_step = wait_det, wait_rand, tpot, sd_step
        self.itl0, self.itl1, self.f_slow, self.imbalance = itl0, itl1, f_slow, imbalance
        self.raw, self.kv_transfer = raw, kv_transfer
        self.expert_balance, self.has_balance = expert_balance, has_balance


def _finish(lv: _Levels, wl: Workload, wd: _WorkloadDerived, jit: float, purpose: str) -> LevelTable:
    """The levels' fields from their mean times and spreads: TTFT = service (scales with the prompt's length) +
    deterministic wait + congestion wait (exp-like); TPOT per request the mean step over its life (stalls average out
    over its OSL tokens); ITL per step (a step with any rank's prefill chunk is slow); E2EL = TTFT + TPOT × (OSL − 1),
    spreads combined in quadrature."""
    osl, r_i, r_o = wd.osl, wd.r_i, wd.r_o
    ts = lv.ttft_service
    det, rand = lv.wait_det, lv.wait_rand
    s50, s90, s99 = _pct_uniform(ts, r_i)
    ttft_m = ts + det + rand
    t50 = s50 + det + 0.693 * rand
    t90 = s90 + det * (1.0 + 0.1 * _Z90) + 2.303 * rand
    t99 = s99 + det * (1.0 + 0.1 * _Z99) + 4.605 * rand
    tpot = lv.tpot
    sd = tpot * jit + lv.sd_step / math.sqrt(max(osl * (1.0 - r_o), 1.0))
    tp50, tp90, tp99 = tpot, tpot + _Z90 * sd, tpot + _Z99 * sd
    i50 = np.where(lv.f_slow > 0.5, lv.itl1, lv.itl0)
    i90 = np.where(lv.f_slow > 0.1, lv.itl1, lv.itl0) * (1.0 + _Z90 * jit)
    i99 = np.where(lv.f_slow > 0.01, lv.itl1, lv.itl0) * (1.0 + _Z99 * jit)
    e_m = ttft_m + tpot * (osl - 1.0)
    o_sd = osl * r_o / math.sqrt(3.0)
    two = np.full_like(ts, 2.0)

    def e2e(tq: Arr, tpq: Arr, z: float) -> Arr:
        return e_m + np.sqrt(_pow(tq - ttft_m, two) + _pow(z * tpot * o_sd, two) + _pow((tpq - tpot) * osl, two))

    e90, e99 = e2e(t90, tp90, _Z90), e2e(t99, tp99, _Z99)
    X = lv.X
    c = lv.c.astype(int)
    prompts = {v: wl.num_prompts(v) for v in set(c.tolist())}
    n = np.array([prompts[v] for v in c.tolist()], dtype=int)
    nf = n.astype(float)
    return LevelTable({
        "concurrency": c, "source": "simulated", "gpus": lv.gpus.astype(int), "num_requests": n, "completed": n,
        "failed": 0, "duration_s": np.where(X > 0, nf / np.where(X > 0, X, 1.0), math.inf),
        "input_tokens": [int(round(v)) for v in (nf * wd.isl).tolist()],
        "output_tokens": [int(round(v)) for v in (nf * osl).tolist()],
        "throughput_per_gpu": X * (wd.isl + osl) / lv.gpus, "output_throughput_per_gpu": X * osl / lv.gpus,
        "request_throughput": X,
        "p50_tokens_per_s_per_user": 1.0 / tp50, "p90_tokens_per_s_per_user": 1.0 / tp90,
        "p99_tokens_per_s_per_user": 1.0 / tp99,
        "p50_ttft_ms": t50 * 1e3, "p90_ttft_ms": t90 * 1e3, "p99_ttft_ms": t99 * 1e3,
        "p50_tpot_ms": tp50 * 1e3, "p90_tpot_ms": tp90 * 1e3, "p99_tpot_ms": tp99 * 1e3,
        "p50_itl_ms": i50 * 1e3, "p90_itl_ms": i90 * 1e3, "p99_itl_ms": i99 * 1e3,
        "p50_e2el_ms": e_m * 1e3, "p90_e2el_ms": e90 * 1e3, "p99_e2el_ms": e99 * 1e3,
        "achieved_concurrency": c.astype(float), "client_saturated": False, "dp_imbalance": lv.imbalance,
        "error_rate": 0.0, "prefix_cache_hit_rate": wd.reuse,
        "kv_transfer_tokens": nf * wd.isl if lv.kv_transfer else None, "preemptions": 0.0,
        "eplb_balancedness": [b if has else None for b, has in zip(lv.expert_balance.tolist(),
                                                                   lv.has_balance.tolist(), strict=True)],
        "request_rate": None, "purpose": purpose, "intervals": dict, "flags": list,
        "expert_routing": None,
    }, lv.raw, len(c))


#: Every field of a ``Measurement``, in declaration order (the order ``model_construct`` gives its ``__dict__``).
_fields = tuple(Measurement.model_fields)
_field_set = frozenset(_fields)


def _missing(v: Any) -> bool:
    """Whether ``v`` is a number the model reports as missing: a non-finite or negative float."""
    return isinstance(v, float) and (v != v or v < 0.0 or v == math.inf)


def _built(d: dict[str, Any]) -> Measurement:
    """A ``Measurement`` whose ``__dict__`` is ``d`` (every field, in declaration order), built as
    ``model_construct`` builds it but without its walk over each field's aliases and defaults: that walk was a
    fifth of the model's time (the guide scores thousands of candidates a turn, four or more levels each)."""
    m = _new(Measurement)
    _put(m, "__dict__", d)
    _put(m, "__pydantic_fields_set__", set(_fields))
    _put(m, "__pydantic_extra__", {})  # no declared extras (Measurement allows those: search_spaces.metrics)
    _put(m, "__pydantic_private__", None)
    return m


_new, _put = Measurement.__new__, object.__setattr__  # bound once: ``_built`` runs for every level of a ranking


class LevelTable:
    """Levels given field by field, as the model makes them (``executors.perf.levels``: tens of thousands of levels a
    ranking). Each of ``columns`` (every field but ``raw``) is a NumPy array (one value per level), a list,
    a type (a fresh empty one of it for each level), or one value for every level; ``raw`` holds arrays or single
    values, one per entry of the ``raw`` dict. A level becomes a ``Measurement`` (a non-finite or negative number
    becomes None, missing — never a made-up value) — all of them (``rows``), or one when it is asked for
    (``LazyLevel``): a ranking reads a few fields of most levels and keeps one level per candidate, and building,
    then freeing, a Measurement for each of the others was a third of its time."""

    def __init__(self, columns: dict[str, Any], raw: dict[str, Any], n: int) -> None:
        if columns.keys() | {"raw"} != _field_set:
            raise ValueError(f"fields missing or unknown: {sorted(columns.keys() ^ (_field_set - {'raw'}))}")
        self.columns, self.raw, self.n = columns, raw, n
        self._lists: dict[str, list[Any]] = {}
        self._row_parts: list[tuple[str, list[Any] | None]] | None = None
        self._violations: tuple[tuple[SLO, ...], list[float]] | None = None

    def column(self, name: str) -> list[Any]:
        """Field ``name`` of every level, as the levels' Measurements hold it (converted once)."""
        got = self._lists.get(name)
        if got is None:
            got = self._lists[name] = self._convert(self.columns[name])
        return got

    def _convert(self, v: Any) -> list[Any]:
        if isinstance(v, np.ndarray):
            out = v.tolist()
            if v.dtype.kind == "f":
                for j in np.flatnonzero(np.isnan(v) | (v < 0.0) | (v == math.inf)).tolist():
                    out[j] = None
            return out
        if isinstance(v, list):
            return [None if _missing(x) else x for x in v]
        if isinstance(v, type):  # a fresh empty container for each level (``dict``, ``list``)
            return [v() for _ in range(self.n)]
        return [None if _missing(v) else v] * self.n

    def _raw_rows(self) -> list[tuple[Any, ...]]:
        got = self._lists.get("raw")
        if got is None:
            n = self.n
            got = self._lists["raw"] = list(zip(*(v.tolist() if isinstance(v, np.ndarray) else [v] * n
                                                  for v in self.raw.values()))) if self.raw else [()] * n
        return got

    def rows(self) -> list[Measurement]:
        """Every level as a Measurement."""
        keys = tuple(self.raw)
        raws = [dict(zip(keys, row)) for row in self._raw_rows()]
        cols = [raws if k == "raw" else self.column(k) for k in _fields]
        return [_built(dict(zip(_fields, row))) for row in zip(*cols)]

    def lazy(self) -> list[LazyLevel]:
        """Every level, each built as a Measurement only when asked (``LazyLevel.built``)."""
        purpose, rate, c = self.column("purpose"), self.column("request_rate"), self.column("concurrency")
        return [LazyLevel(self, j, purpose[j], (), rate[j] if rate[j] is not None else float(c[j]))  # Measurement.load
                for j in range(self.n)]

    def built(self, j: int, purpose: str, flags: tuple[str, ...]) -> Measurement:
        """Level ``j`` as a Measurement (the one ``rows`` gives), with ``purpose`` and ``flags``."""
        if self._row_parts is None:
            self._row_parts = [(k, None if k in ("raw", "purpose", "flags") or isinstance(self.columns[k], type)
                                else self.column(k)) for k in _fields]
        d: dict[str, Any] = {}
        for k, col in self._row_parts:
            if col is not None:
                d[k] = col[j]
            elif k == "raw":
                d[k] = dict(zip(self.raw, self._raw_rows()[j]))
            elif k == "purpose":
                d[k] = purpose
            elif k == "flags":
                d[k] = list(flags)
            else:
                d[k] = self.columns[k]()
        return _built(d)

    def violations(self, slos: tuple[SLO, ...]) -> list[float]:
        """``slo_violation(slos, level)`` of every level, read from the columns (computed once)."""
        if self._violations is None or self._violations[0] is not slos:  # one search asks with one tuple
            self._violations = (slos, self._worst(slos))
        return self._violations[1]

    def _worst(self, slos: tuple[SLO, ...]) -> list[float]:
        """``slo_violation`` of every level, as arrays: ``SLO.excess`` of a float column with a missing value (as
        ``_convert`` makes one) violating by 1, of any other column value by value; a level that completed nothing
        violates by 1."""
        worst = np.zeros(self.n)  # ``max(..., default=0.0)``
        for i, s in enumerate(slos):
            v = self.columns[s.metric]
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                e = np.where(np.isnan(v) | (v < 0.0) | (v == math.inf), 1.0, slo_excess(s.op, s.value, v))
            else:
                e = np.array([s.excess(x) for x in self.column(s.metric)], dtype=float)
            worst = e if i == 0 else np.maximum(worst, e)
        return np.where(np.array(self.column("completed")) == 0, 1.0, worst).tolist()


class LazyLevel:
    """One level of a ``LevelTable`` that is not a Measurement yet: what the knee search and the scoring read of a
    level — any field by name, ``load``, and a ``model_copy`` that sets ``purpose`` or ``flags`` — and ``built``,
    the Measurement itself. Only rankings make these (``model_levels_many(..., lazy=True)``)."""

    __slots__ = ("table", "j", "purpose", "flags", "load")

    def __init__(self, table: LevelTable, j: int, purpose: str, flags: tuple[str, ...], load: float) -> None:
        self.table, self.j, self.purpose, self.flags, self.load = table, j, purpose, flags, load

    def __getattr__(self, name: str) -> Any:
        if name not in _field_set:
            raise AttributeError(name)
        return self.table.column(name)[self.j]

    def model_copy(self, *, update: dict[str, Any]) -> LazyLevel:
        if update.keys() - {"purpose", "flags"}:
            raise ValueError(f"a lazy level sets only its purpose and flags, not {sorted(update)}")
        flags = tuple(update.get("flags", self.flags))
        return LazyLevel(self.table, self.j, update.get("purpose", self.purpose), flags, self.load)

    def built(self) -> Measurement:
        return self.table.built(self.j, self.purpose, self.flags)

    def meets(self, slos: tuple[SLO, ...]) -> bool:
        """``executors.measuring.loop.feasible(slos, self)``, from the table's violations."""
        return self.table.violations(slos)[self.j] <= 0
