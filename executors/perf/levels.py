"""The load-level model: a closed loop of ``C`` users on an aggregated or a disaggregated (P/D) deployment —
batch caps, prefill/decode interference, prefill capacity, KV hand-off, M/D/1 queueing — over arrays of
(deployment, level) pairs (``Batch``), and ``predict`` / ``predict_load``, the model's entry points: one deployment
is a batch of one. Part of ``executors.perf`` (``docs/performance-model.md`` §4).

Why arrays: the guide ranks every valid candidate of a space by the model's knee (thousands of candidates, about
seven levels each); the knee searches run in lockstep (``executors.measuring.loop.search_many``), each round asking
every unfinished search its next load, and one NumPy operation does one step of every candidate's level.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from executors.perf.deployments import Deployments
from executors.perf.derived import _wd, _WorkloadDerived, memo
from executors.perf.measurement import LazyLevel, LevelTable, _finish, _Levels
from executors.perf.params import MODEL_VERSION, PerfParams, default_params
from executors.perf.step import Arr, Step, _breakdown, _decode_cv, _pow, _prefill_capacity, _step
from search_spaces import PERCENTILES, Measurement, ModelProfile, Workload

if TYPE_CHECKING:
    from executors.topology import Topology

#: Utilisation above which queueing is modelled as a steady closed-loop queue rather than random jitter.
RANDOM_WAIT_UTIL_CAP = 0.9


def _front_capped(x: Arr, instances: Arr, p: PerfParams, prompt_s: Arr | float = 0.0) -> Arr:
    """Request throughput ``x`` capped by the API servers' CPU (one per instance): ``frontend_per_request_s`` and
    ``prompt_s``, a prompt's own processing, per request."""
    per_request = p.frontend_per_request_s + prompt_s
    if np.any(np.asarray(per_request) > 0.0):
        return np.minimum(x, instances / np.maximum(per_request, 1e-12))
    return x


def _front_wait(x: Arr, instances: Arr, users: Arr, prompt_s: Arr | float) -> Arr:
    """Mean wait of a prompt behind the others in its instance's API server (one server, prompts processed one
    after another): M/D/1 at the *other* users' share of it, as for a rank's prefill slot (an instance's only
    user waits for nobody), capped as the engine's queues are."""
    per = users / instances
    others = np.maximum(per - 1.0, 0.0) / np.maximum(per, 1.0)
    u = np.minimum(x * prompt_s / instances * others, RANDOM_WAIT_UTIL_CAP)
    return _md1_wait(np.broadcast_to(np.asarray(prompt_s, dtype=float), np.shape(x)), u)


def _md1_wait(service: Arr, u: Arr) -> Arr:
    """Mean M/D/1 queueing delay at utilisation ``u`` (grows without bound as u → 1)."""
    u2 = np.minimum(u, 0.999)
    return np.where(u <= 0.0, 0.0, service * u2 / (2.0 * (1.0 - u2)))


def _interp(B: Arr, T: Arr, npts: Arr, b: Arr) -> Arr:
    """Piecewise-linear τ(b) through each row's first ``npts`` points ``(B, T)`` (sorted by b, distinct), flat below
    the first point and extended past the last by its last segment."""
    below = ((B < b[:, None]) & (np.arange(B.shape[1]) < npts[:, None])).sum(axis=1)  # points under b
    past = below >= npts
    rows = np.arange(len(b))
    i1 = np.where(past, npts - 1, np.maximum(below, 1))
    i0 = np.maximum(i1 - 1, 0)
    b0, t0, b1, t1 = B[rows, i0], T[rows, i0], B[rows, i1], T[rows, i1]
    rising = b1 > b0
    gap = np.where(rising, b1 - b0, 1.0)
    inside = np.where(rising, t0 + (t1 - t0) * (b - b0) / gap, t1)
    beyond = np.where(rising, t1 + (t1 - t0) * (b - b1) / gap, t1)
    return np.where(below == 0, T[:, 0], np.where(past, beyond, inside))


def _users(n: Arr, osl_steps: Arr, grid: tuple[Arr, Arr, Arr], ranks_d: Arr, mu_p: Arr, S_p: Arr, t_kv: Arr) -> Arr:
    """Users a P/D closed loop holds with ``n`` of them decoding (decoding, queued for prefill, prefilled, moved),
    the decode step interpolated through its grid; inf past the prefill capacity."""
    x = n / (osl_steps * _interp(*grid, n / ranks_d))
    u = x / mu_p
    full = u >= 1.0
    val = n + x * (S_p + _md1_wait(S_p, np.where(full, 0.0, u)) + t_kv)
    return np.where(full, math.inf, val)


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


