"""The load-level model: a closed loop of ``C`` users on an aggregated or a disaggregated (P/D) deployment —
batch caps, prefill/decode interference, prefill capacity, KV hand-off, M/D/1 queueing — and ``predict`` /
``predict_load``, the model's entry points. Part of ``executors.perf_model`` (``docs/performance-model.md`` §4)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from executors.perf_derived import _md, _ModelDerived, _Role, _wd, _WorkloadDerived, memo
from executors.perf_measurement import _finish
from executors.perf_params import MODEL_VERSION, PerfParams, default_params
from executors.perf_step import _breakdown, _decode_cv, _prefill_capacity, _step
from search_spaces import Measurement, Mode, ModelProfile, Workload

if TYPE_CHECKING:
    from executors.topology import Topology

#: Utilisation above which queueing is modelled as a steady closed-loop queue rather than random jitter.
RANDOM_WAIT_UTIL_CAP = 0.9


def _front_capped(x: float, instances: int, p: PerfParams) -> float:
    """Request throughput ``x`` capped by the API servers' CPU (one per instance)."""
    if p.frontend_per_request_s > 0.0:
        return min(x, instances / p.frontend_per_request_s)
    return x


def _md1_wait(service: float, u: float) -> float:
    """Mean M/D/1 queueing delay at utilisation ``u`` (grows without bound as u → 1)."""
    if u <= 0.0:
        return 0.0
    if u >= 0.999:
        u = 0.999
    return service * u / (2.0 * (1.0 - u))


#: Constants of one deployment under one set of parameters, kept while the same objects are asked again: the
#: knee search predicts one level at a time, and recomputing a role's constants and the decode step grid for
#: every level was a third of the model's time (a study's candidates pass through; emptied at 1,024 entries).
_ROLES_CACHE: dict[tuple[int, ...], tuple[tuple[Any, ...], Any]] = {}
_PD_CACHE: dict[tuple[int, ...], tuple[tuple[Any, ...], Any]] = {}


def _build_roles(topo: Topology, md: _ModelDerived, wd: _WorkloadDerived, p: PerfParams,
                 ) -> tuple[_Role | None, _Role]:
    cfg = topo.config
    prefill = _Role(cfg.prefill, md, wd, topo.cluster, p, 0) if cfg.prefill is not None else None
    return prefill, _Role(cfg.decode, md, wd, topo.cluster, p, cfg.speculative_mtp_tokens)


def _roles(topo: Topology, model: ModelProfile, wl: Workload, p: PerfParams) -> tuple[_Role | None, _Role]:
    """(prefill role or None, decode role) constants of ``topo`` (keyed by the derived numbers, which workloads
    that differ only in their levels share: ``perf_derived.same_lengths``)."""
    return memo(_ROLES_CACHE, _build_roles, topo, _md(model), _wd(wl), p, limit=1023)


def _disaggregated_constants(topo: Topology, md: _ModelDerived, wd: _WorkloadDerived, p: PerfParams,
                             ) -> tuple[float, float, float, float, float, float, list[tuple[float, float]]]:
    """(KV hand-off time, its capacity, lone prefill latency, decode steps per request, KV batch cap, batch
    cap, decode step grid) of a P/D deployment: what does not depend on the load level."""
    Rp, Rd = memo(_ROLES_CACHE, _build_roles, topo, md, wd, p, limit=1023)
    assert Rp is not None
    return (*_kv_handoff(topo, md, wd, p), _prefill_alone(Rp), *_decode_grid(Rd))


def _kv_handoff(topo: Topology, md: _ModelDerived, wd: _WorkloadDerived, p: PerfParams) -> tuple[float, float]:
    """(time, capacity in requests/s) of moving one request's KV from prefill to decode."""
    cfg, cluster = topo.config, topo.cluster
    assert cfg.prefill is not None
    spec = cluster.spec
    # KV hand-off: the whole context (prefix included) moves; NVLink when the cluster is one domain
    kv_bytes = md.kv_tok * wd.isl
    one_domain = cluster.total_gpus <= max(spec.scaleup_domain, cluster.gpus_per_node)
    link = (spec.scaleup_gbps if one_domain else spec.scaleout_gbps) * 1e9 * p.kv_xfer_eff
    t_kv = p.kv_xfer_latency_s + kv_bytes / link + p.request_latency_s  # the request's way in rides along
    mu_kv = min(cfg.prefill.gpus, cfg.decode.gpus) * link / kv_bytes
    return t_kv, mu_kv


def _prefill_alone(Rp: _Role) -> float:
    """Prefill latency of one request with the prefill instance otherwise idle."""
    wd = Rp.wd
    P1 = min(float(Rp.cfg.max_num_batched_tokens), wd.isl_new)
    s_alone = _step(Rp, 0.0, P1, P1 / wd.isl_new, 0.0)
    return max(wd.isl_new / P1, 1.0) * s_alone.total


