"""The load-level model over many deployments at once: ``perf_levels`` with each deployment's numbers as one
element of NumPy arrays. Part of ``executors.perf_model``.

Why: the guide ranks every valid candidate of a space by the model's knee (thousands of candidates, about seven
levels each), and one level of the scalar model is tens of Python operations on floats — the first ranking of a
study was seconds of CPU (issue 15). Here one operation does one step of every candidate's level: the knee
searches run in lockstep (``executors.measure.search_many``), each round asking every unfinished search its next
load.

The scalar model (``perf_levels`` / ``perf_step``) stays the reference, and this module mirrors it expression by
expression, in the same order of operations, so that each number is the same float: ``+ - * /`` and ``sqrt``
are correctly rounded in both, and ``exp`` and ``**`` are taken from Python's ``math`` element by element
(NumPy's own may differ in the last bit). The step model is ``perf_batch_step``. ``tests/test_perf_batch.py``
compares the two on every valid candidate of the presets, level by level and field by field. A change to the
scalar model must be made here too; that test fails until it is.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from executors.perf_batch_step import Arr, _decode_cv, _pow, _prefill_capacity, _Roles, _step
from executors.perf_derived import _md, _Role, _wd, _WorkloadDerived
from executors.perf_levels import (
    RANDOM_WAIT_UTIL_CAP,
    _decode_grid,
    _kv_handoff,
    _prefill_alone,
    _raw_aggregated,
    _raw_disaggregated,
)
from executors.perf_measurement import LazyLevel, LevelTable, _pct_uniform, _Z90, _Z99
from executors.perf_params import PerfParams
from search_spaces import Measurement, Mode, ModelProfile, Workload

if TYPE_CHECKING:
    from executors.topology import Topology


def _md1_wait(service: Arr, u: Arr) -> Arr:
    """``perf_levels._md1_wait``."""
    u2 = np.minimum(u, 0.999)
    return np.where(u <= 0.0, 0.0, service * u2 / (2.0 * (1.0 - u2)))


def _front_capped(x: Arr, instances: Arr, p: PerfParams) -> Arr:
    if p.frontend_per_request_s > 0.0:
        return np.minimum(x, instances / p.frontend_per_request_s)
    return x


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block (and resumed after, if it ran before). A ranking
    allocates tens of thousands of levels, none of them in a reference cycle, and the collections their allocation
    set off (each walking every live object) were a third of its time; reference counting frees them as before."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class _Levels:
    """What ``perf_measurement._finish`` takes, for many levels (each element one deployment at one level)."""

    def __init__(self, c: Arr, gpus: Arr, X: Arr, ttft_service: Arr, wait_det: Arr, wait_rand: Arr, tpot: Arr,
                 sd_step: Arr, itl0: Arr, itl1: Arr, f_slow: Arr, imbalance: Arr, raw: dict[str, Any],
                 kv_transfer: bool, expert_balance: Arr, has_balance: Arr) -> None:
        self.c, self.gpus, self.X, self.ttft_service = c, gpus, X, ttft_service
        self.wait_det, self.wait_rand, self.tpot, self.sd_step = wait_det, wait_rand, tpot, sd_step
        self.itl0, self.itl1, self.f_slow, self.imbalance = itl0, itl1, f_slow, imbalance
        self.raw, self.kv_transfer = raw, kv_transfer
        self.expert_balance, self.has_balance = expert_balance, has_balance


def _finish(lv: _Levels, wl: Workload, wd: _WorkloadDerived, jit: float, purpose: str) -> LevelTable:
    """``perf_measurement._finish``, the arithmetic as arrays: the levels' fields, one element per level."""
    osl, r_i, r_o = wd.osl, wd.r_i, wd.r_o
    ts = lv.ttft_service
    det, rand = lv.wait_det, lv.wait_rand
    s50, s90, s99 = _pct_uniform(ts, r_i)  # type: ignore[arg-type]
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