class Batch(Deployments):
    """Deployments (``perf.deployments``) ready to be predicted at any (deployment, concurrency) pairs: ``predict``,
    each mode's levels as arrays."""

    def predict(self, asked: Sequence[tuple[int, float]], workload: Workload | None = None,
                purpose: str = "fixed", lazy: bool = False) -> list[Measurement] | list[LazyLevel]:
        """The Measurement of deployment ``i`` at concurrency ``max(1, int(load))`` for each ``(i, load)``, with
        ``purpose`` (the knee search's levels are made as "search" levels rather than copied into them).
        ``workload`` (default: the batch's) sizes each level (``num_prompts``); its lengths must be the batch's.
        ``lazy``: levels built as Measurements only when asked (``perf.measurement.LazyLevel``)."""
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

    def _aggregated(self, k: Arr, idx: Arr, c: Arr, wl: Workload, purpose: str) -> LevelTable:
        p, wd = self.p, self.wd
        R = self.Ra.take(k)
        inst = self.inst_a[k]
        ranks = inst * R.dp  # instances × data_parallel_size
        M = R.mnbt
        osl_steps = wd.osl / R.acc
        ratio = wd.isl_new / osl_steps  # prefill tokens a running request brings per decode step
        b_kv = R.kv_cap / (wd.isl + wd.osl)
        b_budget = M / (R.tokens_per_decode_seq + ratio)
        b_cap = np.maximum(np.minimum(np.minimum(R.mns, b_kv), b_budget), 1.0)
        n = np.minimum(c, ranks * b_cap)
        b = n / ranks
        occ = np.minimum(b, 1.0)
        bb = np.maximum(b, 1.0)
        cv = _decode_cv(R, b)
        zero = np.zeros_like(b)
        s0 = _step(R, bb, zero, zero, cv, occ)
        chunk = np.maximum(np.minimum(M - bb * R.tokens_per_decode_seq, wd.isl_new), 1.0)
        s1 = _step(R, bb, chunk, chunk / wd.isl_new, cv, occ)
        p_avg = b * ratio  # prefill tokens per rank per step
        f = np.minimum(p_avg / chunk, 1.0)
        busy_ranks = np.maximum(ranks / inst * occ, 1.0)
        f_any = 1.0 - _pow(1.0 - f, busy_ranks)  # every rank of an instance waits for any rank's chunk
        tau = (1.0 - f_any) * s0.total + f_any * s1.total
        n_chunks = np.maximum(wd.isl_new / chunk, 1.0)
        service = n_chunks * s1.total
        # the wait for this rank's prefill slot is for the *other* requests' chunks: a rank's only request (c = 1,
        # a prefill probe) waits for nothing, where the whole slot's utilisation said 4.5 service times
        others = np.maximum(b - 1.0, 0.0) / bb
        chunk_wait = _md1_wait(service, np.minimum(f * others, RANDOM_WAIT_UTIL_CAP))
        prompt_s = wd.isl * p.frontend_per_prompt_token_s  # the API server's work on this prompt, before the engine
        ttft_s = service + chunk_wait + tau + p.request_latency_s + prompt_s  # + first decode step, + the way in
        front_wait = _front_wait(n / (ttft_s + osl_steps * tau), inst, n, prompt_s) if prompt_s > 0.0 else zero
        chunk_wait = chunk_wait + front_wait  # random waits (exponential percentiles)
        ttft_s = ttft_s + front_wait
        X = _front_capped(n / (ttft_s + osl_steps * tau), inst, p, prompt_s)
        wait = np.maximum(c / X - (ttft_s + osl_steps * tau), 0.0)  # Little's law: the rest of C queues
        tpot = tau / R.acc
        sd_step = np.sqrt(f_any * (1.0 - f_any)) * (s1.total - s0.total) / R.acc
        raw = _raw_aggregated(b, b_cap, b_kv, b_budget, R.kv_cap, ranks.astype(int), p_avg, chunk, f_any, tau,
                              chunk_wait, wait, s0, s1)
        lv = _Levels(c, self.gpus[idx], X, ttft_s - chunk_wait, wait, chunk_wait, tpot, sd_step, s0.total, s1.total,
                     f_any, np.maximum(s0.dp_imbalance, s1.dp_imbalance), raw, False, 1.0 / s0.expert_imbalance,
                     R.e > 1)
        return _finish(lv, wl, wd, p.tpot_cv, purpose)

    def _disaggregated(self, k: Arr, idx: Arr, c: Arr, wl: Workload, purpose: str) -> LevelTable:
        p, wd = self.p, self.wd
        Rp, Rd = self.Rp.take(k), self.Rd.take(k)
        t_kv, mu_kv, S_p, osl_steps = self.t_kv[k], self.mu_kv[k], self.S_p[k], self.osl_steps_d[k]
        b_kv, b_cap = self.b_kv_d[k], self.b_cap_d[k]
        ranks_p, ranks_d = self.ranks_p[k], self.ranks_d[k]
        n_cap = ranks_d * b_cap
        mu_rank, s_full, _ = _prefill_capacity(Rp, c / ranks_p)
        mu_p = np.minimum(ranks_p * mu_rank / wd.isl_new, mu_kv)  # requests/s
        grid = (self.pts_b[k], self.pts_t[k], self.npts[k])
        # solve users(n) = C for the users decoding: the cap where it fits, else bisection (each element its own)
        hi = np.minimum(c, n_cap)
        n = hi.copy()
        search = np.nonzero(~(_users(hi, osl_steps, grid, ranks_d, mu_p, S_p, t_kv) <= c))[0]
        if len(search):
            lo_s, hi_s, c_s = np.zeros(len(search)), hi[search], c[search]
            at = (osl_steps[search], tuple(x[search] for x in grid), ranks_d[search], mu_p[search], S_p[search],
                  t_kv[search])
            live = np.ones(len(search), dtype=bool)
            for _ in range(40):
                mid = 0.5 * (lo_s + hi_s)
                over = _users(mid, *at) > c_s
                hi_s = np.where(live & over, mid, hi_s)
                lo_s = np.where(live & ~over, mid, lo_s)
                live &= ~(hi_s - lo_s < 1e-3 * np.maximum(hi_s, 1.0))
                if not live.any():
                    break
            n[search] = np.maximum(lo_s, 1e-6)
        b = n / ranks_d
        sd_ = _step(Rd, np.maximum(b, 1.0), np.zeros_like(b), np.zeros_like(b), _decode_cv(Rd, b), np.minimum(b, 1.0))
        tau = sd_.total
        X = n / (osl_steps * tau)
        X = np.where(X >= mu_p, mu_p * 0.999, X)  # the exact step came out faster than the interpolation
        x_engine = X
        prompt_s = wd.isl * p.frontend_per_prompt_token_s  # the API server's work on a prompt, before the prefill
        X = _front_capped(X, self.inst_pd[k], p, prompt_s)
        u = X / mu_p
        # Little's law on the closed loop: whatever of C is neither decoding nor being prefilled or moved waits.
        # Congestion jitter (M/D/1, utilisation capped) is the random part; the rest is a steady queue that every
        # request sits through (closed loop at saturation)
        wait = np.where(X == x_engine, (c - n) / X, c / X - osl_steps * tau) - S_p - t_kv
        wait = np.where(wait > 0.0, wait, 0.0)
        q_wait = np.minimum(wait, _md1_wait(S_p, np.minimum(u, RANDOM_WAIT_UTIL_CAP)))
        wait_d = wait - q_wait
        ttft_service = S_p + t_kv + tau + prompt_s
        tpot = tau / Rd.acc
        raw = _raw_disaggregated(b, b_cap, b_kv, Rd.kv_cap, ranks_d.astype(int), ranks_p.astype(int), mu_p, u, S_p,
                                 q_wait, wait_d, mu_rank / self.tp_p[k] * wd.isl / wd.isl_new, t_kv, mu_kv, sd_, s_full)
        zero = np.zeros_like(tau)
        lv = _Levels(c, self.gpus[idx], X, ttft_service, wait_d, q_wait, tpot, zero, tau, tau, zero,
                     np.maximum(sd_.dp_imbalance, s_full.dp_imbalance), raw, True, 1.0 / sd_.expert_imbalance,
                     Rd.e > 1)
        return _finish(lv, wl, wd, p.tpot_cv, purpose)