def _decode_grid(Rd: _Role) -> tuple[float, float, float, list[tuple[float, float]]]:
    """(decode steps per request, KV batch cap, batch cap, τ(b) at a few batch sizes) of a decode role: the
    closed-loop solve interpolates τ(b) through the grid and is exact at its answer."""
    wd = Rd.wd
    osl_steps = wd.osl / Rd.acc
    b_kv = Rd.kv_cap / (wd.isl + wd.osl)
    b_cap = max(min(float(Rd.cfg.max_num_seqs), b_kv), 1.0)
    grid = sorted({1.0, b_cap ** (1 / 3), b_cap ** (2 / 3), b_cap})
    pts = [(b, _step(Rd, b, 0.0, 0.0, _decode_cv(Rd, b)).total) for b in grid]
    return osl_steps, b_kv, b_cap, pts


def _predict_aggregated(topo: Topology, model: ModelProfile, wl: Workload, p: PerfParams,
                        levels: list[int]) -> list[Measurement]:
    role = topo.config.decode
    wd = _wd(wl)
    R = _roles(topo, model, wl, p)[1]
    ranks = role.instances * role.data_parallel_size
    M = float(role.max_num_batched_tokens)
    osl_steps = wd.osl / R.acc
    ratio = wd.isl_new / osl_steps  # prefill tokens a running request brings per decode step
    b_kv = R.kv_cap / (wd.isl + wd.osl)
    b_budget = M / (R.q + ratio)
    b_cap = max(min(float(role.max_num_seqs), b_kv, b_budget), 1.0)
    gpus = topo.gpus
    out = []
    for c in levels:
        n = min(float(c), ranks * b_cap)
        b = n / ranks
        occ = min(b, 1.0)
        bb = max(b, 1.0)
        cv = _decode_cv(R, b)
        s0 = _step(R, bb, 0.0, 0.0, cv, occ)
        chunk = max(min(M - bb * R.q, wd.isl_new), 1.0)
        s1 = _step(R, bb, chunk, chunk / wd.isl_new, cv, occ)
        p_avg = b * ratio  # prefill tokens per rank per step
        f = min(p_avg / chunk, 1.0)
        busy_ranks = max(ranks / role.instances * occ, 1.0)
        f_any = 1.0 - (1.0 - f) ** busy_ranks  # every rank of an instance waits for any rank's chunk
        tau = (1.0 - f_any) * s0.total + f_any * s1.total
        n_chunks = max(wd.isl_new / chunk, 1.0)
        service = n_chunks * s1.total
        chunk_wait = _md1_wait(service, min(f, RANDOM_WAIT_UTIL_CAP))  # for this rank's prefill slot
        ttft_s = service + chunk_wait + tau + p.request_latency_s  # + first decode step, + the way in
        X = _front_capped(n / (ttft_s + osl_steps * tau), role.instances, p)
        wait = max(c / X - (ttft_s + osl_steps * tau), 0.0)  # Little's law: the rest of C queues
        tpot = tau / R.acc
        sd_step = math.sqrt(f_any * (1.0 - f_any)) * (s1.total - s0.total) / R.acc
        raw = _raw_aggregated(b, b_cap, b_kv, b_budget, R.kv_cap, ranks, p_avg, chunk, f_any, tau, chunk_wait, wait,
                              s0, s1)
        out.append(_finish(c, wl, wd, gpus, X, ttft_s - chunk_wait, wait, chunk_wait,
                           tpot, sd_step, s0.total, s1.total, f_any, max(s0.dp_imbalance, s1.dp_imbalance),
                           raw, False, 1.0 / s0.expert_imbalance if R.e > 1 else None, p.tpot_cv))
    return out


def _interp(pts: list[tuple[float, float]], b: float) -> float:
    """Piecewise-linear τ(b) through ``pts`` (sorted by b), flat below the first point."""
    if b <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0) if b1 > b0 else t1
    (b0, t0), (b1, t1) = pts[-2], pts[-1]
    return t1 + (t1 - t0) * (b - b1) / (b1 - b0) if b1 > b0 else t1