class Batch:
    """Many placed deployments of one model and workload under one set of parameters, ready to be predicted at
    any (deployment, concurrency) pairs: ``predict``."""

    def __init__(self, topologies: Sequence[Topology], model: ModelProfile, wl: Workload, p: PerfParams) -> None:
        self.topologies, self.model, self.wl, self.p = list(topologies), model, wl, p
        self.wd = _wd(wl)
        md = _md(model)
        self.agg = np.array([i for i, t in enumerate(self.topologies) if t.config.mode is Mode.AGGREGATED], dtype=int)
        self.dis = np.array([i for i, t in enumerate(self.topologies) if t.config.mode is not Mode.AGGREGATED],
                            dtype=int)
        # position of each deployment inside its mode's arrays
        self.pos = np.zeros(len(self.topologies), dtype=int)
        self.pos[self.agg] = np.arange(len(self.agg))
        self.pos[self.dis] = np.arange(len(self.dis))
        self.gpus = np.array([float(t.gpus) for t in self.topologies])
        # One ``_Role`` per distinct (role, draft tokens, cluster): a space's thousands of candidates combine a few
        # hundred roles, and building a role's constants was most of a batch's set-up
        uniq: dict[tuple[Any, ...], int] = {}
        roles: list[_Role] = []

        def role(cfg: Any, mtp: int, cluster: Any) -> int:
            key = (cfg, mtp, id(cluster))
            i = uniq.get(key)
            if i is None:
                i = uniq[key] = len(roles)
                roles.append(_Role(cfg, md, self.wd, cluster, p, mtp))
            return i

        ia, ip, idd = [], [], []
        for t in self.topologies:
            cfg = t.config
            d = role(cfg.decode, cfg.speculative_mtp_tokens, t.cluster)
            if cfg.mode is Mode.AGGREGATED:
                ia.append(d)
            else:
                assert cfg.prefill is not None
                ip.append(role(cfg.prefill, 0, t.cluster))
                idd.append(d)
        every = _Roles(roles, p, self.wd)
        if len(self.agg):
            tops = [self.topologies[i] for i in self.agg]
            self.Ra = every.take(np.array(ia, dtype=int))
            self.inst_a = np.array([float(t.config.decode.instances) for t in tops])
        if len(self.dis):
            tops = [self.topologies[i] for i in self.dis]
            self.Rp, self.Rd = every.take(np.array(ip, dtype=int)), every.take(np.array(idd, dtype=int))
            alone = {i: _prefill_alone(roles[i]) for i in set(ip)}
            grids = {i: _decode_grid(roles[i]) for i in set(idd)}
            kv = [_kv_handoff(t, md, self.wd, p) for t in tops]
            self.t_kv = np.array([x[0] for x in kv], dtype=float)
            self.mu_kv = np.array([x[1] for x in kv], dtype=float)
            self.S_p = np.array([alone[i] for i in ip], dtype=float)
            self.osl_steps_d, self.b_kv_d, self.b_cap_d = (np.array([grids[i][j] for i in idd], dtype=float)
                                                           for j in range(3))
            n_pts = max(len(g[3]) for g in grids.values())
            pad = {i: g[3] + [g[3][-1]] * (n_pts - len(g[3])) for i, g in grids.items()}
            self.npts = np.array([len(grids[i][3]) for i in idd], dtype=int)
            self.pts_b = np.array([[b for b, _ in pad[i]] for i in idd], dtype=float)
            self.pts_t = np.array([[t for _, t in pad[i]] for i in idd], dtype=float)
            pre: list[Any] = [t.config.prefill for t in tops]  # every one set: these are P/D deployments
            dec = [t.config.decode for t in tops]
            self.ranks_p = np.array([float(r.instances * r.data_parallel_size) for r in pre])
            self.ranks_d = np.array([float(r.instances * r.data_parallel_size) for r in dec])
            self.inst_pd = np.array([float(min(a.instances, b.instances)) for a, b in zip(pre, dec, strict=True)])
            self.tp_p = np.array([float(r.tensor_parallel_size) for r in pre])

    def predict(self, asked: Sequence[tuple[int, float]], workload: Workload | None = None,
                purpose: str = "fixed", lazy: bool = False) -> list[Measurement] | list[LazyLevel]:
        """The Measurement of deployment ``i`` at concurrency ``max(1, int(load))`` for each ``(i, load)``: what
        ``perf_levels.predict_load`` gives for a concurrency workload, with ``purpose`` (the knee search's levels
        are made as "search" levels rather than copied into them). ``workload`` (default: the batch's) sizes each
        level (``num_prompts``); its lengths must be the batch's. ``lazy``: levels built as Measurements only when
        asked (``perf_measurement.LazyLevel``)."""
        wl = workload or self.wl
        if not asked:
            return []
        idx = np.array([i for i, _ in asked], dtype=int)
        cs = np.array([float(max(1, int(load))) for _, load in asked])
        out: list[Any] = [None] * len(asked)
        is_agg = np.isin(idx, self.agg)
        for mask, run in ((is_agg, self._aggregated), (~is_agg, self._disaggregated)):
            where = np.nonzero(mask)[0]
            if len(where):
                table = run(self.pos[idx[where]], idx[where], cs[where], wl, purpose)
                for j, m in zip(where.tolist(), table.lazy() if lazy else table.rows(), strict=True):
                    out[j] = m
        return out

    # ------------------------------------------------------------------------------ perf_levels, as arrays
    def _aggregated(self, k: Arr, idx: Arr, c: Arr, wl: Workload, purpose: str) -> LevelTable:
        p, wd = self.p, self.wd
        R = self.Ra.take(k)
        inst = self.inst_a[k]
        ranks = inst * R.dp  # instances × data_parallel_size
        M = R.mnbt
        osl_steps = wd.osl / R.acc
        ratio = wd.isl_new / osl_steps
        b_kv = R.kv_cap / (wd.isl + wd.osl)
        b_budget = M / (R.q + ratio)
        b_cap = np.maximum(np.minimum(np.minimum(R.mns, b_kv), b_budget), 1.0)
        n = np.minimum(c, ranks * b_cap)
        b = n / ranks
        occ = np.minimum(b, 1.0)
        bb = np.maximum(b, 1.0)
        cv = _decode_cv(R, b)
        zero = np.zeros_like(b)
        s0 = _step(R, bb, zero, zero, cv, occ)
        chunk = np.maximum(np.minimum(M - bb * R.q, wd.isl_new), 1.0)
        s1 = _step(R, bb, chunk, chunk / wd.isl_new, cv, occ)
        p_avg = b * ratio
        f = np.minimum(p_avg / chunk, 1.0)
        busy_ranks = np.maximum(ranks / inst * occ, 1.0)
        f_any = 1.0 - _pow(1.0 - f, busy_ranks)
        tau = (1.0 - f_any) * s0.total + f_any * s1.total
        n_chunks = np.maximum(wd.isl_new / chunk, 1.0)
        service = n_chunks * s1.total
        chunk_wait = _md1_wait(service, np.minimum(f, RANDOM_WAIT_UTIL_CAP))
        ttft_s = service + chunk_wait + tau + p.request_latency_s
        X = _front_capped(n / (ttft_s + osl_steps * tau), inst, p)
        wait = np.maximum(c / X - (ttft_s + osl_steps * tau), 0.0)
        tpot = tau / R.acc
        sd_step = np.sqrt(f_any * (1.0 - f_any)) * (s1.total - s0.total) / R.acc
        raw = _raw_aggregated(b, b_cap, b_kv, b_budget, R.kv_cap, ranks.astype(int), p_avg, chunk, f_any, tau,
                              chunk_wait, wait, s0, s1)
        lv = _Levels(c, self.gpus[idx], X, ttft_s - chunk_wait, wait, chunk_wait, tpot, sd_step, s0.total, s1.total,
                     f_any, np.maximum(s0.dp_imbalance, s1.dp_imbalance), raw, False, 1.0 / s0.expert_imbalance,
                     R.e > 1)
        return _finish(lv, wl, wd, p.tpot_cv, purpose)

    def _interp(self, k: Arr, b: Arr) -> Arr:
        """``perf_levels._interp`` over each deployment's own decode step grid."""
        B, T, npts = self.pts_b[k], self.pts_t[k], self.npts[k]
        done = b <= B[:, 0]
        res = np.where(done, T[:, 0], 0.0)
        for s in range(B.shape[1] - 1):
            b0, t0, b1, t1 = B[:, s], T[:, s], B[:, s + 1], T[:, s + 1]
            here = ~done & (s + 1 < npts) & (b <= b1)
            gap = np.where(b1 > b0, b1 - b0, 1.0)
            res = np.where(here, np.where(b1 > b0, t0 + (t1 - t0) * (b - b0) / gap, t1), res)
            done |= here
        rows = np.arange(len(b))
        i1 = np.maximum(npts - 1, 0)
        i0 = np.maximum(npts - 2, 0)
        b0, t0, b1, t1 = B[rows, i0], T[rows, i0], B[rows, i1], T[rows, i1]
        gap = np.where(b1 > b0, b1 - b0, 1.0)
        return np.where(done, res, np.where(b1 > b0, t1 + (t1 - t0) * (b - b1) / gap, t1))

    def _disaggregated(self, k: Arr, idx: Arr, c: Arr, wl: Workload, purpose: str) -> LevelTable:
        p, wd = self.p, self.wd
        Rp, Rd = self.Rp.take(k), self.Rd.take(k)
        t_kv, mu_kv, S_p, osl_steps = self.t_kv[k], self.mu_kv[k], self.S_p[k], self.osl_steps_d[k]
        b_kv, b_cap = self.b_kv_d[k], self.b_cap_d[k]
        ranks_p, ranks_d = self.ranks_p[k], self.ranks_d[k]
        n_cap = ranks_d * b_cap
        mu_rank, s_full = _prefill_capacity(Rp, c / ranks_p)
        mu_p = np.minimum(ranks_p * mu_rank / wd.isl_new, mu_kv)

        def g(n: Arr, sel: Arr) -> Arr:
            x = n / (osl_steps[sel] * self._interp(k[sel], n / ranks_d[sel]))
            u = x / mu_p[sel]
            full = u >= 1.0
            val = n + x * (S_p[sel] + _md1_wait(S_p[sel], np.where(full, 0.0, u)) + t_kv[sel])
            return np.where(full, math.inf, val)

        everyone = np.arange(len(c))
        hi = np.minimum(c, n_cap)
        n = hi.copy()
        search = np.nonzero(~(g(hi, everyone) <= c))[0]  # where the cap does not fit: bisect
        lo_s, hi_s = np.zeros(len(search)), hi[search]
        live = np.arange(len(search))
        for _ in range(40):
            if not len(live):
                break
            sel = search[live]
            mid = 0.5 * (lo_s[live] + hi_s[live])
            over = g(mid, sel) > c[sel]
            hi_s[live] = np.where(over, mid, hi_s[live])
            lo_s[live] = np.where(over, lo_s[live], mid)
            gap = hi_s[live] - lo_s[live]
            live = live[~(gap < 1e-3 * np.maximum(hi_s[live], 1.0))]
        n[search] = np.maximum(lo_s, 1e-6)
        b = n / ranks_d
        sd_ = _step(Rd, np.maximum(b, 1.0), np.zeros_like(b), np.zeros_like(b), _decode_cv(Rd, b), np.minimum(b, 1.0))
        tau = sd_.total
        X = n / (osl_steps * tau)
        X = np.where(X >= mu_p, mu_p * 0.999, X)
        x_engine = X
        X = _front_capped(X, self.inst_pd[k], p)
        u = X / mu_p
        wait = np.where(X == x_engine, (c - n) / X, c / X - osl_steps * tau) - S_p - t_kv
        wait = np.where(wait > 0.0, wait, 0.0)
        q_wait = np.minimum(wait, _md1_wait(S_p, np.minimum(u, RANDOM_WAIT_UTIL_CAP)))
        wait_d = wait - q_wait
        ttft_service = S_p + t_kv + tau
        tpot = tau / Rd.acc
        raw = _raw_disaggregated(b, b_cap, b_kv, Rd.kv_cap, ranks_d.astype(int), ranks_p.astype(int), mu_p, u, S_p,
                                 q_wait, wait_d, mu_rank / self.tp_p[k] * wd.isl / wd.isl_new, t_kv, mu_kv, sd_, s_full)
        zero = np.zeros_like(tau)
        lv = _Levels(c, self.gpus[idx], X, ttft_service, wait_d, q_wait, tpot, zero, tau, tau, zero,
                     np.maximum(sd_.dp_imbalance, s_full.dp_imbalance), raw, True, 1.0 / sd_.expert_imbalance,
                     Rd.e > 1)
        return _finish(lv, wl, wd, p.tpot_cv, purpose)
