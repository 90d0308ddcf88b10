"""The step-time model: one step of the slowest DP rank of a role (roofline per kernel family, collectives,
DBO, overheads, the API-server bound), and the public step and throughput functions built on it. Part of
``executors.perf_model``; the equations are ``docs/performance-model.md`` §3."""

from __future__ import annotations

import math
from typing import NamedTuple

from executors.perf_derived import _md, _Role, _wd
from executors.perf_params import PerfParams, default_params
from search_spaces import ClusterSpec, ModelProfile, RoleConfig, Workload

#: Low-latency kernels dispatch at most this many tokens per rank per call; vLLM chunks larger batches.
LL_MAX_TOKENS = 256
#: vLLM's default DBO thresholds (tokens per rank) below which a step is not split.
DBO_DECODE_THRESHOLD, DBO_PREFILL_THRESHOLD = 32, 512


class Step(NamedTuple):
    """One step of the slowest DP rank, in seconds, and why."""

    total: float
    dense: float  # attention projections, shared experts, dense FFNs, LM head (roofline)
    attention: float  # score/value kernels over the context (roofline of FLOPs vs KV reads)
    experts: float  # routed experts on the hottest GPU (roofline)
    comm: float  # all-to-all dispatch + combine and TP all-reduces, before overlap
    exposed_comm: float  # what of comm DBO does not hide
    overhead: float  # launch latency + scheduler CPU + DP sync + EPLB rearrangement, amortised
    frontend: float  # API-server time for the instance's streamed tokens (a bound, not an addend)
    dp_imbalance: float  # max / mean of per-DP-rank load applied to the token-proportional terms
    expert_imbalance: float  # max / mean of per-GPU routed-expert load
    tokens: float  # tokens in the step on this rank


def _step(R: _Role, b: float, P: float, pf_seqs: float, cv_dp: float, occ: float = 1.0) -> Step:
    """The step time of the slowest rank: ``b`` decode sequences and ``P`` prefill tokens (of ``pf_seqs``
    sequences) per busy rank; ``occ`` the share of ranks that are busy (<1 when requests < ranks)."""
    p = R.p
    Td = b * R.q
    T = Td + P
    imb = 1.0 + R.z_dp * cv_dp if occ >= 1.0 else 1.0
    if P > 0.0:
        mfu = p.mfu_decode + (p.mfu_prefill - p.mfu_decode) * (P / T)
    else:
        mfu = p.mfu_decode
    rate = R.rate_lin * mfu
    # dense layers (weights read once per step)
    t_dense = max((T * R.f_body + (Td + pf_seqs) * R.f_lm) * imb / rate, R.w_dense_t)
    # attention
    t_attn_c = imb * (Td * R.ctx_dec * R.fa_dec / (R.rate_attn * p.attn_eff_decode)
                      + P * R.ctx_pf * R.fa_pf / (R.rate_attn * p.attn_eff_prefill))
    t_attn_m = imb * (b * R.ctx_dec + pf_seqs * R.ctx_pf) * R.kvb / R.bw
    t_attn = t_attn_c if t_attn_c > t_attn_m else t_attn_m
    # routed experts on the hottest GPU of the EP group
    Tg = T * occ * R.dp
    if R.z_e > 0.0 and Tg > 0.0:
        pairs = Tg * R.k / R.group  # routed pairs per GPU, evenly spread
        imb_e = 1.0 + R.z_e * math.sqrt(R.cv_static2 + 1.0 / pairs)
    else:
        imb_e = 1.0
    t_exp_c = Tg * R.k * R.f_pair_g * imb_e / (rate * R.exp_eff)
    touched = R.slots_local * (1.0 - math.exp(Tg * R.log_miss)) if Tg > 0.0 else 0.0
    t_exp_m = touched * R.w_slot_t
    t_exp = t_exp_c if t_exp_c > t_exp_m else t_exp_m
    compute = (t_dense + t_attn + t_exp) * R.mtp_factor
    # communication
    comm = 0.0
    if R.c_byte > 0.0:
        if R.agrs:
            own = T / R.own_div
            vol = (Tg - own if Tg > own else 0.0) * R.bytes_copy
        else:
            vol = (T / R.tp) * R.copies * R.bytes_copy * imb_e
        calls = 2.0 * (math.ceil(T / LL_MAX_TOKENS) if (R.ll_chunked and T > LL_MAX_TOKENS) else 1.0)
        comm = R.md.L_moe * (calls * R.a2a_lat + vol * R.c_byte)
    if R.ar_t0 > 0.0:
        comm += R.ar_t0 + T * R.ar_byte
    if R.dbo and T >= (DBO_PREFILL_THRESHOLD if P > 0.0 else DBO_DECODE_THRESHOLD):
        c2 = compute * (1.0 + p.dbo_overhead)
        hi, lo = (c2, comm) if c2 > comm else (comm, c2)
        core = hi + (1.0 - p.dbo_overlap) * lo
        exposed = core - c2
    else:
        core = compute + comm
        exposed = comm
    graphs = P <= 0.0 and R.graphable
    overhead = (p.step_latency_s + (0.0 if graphs else R.eager) + p.cpu_step_s
                + p.cpu_per_seq_s * (b + pf_seqs) + R.dp_sync + R.eplb_amort)
    gpu = core + overhead
    front = (b * R.acc + pf_seqs) * R.dp * occ * p.frontend_per_token_s
    total = gpu if gpu > front else front
    return Step(total, t_dense, t_attn, t_exp, comm, exposed, overhead, front, imb, imb_e, T)