def _raw_aggregated(b: Arr, b_cap: Arr, b_kv: Arr, b_budget: Arr, kv_cap: Arr, ranks: Arr, p_avg: Arr, chunk: Arr,
                    f_any: Arr, tau: Arr, chunk_wait: Arr, wait: Arr, s0: Step[Arr], s1: Step[Arr]) -> dict[str, Any]:
    """The ``raw`` breakdown of aggregated levels."""
    return {
        "model": MODEL_VERSION, "mode": "aggregated",
        "batch_per_rank": b, "batch_cap": b_cap, "batch_cap_kv": b_kv, "batch_cap_budget": b_budget,
        "kv_capacity_tokens_per_rank": kv_cap, "ranks": ranks,
        "prefill_tokens_per_step": p_avg, "prefill_chunk": chunk, "stall_share": f_any,
        "mean_step_ms": tau * 1e3, "queue_random_ms": chunk_wait * 1e3, "queue_steady_ms": wait * 1e3,
        **_breakdown("decode", s0), **_breakdown("mixed", s1),
    }


def _raw_disaggregated(b: Arr, b_cap: Arr, b_kv: Arr, kv_cap: Arr, ranks_d: Arr, ranks_p: Arr, mu_p: Arr, u: Arr,
                       S_p: Arr, q_wait: Arr, wait_d: Arr, prefill_per_gpu: Arr, t_kv: Arr, mu_kv: Arr,
                       sd_: Step[Arr], s_full: Step[Arr]) -> dict[str, Any]:
    """The ``raw`` breakdown of P/D levels."""
    return {
        "model": MODEL_VERSION, "mode": "disaggregated",
        "decode_batch_per_rank": b, "decode_batch_cap": b_cap, "decode_batch_cap_kv": b_kv,
        "decode_kv_capacity_tokens_per_rank": kv_cap, "decode_ranks": ranks_d, "prefill_ranks": ranks_p,
        "prefill_capacity_req_s": mu_p, "prefill_utilisation": u, "prefill_latency_ms": S_p * 1e3,
        "queue_random_ms": q_wait * 1e3, "queue_steady_ms": wait_d * 1e3,
        "prefill_input_tokens_per_s_per_gpu": prefill_per_gpu,
        "kv_transfer_ms": t_kv * 1e3, "kv_transfer_capacity_req_s": mu_kv,
        **_breakdown("decode", sd_), **_breakdown("prefill", s_full),
    }


