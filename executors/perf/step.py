"""The step-time model: one step of the slowest DP rank of a role (roofline per kernel family, collectives, DBO,
overheads, the API-server bound), over arrays of roles, and the public step and throughput functions built on it.
Part of ``executors.perf``; the equations are ``docs/performance-model.md`` §3.

Written once, over arrays: each of a role's constants (``perf.derived._Role``) is gathered into an array with one
element per (deployment, level) asked (``_Roles``), and one NumPy operation computes one term for all of them — the
guide asks thousands at once; a single role is an array of one (the public functions here, and ``predict``).
``exp`` and ``**`` are Python's ``math`` element by element (NumPy's own may differ in the last bit, and the
model's recorded numbers — ``benchmarks/model_fingerprint.py``, the seeded studies — are those floats).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from executors.perf.derived import _md, _Role, _wd, _WorkloadDerived
from executors.perf.params import PerfParams, default_params
from search_spaces import ClusterSpec, ModelProfile, RoleConfig, Workload

#: Low-latency kernels dispatch at most this many tokens per rank per call; vLLM chunks larger batches.
LL_MAX_TOKENS = 256
#: vLLM's default DBO thresholds (tokens per rank) below which a step is not split.
DBO_DECODE_THRESHOLD, DBO_PREFILL_THRESHOLD = 32, 512

Arr = np.ndarray
Num = TypeVar("Num", float, np.ndarray)

# ``_Role`` attributes the step model reads, gathered into one row each (numbers, then flags).
_role_fields = ("tokens_per_decode_seq", "dp_ranks_max_z", "rate_lin", "f_body", "f_lm", "w_dense_t", "ctx_dec",
                "fa_dec", "rate_attn", "ctx_pf", "fa_pf", "kv_bytes_per_token_per_gpu", "bw", "dp",
                "expert_gpus_max_z", "k", "group", "cv_static2", "pair_flops_per_gpu", "exp_eff", "slots_local",
                "log_miss", "w_slot_t", "mtp_factor", "c_byte", "own_div", "bytes_copy", "tp", "copies", "a2a_lat",
                "ar_t0", "ar_byte", "eager", "layer_floor", "dp_sync", "eplb_amort", "acc", "kv_cap", "e",
                "rate_exp", "kr_dec", "kr_pf")
_role_flags = ("agrs", "ll_chunked", "dbo", "graphable")


def _exp(x: Arr) -> Arr:
    """``math.exp`` of each element."""
    return np.array([math.exp(v) for v in x.tolist()], dtype=float)


def _pow(x: Arr, y: Arr) -> Arr:
    """``x ** y`` element by element with Python floats."""
    return np.array([a ** b for a, b in zip(x.tolist(), y.tolist(), strict=True)], dtype=float)


def _one(x: float) -> Arr:
    """``x`` as an array of one (a single role or level asked)."""
    return np.array([float(x)])


class _Roles:
    """Roles' constants (``perf.derived._Role``), attribute by attribute, one element per role: rows of one
    matrix of numbers and one of flags (``take`` is then two gathers, whatever the number of constants)."""

    def __init__(self, roles: Sequence[_Role], p: PerfParams, wd: _WorkloadDerived) -> None:
        nums = [[float(getattr(r, name)) for name in _role_fields]
                + [float(r.md.L_moe), float(r.cfg.max_num_batched_tokens), float(r.cfg.max_num_seqs)] for r in roles]
        flags = [[bool(getattr(r, name)) for name in _role_flags] for r in roles]
        self._set(p, wd, np.array(nums, dtype=float).reshape(len(roles), -1).T,
                  np.array(flags, dtype=bool).reshape(len(roles), -1).T)

    def _set(self, p: PerfParams, wd: _WorkloadDerived, nums: Arr, flags: Arr) -> None:
        self.p, self.wd, self._nums, self._flags = p, wd, nums, flags
        for name, row in zip((*_role_fields, "L_moe", "mnbt", "mns"), nums, strict=True):
            setattr(self, name, row)
        for name, row in zip(_role_flags, flags, strict=True):
            setattr(self, name, row)

    def take(self, idx: Arr) -> _Roles:
        """The roles at ``idx`` (repeats allowed: one element per deployment or level)."""
        out = _Roles.__new__(_Roles)
        out._set(self.p, self.wd, self._nums[:, idx], self._flags[:, idx])
        return out


class Step(NamedTuple, Generic[Num]):
    """One step of the slowest DP rank, in seconds, and why: floats from the public functions, arrays (one
    element per role asked) inside the model."""

    total: Num
    dense: Num  # attention projections, shared experts, dense FFNs, LM head (roofline)
    attention: Num  # score/value kernels over the context (roofline of FLOPs vs KV reads)
    experts: Num  # routed experts on the hottest GPU (roofline)
    comm: Num  # all-to-all dispatch + combine and TP all-reduces, before overlap
    exposed_comm: Num  # what of comm DBO does not hide
    overhead: Num  # launch latency + scheduler CPU + DP sync + EPLB rearrangement, amortised
    frontend: Num  # API-server time for the instance's streamed tokens (a bound, not an addend)
    dp_imbalance: Num  # max / mean of per-DP-rank load applied to the token-proportional terms
    expert_imbalance: Num  # max / mean of per-GPU routed-expert load
    tokens: Num  # tokens in the step on this rank


def _step(R: _Roles, b: Arr, P: Arr, pf_seqs: Arr, cv_dp: Arr, occ: Arr) -> Step[Arr]:
    """The step time of the slowest rank: ``b`` decode sequences and ``P`` prefill tokens (of ``pf_seqs``
    sequences) per busy rank; ``occ`` the share of ranks that are busy (<1 when requests < ranks).

    ``docs/performance-model.md`` §3, one function per term below: the kernels' rooflines (dense layers,
    attention, routed experts) make the compute, the all-to-all and TP all-reduces the communication, which
    dual-batch overlap may hide; the fixed overheads add to both, and the API server bounds the sum."""
    decode_tokens = b * R.tokens_per_decode_seq
    T = decode_tokens + P
    imb = _dp_imbalance(R, cv_dp, occ)
    mfu = _matmul_efficiency(R.p, P, T)
    rate = R.rate_lin * mfu  # FLOP/s of the body's matmuls at this step's efficiency
    t_dense = _dense_time(R, T, decode_tokens, pf_seqs, imb, rate)
    t_attn = _attention_time(R, b, decode_tokens, P, pf_seqs, imb)
    Tg = T * occ * R.dp  # the EP group's tokens in this step
    imb_e = _expert_imbalance(R, Tg)
    t_exp = _expert_time(R, Tg, imb_e, mfu, rate)
    compute = (t_dense + t_attn + t_exp) * R.mtp_factor  # MTP: about one more layer per draft token (§3 Overheads)
    comm = _all_to_all_time(R, T, Tg, imb_e) + _tp_allreduce_time(R, T)
    core, exposed = _overlap(R, T, P, compute, comm)
    overhead = _overhead_time(R, b, P, pf_seqs)
    gpu = core + overhead
    front = _frontend_time(R, b, pf_seqs, occ)
    total = np.where(gpu > front, gpu, front)
    return Step(total, t_dense, t_attn, t_exp, comm, exposed, overhead, front, imb, imb_e, T)


def _dp_imbalance(R: _Roles, cv_dp: Arr, occ: Arr) -> Arr:
    """``I_dp``: the slowest DP rank's load over the mean, ``1 + z(d)·cv`` (dimensionless), where ``z(d)`` is the
    expected maximum of ``d`` standard normals (Blom's approximation, ``perf.derived.expected_max_z``) and ``cv``
    the per-rank load's coefficient of variation (``_decode_cv``, ``_prefill_cv``). Every rank waits for the
    slowest at each MoE layer (vLLM runs dummy steps on idle ranks), so it applies only when every rank is busy.
    ``docs/performance-model.md`` §3 "DP imbalance"."""
    return np.where(occ >= 1.0, 1.0 + R.dp_ranks_max_z * cv_dp, 1.0)


def _matmul_efficiency(p: PerfParams, P: Arr, T: Arr) -> Arr:
    """``mfu``: the share of the matmul peak reached, ``mfu_decode`` blended towards ``mfu_prefill`` by the
    prefill share of the step's ``T`` tokens (``P`` of them). ``docs/performance-model.md`` §3 "Dense layers"."""
    return np.where(P > 0.0, p.mfu_decode + (p.mfu_prefill - p.mfu_decode) * (P / np.where(T > 0.0, T, 1.0)),
                    p.mfu_decode)


def _dense_time(R: _Roles, T: Arr, decode_tokens: Arr, pf_seqs: Arr, imb: Arr, rate: Arr) -> Arr:
    """Seconds of the dense layers (attention projections, shared experts, dense FFNs, LM head), a roofline: the
    FLOPs of ``T`` tokens through the body plus the logits of each decode token and prefill sequence, scaled by
    the DP imbalance, at ``rate`` FLOP/s — or reading the weights once, whichever is longer.
    ``docs/performance-model.md`` §3 "Dense layers"."""
    return np.maximum((T * R.f_body + (decode_tokens + pf_seqs) * R.f_lm) * imb / rate, R.w_dense_t)


def _attention_time(R: _Roles, b: Arr, decode_tokens: Arr, P: Arr, pf_seqs: Arr, imb: Arr) -> Arr:
    """Seconds of the score/value kernels over the context, a roofline: FLOPs (each query token against its
    mean context, decode and prefill at their own efficiencies) against the KV bytes each sequence reads
    (``κ`` folds the layer kinds that are not full attention), both scaled by the DP imbalance.
    ``docs/performance-model.md`` §3 "Attention", §2 for ``F_att`` and ``κ`` per layer kind."""
    p = R.p
    t_attn_c = imb * (decode_tokens * R.ctx_dec * R.fa_dec / (R.rate_attn * p.attn_eff_decode)
                      + P * R.ctx_pf * R.fa_pf / (R.rate_attn * p.attn_eff_prefill))
    t_attn_m = imb * (b * R.ctx_dec * R.kr_dec + pf_seqs * R.ctx_pf * R.kr_pf) * R.kv_bytes_per_token_per_gpu / R.bw
    return np.where(t_attn_c > t_attn_m, t_attn_c, t_attn_m)


def _expert_imbalance(R: _Roles, Tg: Arr) -> Arr:
    """``I_e``: the hottest GPU's routed-expert load over the mean, ``1 + z(G)·√(cv_s² + 1/pairs)`` — the
    static popularity skew of the experts a GPU holds (less with EPLB) and the multinomial noise of ``pairs``
    routed (token, expert) pairs per GPU; 1 without expert parallelism (every GPU holds a slice of each expert)
    or with no tokens. ``docs/performance-model.md`` §3 "Routed experts"."""
    spread = (R.expert_gpus_max_z > 0.0) & (Tg > 0.0)
    pairs = np.where(spread, Tg * R.k / R.group, 1.0)  # routed pairs per GPU, evenly spread
    return np.where(spread, 1.0 + R.expert_gpus_max_z * np.sqrt(R.cv_static2 + 1.0 / pairs), 1.0)


def _expert_time(R: _Roles, Tg: Arr, imb_e: Arr, mfu: Arr, rate: Arr) -> Arr:
    """Seconds of the routed experts on the hottest GPU of the group, a roofline: the group's ``Tg·k`` routed
    pairs at the experts' own format's peak (narrow-GEMM factor ``η_w`` for sliced TP experts), scaled by the
    expert imbalance — or reading the expert slots the group's tokens touch (at small batches only those),
    whichever is longer. ``docs/performance-model.md`` §3 "Routed experts" and "TP experts"."""
    rate_e = np.where(R.rate_exp == R.rate_lin, rate, R.rate_exp * mfu)  # the experts' own format's peak
    t_exp_c = Tg * R.k * R.pair_flops_per_gpu * imb_e / (rate_e * R.exp_eff)
    touched = np.where(Tg > 0.0, R.slots_local * (1.0 - _exp(Tg * R.log_miss)), 0.0)
    t_exp_m = touched * R.w_slot_t
    return np.where(t_exp_c > t_exp_m, t_exp_c, t_exp_m)


def _all_to_all_time(R: _Roles, T: Arr, Tg: Arr, imb_e: Arr) -> Arr:
    """Seconds of the MoE dispatch + combine over all MoE layers: a fixed latency per call (the low-latency
    kernels are called once per ``LL_MAX_TOKENS`` tokens, as vLLM chunks them) plus the bytes leaving the GPU
    at ``c_byte`` s/byte. DeepEP and FlashInfer send copies of a rank's tokens to the GPUs holding their experts
    (scaled by the expert imbalance); all-gather + reduce-scatter — that backend, or vLLM's fallback for DP with
    TP experts — moves every other rank's tokens. 0 where vLLM runs no all-to-all (one GPU, plain TP, TP × EP
    with one DP rank). ``docs/performance-model.md`` §3 "All-to-all" and "TP experts"."""
    own = T / R.own_div
    vol = np.where(R.agrs, np.where(Tg > own, Tg - own, 0.0) * R.bytes_copy,
                   (T / R.tp) * R.copies * R.bytes_copy * imb_e)
    calls = 2.0 * np.where(R.ll_chunked & (T > LL_MAX_TOKENS), np.ceil(T / LL_MAX_TOKENS), 1.0)
    return np.where(R.c_byte > 0.0, R.L_moe * (calls * R.a2a_lat + vol * R.c_byte), 0.0)


def _tp_allreduce_time(R: _Roles, T: Arr) -> Arr:
    """Seconds of the tensor-parallel all-reduces, two per layer of BF16 activations over NVLink: a latency each
    plus ``T`` tokens' bytes; 0 without TP. ``docs/performance-model.md`` §3 "All-to-all" (its last sentence)."""
    return np.where(R.ar_t0 > 0.0, R.ar_t0 + T * R.ar_byte, 0.0)


def _overlap(R: _Roles, T: Arr, P: Arr, compute: Arr, comm: Arr) -> tuple[Arr, Arr]:
    """(seconds of compute and communication together, seconds of communication left exposed). Dual-batch
    overlap — on, supported by the backend, and with at least vLLM's default thresholds of tokens per rank
    (``DBO_DECODE_THRESHOLD``, ``DBO_PREFILL_THRESHOLD``) — splits the step into two micro-batches, one's
    all-to-all hiding behind the other's compute at a cost of ``dbo_overhead`` more compute; otherwise the two
    add. ``docs/performance-model.md`` §3 "Dual-batch overlap"."""
    p = R.p
    split = R.dbo & (T >= np.where(P > 0.0, DBO_PREFILL_THRESHOLD, DBO_DECODE_THRESHOLD))
    c2 = compute * (1.0 + p.dbo_overhead)
    first = c2 > comm
    core_split = np.where(first, c2, comm) + (1.0 - p.dbo_overlap) * np.where(first, comm, c2)
    core = np.where(split, core_split, compute + comm)
    exposed = np.where(split, core_split - c2, comm)
    return core, exposed


def _overhead_time(R: _Roles, b: Arr, P: Arr, pf_seqs: Arr) -> Arr:
    """Seconds of fixed overheads of the step: launch latency (per step and per layer, more per layer without full
    CUDA graphs — prefill steps, DeepEP high-throughput, a GPU kind without graphs), the scheduler's CPU time per
    step and per sequence, the DP ranks' synchronisation and EPLB's rearrangements amortised over their interval.
    ``docs/performance-model.md`` §3 "Overheads"."""
    p = R.p
    graphs = (P <= 0.0) & R.graphable
    return (p.step_latency_s + R.layer_floor + np.where(graphs, 0.0, R.eager) + p.cpu_step_s
            + p.cpu_per_seq_s * (b + pf_seqs) + R.dp_sync + R.eplb_amort)


def _frontend_time(R: _Roles, b: Arr, pf_seqs: Arr, occ: Arr) -> Arr:
    """Seconds the instance's API server spends on the tokens streamed in one step (accepted decode tokens and a
    first token per prefill sequence, over the busy DP ranks): vLLM runs one API server per instance in its own
    process, so this bounds the step rather than adding to it. ``docs/performance-model.md`` §3 "API server"."""
    return (b * R.acc + pf_seqs) * R.dp * occ * R.p.frontend_per_token_s


def _decode_cv(R: _Roles, b: Arr) -> Arr:
    """Per-rank decode load CV: request counts and context lengths of ``b`` sequences (DP-balanced)."""
    return np.where(R.dp <= 1, 0.0,
                    R.p.dp_balance_cv * np.sqrt((1.0 + R.wd.cv_ctx_dec ** 2) / np.maximum(b, 1.0)))


def _prefill_cv(R: _Roles, P: Arr, q: Arr) -> Arr:
    """Per-rank prefill load CV: ``P`` tokens per step drawn from requests of varying length (attention
    grows with the square of the length), ``q`` requests in flight per rank."""
    wd = R.wd
    # share of the step that is attention, to first order
    a = wd.ctx_pf * R.fa_pf / (R.rate_attn * R.p.attn_eff_prefill)
    exp = R.k * R.pair_flops_per_gpu * R.group / R.tp
    lin = np.where(R.rate_exp == R.rate_lin, (R.f_body + exp) / (R.rate_lin * R.p.mfu_prefill),
                   R.f_body / (R.rate_lin * R.p.mfu_prefill) + exp / (R.rate_exp * R.p.mfu_prefill))
    f_att = a / (a + lin)
    cv_req = wd.cv_isl * (1.0 + f_att)
    n_step = np.maximum(P / wd.isl_new, 1.0)
    cv = R.p.dp_balance_cv * cv_req * np.sqrt(1.0 / n_step + 1.0 / np.maximum(q, 1.0))
    return np.where(R.dp <= 1, 0.0, cv)


def _prefill_capacity(R: _Roles, q: Arr, imbalance: bool = True) -> tuple[Arr, Step[Arr], Arr]:
    """(new tokens/s per rank at ``q`` requests in flight per rank, the step, tokens per step)."""
    wd = R.wd
    P = np.minimum(np.minimum(R.mnbt, R.mns * wd.isl_new), np.maximum(q, 1.0) * wd.isl_new)
    P = np.where(R.kv_cap > 0, np.minimum(P, np.maximum(R.kv_cap, 1.0)), P)
    P = np.maximum(P, 1.0)
    cv = _prefill_cv(R, P, q) if imbalance else np.zeros_like(P)
    st = _step(R, np.zeros_like(P), P, P / wd.isl_new, cv, np.ones_like(P))
    return P / st.total, st, P


# --------------------------------------------------------------------------------------------- public step API
def _role(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, workload: Workload,
          params: PerfParams | None, mtp: int = 0) -> _Roles:
    p = params or default_params(cluster.gpu)
    wd = _wd(workload)
    return _Roles([_Role(role, _md(model), wd, cluster, p, mtp)], p, wd)


def _first(st: Step[Arr]) -> Step[float]:
    """The step of a single role asked, as floats."""
    return Step(*(float(v[0]) for v in st))


def _decode_step(R: _Roles, batch: float) -> Step[float]:
    b = _one(batch)
    zero = np.zeros_like(b)
    return _first(_step(R, np.maximum(b, 1.0), zero, zero, _decode_cv(R, b), np.minimum(b, 1.0)))


def prefill_step_time(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, workload: Workload,
                      params: PerfParams | None = None, *, tokens: int | float | None = None,
                      requests_per_rank: float = 1.0) -> Step[float]:
    """One prefill step of the slowest DP rank of ``role``: ``tokens`` new tokens per rank (default the
    token budget), context from ``workload`` (ISL, prefix reuse), ``requests_per_rank`` in flight."""
    R = _role(role, model, cluster, workload, params)
    P = _one(tokens if tokens is not None else role.max_num_batched_tokens)
    cv = _prefill_cv(R, P, _one(requests_per_rank))
    return _first(_step(R, np.zeros_like(P), P, P / R.wd.isl_new, cv, np.ones_like(P)))


def decode_step_time(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, workload: Workload,
                     params: PerfParams | None = None, *, batch: float, mtp_tokens: int = 0) -> Step[float]:
    """One decode step of the slowest DP rank of ``role`` with ``batch`` sequences per rank."""
    return _decode_step(_role(role, model, cluster, workload, params, mtp_tokens), batch)


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
    rates, steps, tokens = _prefill_capacity(R, _one(q), imbalance)
    rate, st, P = float(rates[0]), _first(steps), float(tokens[0])
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
    st = _decode_step(R, batch)
    acc = float(R.acc[0])
    return {
        "output_tokens_per_s_per_gpu": batch * acc / st.total / role.tensor_parallel_size,
        "tpot_ms": 1000.0 * st.total / acc,
        "step_s": st.total,
        "dp_imbalance": st.dp_imbalance,
        "expert_imbalance": st.expert_imbalance,
        "dense_s": st.dense, "attention_s": st.attention, "experts_s": st.experts, "comm_s": st.comm,
        "exposed_comm_s": st.exposed_comm, "overhead_s": st.overhead, "frontend_s": st.frontend,
    }


def _breakdown(prefix: str, st: Step[Arr]) -> dict[str, Arr]:
    return {
        f"{prefix}_step_ms": st.total * 1e3, f"{prefix}_dense_ms": st.dense * 1e3,
        f"{prefix}_attention_ms": st.attention * 1e3, f"{prefix}_experts_ms": st.experts * 1e3,
        f"{prefix}_comm_ms": st.comm * 1e3, f"{prefix}_exposed_comm_ms": st.exposed_comm * 1e3,
        f"{prefix}_overhead_ms": st.overhead * 1e3, f"{prefix}_frontend_ms": st.frontend * 1e3,
        f"{prefix}_dp_imbalance": st.dp_imbalance, f"{prefix}_expert_imbalance": st.expert_imbalance,
        f"{prefix}_tokens_per_rank": st.tokens,
    }