def _decode_cv(R: _Role, b: float) -> float:
    """Per-rank decode load CV: request counts and context lengths of ``b`` sequences (DP-balanced)."""
    if R.dp <= 1:
        return 0.0
    return R.p.dp_balance_cv * math.sqrt((1.0 + R.wd.cv_ctx_dec ** 2) / max(b, 1.0))


def _prefill_cv(R: _Role, P: float, q: float) -> float:
    """Per-rank prefill load CV: ``P`` tokens per step drawn from requests of varying length (attention
    grows with the square of the length), ``q`` requests in flight per rank."""
    if R.dp <= 1:
        return 0.0
    wd = R.wd
    # share of the step that is attention, to first order
    a = wd.ctx_pf * R.fa_pf / (R.rate_attn * R.p.attn_eff_prefill)
    lin = (R.f_body + R.k * R.f_pair_g * R.group / R.tp) / (R.rate_lin * R.p.mfu_prefill)
    f_att = a / (a + lin)
    cv_req = wd.cv_isl * (1.0 + f_att)
    n_step = max(P / wd.isl_new, 1.0)
    return R.p.dp_balance_cv * cv_req * math.sqrt(1.0 / n_step + 1.0 / max(q, 1.0))


# --------------------------------------------------------------------------------------------- public step API
def _role(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, workload: Workload,
          params: PerfParams | None, mtp: int = 0) -> _Role:
    return _Role(role, _md(model), _wd(workload), cluster, params or default_params(cluster.gpu), mtp)


def prefill_step_time(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, workload: Workload,
                      params: PerfParams | None = None, *, tokens: int | float | None = None,
                      requests_per_rank: float = 1.0) -> Step:
    """One prefill step of the slowest DP rank of ``role``: ``tokens`` new tokens per rank (default the
    token budget), context from ``workload`` (ISL, prefix reuse), ``requests_per_rank`` in flight."""
    R = _role(role, model, cluster, workload, params)
    P = float(tokens if tokens is not None else role.max_num_batched_tokens)
    return _step(R, 0.0, P, P / R.wd.isl_new, _prefill_cv(R, P, requests_per_rank))


def decode_step_time(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, workload: Workload,
                     params: PerfParams | None = None, *, batch: float, mtp_tokens: int = 0) -> Step:
    """One decode step of the slowest DP rank of ``role`` with ``batch`` sequences per rank."""
    R = _role(role, model, cluster, workload, params, mtp_tokens)
    return _step(R, max(batch, 1.0), 0.0, 0.0, _decode_cv(R, batch), min(batch, 1.0))