#: A deployment asked alone, kept while the same objects are asked again: the knee search and ``predict_load``
#: predict one level at a time (keyed by the derived numbers, which workloads that differ only in their levels
#: share: ``perf.derived.same_lengths``; a study's candidates pass through; emptied at 1,024 entries).
_ALONE_CACHE: dict[tuple[int, ...], tuple[tuple[Any, ...], Batch]] = {}


def _alone(topology: Topology, model: ModelProfile, wd: _WorkloadDerived, p: PerfParams) -> Batch:
    return Batch([topology], model, wd.wl, p)


def predict(topology: Topology, model: ModelProfile, workload: Workload,
            params: PerfParams | None = None, levels: list[int] | None = None) -> list[Measurement]:
    """One simulated Measurement per concurrency of ``levels`` (default: the workload's fixed levels) for the
    placed deployment ``topology``: a batch of one deployment. A non-finite or negative number is missing."""
    p = params or default_params(topology.cluster.gpu)
    cs = list(workload.load_levels if levels is None else levels)
    batch = memo(_ALONE_CACHE, _alone, topology, model, _wd(workload), p, limit=1023)
    return batch.predict([(0, float(c)) for c in cs], workload)  # type: ignore[return-value]


def predict_load(topology: Topology, model: ModelProfile, workload: Workload, load: float,
                 params: PerfParams | None = None) -> Measurement:
    """The prediction at one load level: a concurrency, or (``load_by: rate``) a request rate.

    A rate is modelled by the closed loop that carries it (Little's law): the smallest concurrency whose
    predicted request throughput reaches the rate. A rate above what ``max_load_concurrency`` requests in
    flight carry overloads the deployment: requests queue for as long as the level lasts, which the TTFT
    percentiles get on top (the q-th request waits about q·n·(1/X − 1/rate))."""
    if workload.load_by == "concurrency":
        return predict(topology, model, workload, params, [max(1, int(load))])[0]
    cap = workload.max_load_concurrency
    at = lambda c: predict(topology, model, workload, params, [c])[0]  # noqa: E731
    top = at(cap)
    x_top = top.request_throughput or 0.0
    if x_top < load:
        n = workload.num_prompts(load)
        wait_ms = 1e3 * n * (1.0 / max(x_top, 1e-9) - 1.0 / load)
        upd = {f"p{q}_ttft_ms": (getattr(top, f"p{q}_ttft_ms") or 0.0) + wait_ms * q / 100 for q in PERCENTILES}
        upd |= {f"p{q}_e2el_ms": (getattr(top, f"p{q}_e2el_ms") or 0.0) + wait_ms * q / 100 for q in PERCENTILES}
        return top.model_copy(update={**upd, "request_rate": float(load), "num_requests": n, "completed": n})
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi) // 2
        if (at(mid).request_throughput or 0.0) >= load:
            hi = mid
        else:
            lo = mid + 1
    m = at(lo)
    n = workload.num_prompts(load)
    return m.model_copy(update={"request_rate": float(load), "num_requests": n, "completed": n})