def _predict_disaggregated(topo: Topology, model: ModelProfile, wl: Workload, p: PerfParams,
                           levels: list[int]) -> list[Measurement]:
    cfg = topo.config
    assert cfg.prefill is not None
    wd = _wd(wl)
    Rp, Rd = _roles(topo, model, wl, p)
    assert Rp is not None
    gpus = topo.gpus
    ranks_p = cfg.prefill.instances * cfg.prefill.data_parallel_size
    ranks_d = cfg.decode.instances * cfg.decode.data_parallel_size
    t_kv, mu_kv, S_p, osl_steps, b_kv, b_cap, pts = memo(_PD_CACHE, _disaggregated_constants, topo, _md(model),
                                                         wd, p, limit=1023)
    n_cap = ranks_d * b_cap
    out = []
    for c in levels:
        mu_rank, s_full, P_full = _prefill_capacity(Rp, c / ranks_p)
        mu_p = min(ranks_p * mu_rank / wd.isl_new, mu_kv)  # requests/s

        def x_of(n: float) -> float:
            return n / (osl_steps * _interp(pts, n / ranks_d))

        def g(n: float) -> float:
            x = x_of(n)
            u = x / mu_p
            if u >= 1.0:
                return math.inf
            return n + x * (S_p + _md1_wait(S_p, u) + t_kv)

        hi = min(float(c), n_cap)
        if g(hi) <= c:
            n = hi
        else:
            lo = 0.0
            for _ in range(40):
                mid = 0.5 * (lo + hi)
                if g(mid) > c:
                    hi = mid
                else:
                    lo = mid
                if hi - lo < 1e-3 * max(hi, 1.0):
                    break
            n = max(lo, 1e-6)
        b = n / ranks_d
        sd_ = _step(Rd, max(b, 1.0), 0.0, 0.0, _decode_cv(Rd, b), min(b, 1.0))
        tau = sd_.total
        X = n / (osl_steps * tau)
        if X >= mu_p:  # the exact step came out faster than the interpolation: prefill caps it
            X = mu_p * 0.999
        x_engine = X
        X = _front_capped(X, min(cfg.prefill.instances, cfg.decode.instances), p)
        u = X / mu_p
        # Little's law on the closed loop: whatever of C is neither decoding nor being prefilled or
        # moved waits. Congestion jitter (M/D/1, utilisation capped) is the random part; the rest is a
        # steady queue that every request sits through (closed loop at saturation)
        wait = ((c - n) / X if X == x_engine else c / X - osl_steps * tau) - S_p - t_kv
        wait = wait if wait > 0.0 else 0.0
        q_wait = min(wait, _md1_wait(S_p, min(u, RANDOM_WAIT_UTIL_CAP)))
        wait_d = wait - q_wait
        ttft_service = S_p + t_kv + tau
        tpot = tau / Rd.acc
        raw = _raw_disaggregated(b, b_cap, b_kv, Rd.kv_cap, ranks_d, ranks_p, mu_p, u, S_p, q_wait, wait_d,
                                 mu_rank / cfg.prefill.tensor_parallel_size * wd.isl / wd.isl_new, t_kv, mu_kv, sd_,
                                 s_full)
        out.append(_finish(c, wl, wd, gpus, X, ttft_service, wait_d, q_wait, tpot, 0.0, tau, tau, 0.0,
                           max(sd_.dp_imbalance, s_full.dp_imbalance), raw, True,
                           1.0 / sd_.expert_imbalance if Rd.e > 1 else None, p.tpot_cv))
    return out


def _raw_aggregated(b: Any, b_cap: Any, b_kv: Any, b_budget: Any, kv_cap: Any, ranks: Any, p_avg: Any, chunk: Any,
                    f_any: Any, tau: Any, chunk_wait: Any, wait: Any, s0: Any, s1: Any) -> dict[str, Any]:
    """The ``raw`` breakdown of an aggregated level: floats here, arrays in ``perf_batch``."""
    return {
        "model": MODEL_VERSION, "mode": "aggregated",
        "batch_per_rank": b, "batch_cap": b_cap, "batch_cap_kv": b_kv, "batch_cap_budget": b_budget,
        "kv_capacity_tokens_per_rank": kv_cap, "ranks": ranks,
        "prefill_tokens_per_step": p_avg, "prefill_chunk": chunk, "stall_share": f_any,
        "mean_step_ms": tau * 1e3, "queue_random_ms": chunk_wait * 1e3, "queue_steady_ms": wait * 1e3,
        **_breakdown("decode", s0), **_breakdown("mixed", s1),
    }


def _raw_disaggregated(b: Any, b_cap: Any, b_kv: Any, kv_cap: Any, ranks_d: Any, ranks_p: Any, mu_p: Any, u: Any,
                       S_p: Any, q_wait: Any, wait_d: Any, prefill_per_gpu: Any, t_kv: Any, mu_kv: Any, sd_: Any,
                       s_full: Any) -> dict[str, Any]:
    """The ``raw`` breakdown of a P/D level: floats here, arrays in ``perf_batch``."""
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


def predict(topology: Topology, model: ModelProfile, workload: Workload,
            params: PerfParams | None = None, levels: list[int] | None = None) -> list[Measurement]:
    """One simulated Measurement per concurrency of ``levels`` (default: the workload's fixed levels) for the
    placed deployment ``topology``."""
    p = params or default_params(topology.cluster.gpu)
    cs = list(workload.load_levels if levels is None else levels)
    if topology.config.mode is Mode.AGGREGATED:
        ms = _predict_aggregated(topology, model, workload, p, cs)
    else:
        ms = _predict_disaggregated(topology, model, workload, p, cs)
    return ms  # sane already: ``_finish`` reports a non-finite or negative number as missing


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
        upd = {f"p{q}_ttft_ms": (getattr(top, f"p{q}_ttft_ms") or 0.0) + wait_ms * q / 100 for q in (50, 90, 99)}
        upd |= {f"p{q}_e2el_ms": (getattr(top, f"p{q}_e2el_ms") or 0.0) + wait_ms * q / 100 for q in (50, 90, 99)}
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