def _prefill_capacity(R: _Role, q: float, imbalance: bool = True) -> tuple[float, Step, float]:
    """(new tokens/s per rank at ``q`` requests in flight per rank, the step, tokens per step)."""
    wd = R.wd
    cfg = R.cfg
    P = min(float(cfg.max_num_batched_tokens), cfg.max_num_seqs * wd.isl_new, max(q, 1.0) * wd.isl_new)
    if R.kv_cap > 0:
        P = min(P, max(R.kv_cap, 1.0))
    P = max(P, 1.0)
    st = _step(R, 0.0, P, P / wd.isl_new, _prefill_cv(R, P, q) if imbalance else 0.0)
    return P / st.total, st, P


def prefill_throughput_per_gpu(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, workload: Workload,
                               params: PerfParams | None = None, *, concurrency: int | None = None,
                               imbalance: bool = True) -> dict[str, float]:
    """Prefill throughput of ``role`` (all its instances) with ``concurrency`` requests in flight on it
    (default: enough to fill every rank's budget): input tokens/s per GPU (cached prefix included, as
    vllm bench counts them), new tokens/s per GPU, the DP imbalance and the step breakdown.
    ``imbalance=False`` gives the same with perfectly balanced DP ranks (to see what imbalance costs)."""
    R = _role(role, model, cluster, workload, params)
    ranks = role.instances * role.data_parallel_size
    q = (concurrency / ranks) if concurrency else role.max_num_batched_tokens / R.wd.isl_new
    rate, st, P = _prefill_capacity(R, q, imbalance)
    new_per_gpu = rate / role.tensor_parallel_size
    return {
        "input_tokens_per_s_per_gpu": new_per_gpu * R.wd.isl / R.wd.isl_new,
        "new_tokens_per_s_per_gpu": new_per_gpu,
        "dp_imbalance": st.dp_imbalance,
        "expert_imbalance": st.expert_imbalance,
        "step_s": st.total,
        "tokens_per_step": P,
        "dense_s": st.dense, "attention_s": st.attention, "experts_s": st.experts, "comm_s": st.comm,
        "exposed_comm_s": st.exposed_comm, "overhead_s": st.overhead,
    }


def decode_throughput_per_gpu(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, workload: Workload,
                              params: PerfParams | None = None, *, batch: float) -> dict[str, float]:
    """Decode output tokens/s per GPU of ``role`` at ``batch`` sequences per DP rank (no validity check:
    a what-if of the step model)."""
    R = _role(role, model, cluster, workload, params)
    st = _step(R, max(batch, 1.0), 0.0, 0.0, _decode_cv(R, batch), min(batch, 1.0))
    return {
        "output_tokens_per_s_per_gpu": batch * R.acc / st.total / role.tensor_parallel_size,
        "tpot_ms": 1000.0 * st.total / R.acc,
        "step_s": st.total,
        "dp_imbalance": st.dp_imbalance,
        "expert_imbalance": st.expert_imbalance,
        "dense_s": st.dense, "attention_s": st.attention, "experts_s": st.experts, "comm_s": st.comm,
        "exposed_comm_s": st.exposed_comm, "overhead_s": st.overhead, "frontend_s": st.frontend,
    }


def _breakdown(prefix: str, st: Step) -> dict[str, float]:
    return {
        f"{prefix}_step_ms": st.total * 1e3, f"{prefix}_dense_ms": st.dense * 1e3,
        f"{prefix}_attention_ms": st.attention * 1e3, f"{prefix}_experts_ms": st.experts * 1e3,
        f"{prefix}_comm_ms": st.comm * 1e3, f"{prefix}_exposed_comm_ms": st.exposed_comm * 1e3,
        f"{prefix}_overhead_ms": st.overhead * 1e3, f"{prefix}_frontend_ms": st.frontend * 1e3,
        f"{prefix}_dp_imbalance": st.dp_imbalance, f"{prefix}_expert_imbalance": st.expert_imbalance,
        f"{prefix}_tokens_per_rank": st.tokens,
    }
