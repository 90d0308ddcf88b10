"""Quantities derived once per model, per workload and per role: the model's FLOPs and bytes per token, the
workload's length statistics, and one role's constants for the step model (rates, shares, all-to-all volumes,
imbalance factors). Part of ``executors.perf``; the equations are ``docs/performance-model.md`` §2–§3."""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Any, TypeVar

from executors.perf.params import PerfParams
from search_spaces import (
    All2AllBackend,
    AttentionKind,
    ClusterSpec,
    Dataset,
    ModelProfile,
    RoleConfig,
    Workload,
    kv_capacity_tokens,
)
from search_spaces.hardware import format_tflops

_ZCACHE: dict[int, float] = {}


def expected_max_z(n: int) -> float:
    """E[max of n iid standard normals] (Blom's approximation, exact to ~1%); 0 for n ≤ 1."""
    if n <= 1:
        return 0.0
    z = _ZCACHE.get(n)
    if z is None:
        z = _ZCACHE[n] = NormalDist().inv_cdf((n - 0.375) / (n + 0.25))
    return z


class _ModelDerived:
    """Per-model numbers, computed once (the properties of ModelProfile recompute on every access)."""

    __slots__ = ("model", "L", "L_moe", "h", "E", "k", "wb", "kv_tok", "f_body", "f_lm", "w_body", "w_lm",
                 "f_pair", "w_exp", "fa_dec", "fa_pf", "mla", "n_kv_heads", "mtp_layers", "fa_dec_l", "fa_pf_l")

    def __init__(self, m: ModelProfile) -> None:
        self.model = m
        h, V = m.hidden_size, m.vocab_size
        self.L, self.L_moe, self.h = m.num_layers, m.num_moe_layers, h
        self.E, self.k, self.wb = m.n_routed_experts, m.top_k, m.weight_bytes
        self.kv_tok = m.kv_bytes_per_token
        body = m.non_expert_params - 2 * V * h  # attention, shared experts, dense FFNs (embeddings apart)
        self.f_body = 2.0 * body  # FLOPs per token
        self.f_lm = 2.0 * V * h  # FLOPs per token that gets logits
        self.w_body = body * m.weight_bytes
        self.w_lm = V * h * m.weight_bytes
        pe = m.expert_params
        self.f_pair = 2.0 * pe * self.L_moe  # FLOPs of one (token, expert) pair over all MoE layers
        self.w_exp = pe * m.expert_bytes * self.L_moe  # bytes of one expert slot over all MoE layers (their own width)
        H = m.num_heads
        self.mla = m.attention is AttentionKind.MLA
        if self.mla:
            # decode: absorbed MLA — scores over (latent + rope), values over the latent, per head
            self.fa_dec = 2.0 * H * (2 * m.kv_lora_rank + m.qk_rope_head_dim) * self.L
            # prefill: up-projected K (nope + rope) and V per head
            self.fa_pf = 2.0 * H * (m.head_dim + m.v_head_dim) * self.L
        else:  # GQA: scores and values over each head; DeepSeek-V4: the same over its one shared K=V head
            self.fa_dec = self.fa_pf = 4.0 * H * m.head_dim * self.L
        # per layer and attended entry: what the layer kinds other than full attention are costed by
        self.fa_dec_l, self.fa_pf_l = self.fa_dec / self.L, self.fa_pf / self.L
        self.n_kv_heads = m.num_kv_heads
        self.mtp_layers = m.mtp_layers


class _WorkloadDerived:
    """Per-workload length statistics (uniform lengths with a range ratio, as vllm bench draws them)."""

    __slots__ = ("wl", "isl", "osl", "r_i", "r_o", "reuse", "isl_new", "ctx_pf", "ctx_dec", "cv_isl",
                 "cv_ctx_dec", "osl2_ratio")

    def __init__(self, w: Workload) -> None:
        self.wl = w
        isl, r_i = float(w.isl.mean), w.isl.range_ratio
        osl, r_o = float(w.osl.mean), w.osl.range_ratio
        cached = w.prefix_reuse * isl
        if w.dataset is Dataset.AGENTIC and w.turns > 1:
            # turn t re-sends the t-1 previous turns (cached) plus a new prompt; average over turns
            prior = (w.turns - 1) / 2.0 * (isl + osl)
            cached += prior
            isl += prior
        self.isl, self.osl, self.r_i, self.r_o = isl, osl, r_i, r_o
        self.reuse = min(cached / isl, 0.999) if isl > 0 else 0.0
        self.isl_new = max(isl * (1.0 - self.reuse), 1.0)
        s2 = isl * (1.0 + r_i * r_i / 3.0)  # E[S^2]/E[S]: long prompts carry more new tokens
        self.ctx_pf = s2 * (1.0 + self.reuse) / 2.0  # mean context position of a new prefill token
        self.osl2_ratio = 1.0 + r_o * r_o / 3.0
        self.ctx_dec = isl + osl * self.osl2_ratio / 2.0  # mean context of a decode step (long outputs weigh more)
        self.cv_isl = r_i / math.sqrt(3.0)
        var_ctx = (isl * r_i) ** 2 / 3.0 + osl * osl * self.osl2_ratio / 12.0
        self.cv_ctx_dec = math.sqrt(var_ctx) / self.ctx_dec


_Out = TypeVar("_Out")
_MODEL_CACHE: dict[tuple[int, ...], tuple[tuple[Any, ...], _ModelDerived]] = {}
_WL_CACHE: dict[tuple[int, ...], tuple[tuple[Any, ...], _WorkloadDerived]] = {}


def memo(cache: dict[tuple[int, ...], tuple[tuple[Any, ...], _Out]], make: Callable[..., _Out], *inputs: Any,
         limit: int = 256) -> _Out:
    """``make(*inputs)`` computed once per combination of (immutable) input objects, keyed by their ids: an
    entry holds its inputs, so while it lives no other object can have their ids — a key found is the same
    objects (checking each by identity was a tenth of a ranking's time). The cache is emptied when it passes
    ``limit`` entries."""
    key = tuple(map(id, inputs))
    hit = cache.get(key)
    if hit is not None:
        return hit[1]
    if len(cache) > limit:
        cache.clear()
    out = make(*inputs)
    cache[key] = (inputs, out)
    return out


def _md(m: ModelProfile) -> _ModelDerived:
    return memo(_MODEL_CACHE, _ModelDerived, m)


def _wd(w: Workload) -> _WorkloadDerived:
    return memo(_WL_CACHE, _WorkloadDerived, w)


def same_lengths(copy: Workload, original: Workload) -> None:
    """Let ``copy`` — ``original`` with other load levels or knee-search bounds, which no derived number reads —
    share its derived numbers, so that whatever is cached by them (a deployment's role constants) is shared
    too: the guide's ranking predicts a candidate's fixed levels with one and its knee search with the other."""
    if len(_WL_CACHE) > 256:
        _WL_CACHE.clear()
    _WL_CACHE[(id(copy),)] = ((copy,), _wd(original))


#: The low-latency all-to-all backends: one message per (token, expert) pair, FP8 dispatch, chunked calls.
_LL = {All2AllBackend.DEEPEP_LOW_LATENCY, All2AllBackend.NIXL_EP}


class _Role:
    """One role's constants for the step model (per role × model × cluster × workload × params)."""

    __slots__ = ("cfg", "p", "md", "wd", "tp", "dp", "ep", "e", "group", "rate_lin", "rate_attn", "bw",
                 "f_body", "f_lm", "w_dense_t", "fa_dec", "fa_pf", "kv_bytes_per_token_per_gpu", "slots_local",
                 "w_slot_t", "log_miss", "cv_static2", "expert_gpus_max_z", "dp_ranks_max_z", "pair_flops_per_gpu",
                 "copies", "bytes_copy", "c_byte", "a2a_lat", "ll_chunked", "agrs", "ar_t0", "ar_byte", "dbo",
                 "graphable", "eager", "layer_floor", "dp_sync", "eplb_amort", "tokens_per_decode_seq", "acc",
                 "mtp_factor", "kv_cap", "ctx_pf", "ctx_dec", "k", "own_div", "exp_eff", "tp_experts", "rate_exp",
                 "kr_dec", "kr_pf")

    def __init__(self, role: RoleConfig, md: _ModelDerived, wd: _WorkloadDerived, cluster: ClusterSpec,
                 p: PerfParams, mtp: int) -> None:
        spec = cluster.spec
        self.cfg, self.p, self.md, self.wd = role, p, md, wd
        tp, dp = role.tensor_parallel_size, role.data_parallel_size
        self.tp, self.dp, self.ep = tp, dp, role.enable_expert_parallel
        group = tp * dp
        self.group = group
        self.e = group if self.ep else 1
        # TP experts: without EP vLLM flattens the MoE layer's TP size to tp × dp (FusedMoEParallelConfig.make)
        self.tp_experts = not self.ep and group > 1
        m = md.model
        # matmul peaks per layer kind: the body's format (attention projections, shared experts, dense layers) and
        # the routed experts' own (FP4 experts beside FP8 attention, MXFP4 weight-only on Hopper)
        self.rate_lin = format_tflops(spec, m.body_format.value) * 1e12
        self.rate_exp = format_tflops(spec, m.experts_format.value) * 1e12
        self.rate_attn = (spec.fp8_tflops if md.model.kv_bytes <= 1.0 else spec.bf16_tflops) * 1e12
        self.bw = spec.hbm_tbps * 1e12 * p.hbm_eff
        self.f_body = md.f_body / tp
        self.f_lm = md.f_lm / tp
        self.w_dense_t = (md.w_body + md.w_lm) / tp / self.bw
        self.fa_dec = md.fa_dec / tp
        self.fa_pf = md.fa_pf / tp
        self.kr_dec = self.kr_pf = 1.0
        if not m.uniform_attention:
            self._layer_kinds(md, wd, spec.fp8_tflops * 1e12)
        # bytes of KV cache one token of context holds on one GPU (all layers): what attention reads per entry
        if md.mla:  # the latent is replicated on every TP rank
            self.kv_bytes_per_token_per_gpu = md.kv_tok
        else:
            self.kv_bytes_per_token_per_gpu = md.kv_tok * max(1, md.n_kv_heads // tp) / md.n_kv_heads
        self.k = md.k
        E = md.E
        # experts: EP holds whole experts (plus replicas); otherwise every GPU holds a slice of each
        if self.ep:
            slots = E + (role.eplb.num_redundant_experts if role.eplb.enabled else 0)
            self.slots_local = slots / group
            self.w_slot_t = md.w_exp / self.bw
            self.log_miss = math.log1p(-min(md.k / slots, 0.999999))
            if role.eplb.enabled:
                resid = p.eplb_residual / (1.0 + p.eplb_redundancy_gain * role.eplb.num_redundant_experts / E)
            else:
                resid = 1.0
            self.cv_static2 = (p.expert_skew_cv * resid) ** 2 / max(self.slots_local, 1e-9)
            self.expert_gpus_max_z = expected_max_z(group)
        else:  # TP experts (or one GPU): every GPU reads 1/group of each touched expert, load is even
            self.slots_local = float(E)
            self.w_slot_t = md.w_exp / group / self.bw
            self.log_miss = math.log1p(-min(md.k / E, 0.999999))
            self.cv_static2 = 0.0
            self.expert_gpus_max_z = 0.0
        # narrower expert GEMMs when each expert is sliced: tile quantisation below expert_shard_min_width
        width = md.model.moe_intermediate_size / group
        self.exp_eff = min(1.0, width / p.expert_shard_min_width) if self.tp_experts else 1.0
        # FLOPs of one routed (token, expert) pair over all MoE layers, per GPU of the group when spread evenly
        self.pair_flops_per_gpu = md.f_pair / group
        # expected maximum of `dp` standard normals (dimensionless): the slowest DP rank's load is 1 + this × CV
        self.dp_ranks_max_z = expected_max_z(dp)
        # all-to-all (EP over more than one GPU)
        backend = role.all2all_backend
        self.agrs = backend is All2AllBackend.ALLGATHER_REDUCESCATTER
        e = self.e
        self.own_div = float(tp)  # EP all-gather: a rank's own share of the gathered tokens (sequence-parallel TP)
        if self.ep and e > 1 and dp > 1:  # TP × EP with one DP rank (TEP) has no all-to-all: see below
            k = md.k
            if backend in _LL:
                self.copies = k * (e - 1) / e  # one message per (token, expert) leaving the GPU
                self.bytes_copy = md.h * (1.03 + 2.0)  # FP8 dispatch (+ scales), BF16 combine
                self.a2a_lat = p.a2a_latency_s
                self.ll_chunked = True
            elif self.agrs:
                self.copies = 0.0  # volume follows the group's tokens (every GPU gets every token)
                self.bytes_copy = md.h * (2.0 + 2.0)
                self.a2a_lat = p.a2a_ht_latency_s
                self.ll_chunked = False
            else:  # DeepEP high-throughput / FlashInfer: one message per destination GPU
                self.copies = (e - 1) * (1.0 - (1.0 - 1.0 / e) ** k)
                self.bytes_copy = md.h * (1.03 + 2.0)
                self.a2a_lat = p.a2a_ht_latency_s
                self.ll_chunked = False
            local = max(spec.scaleup_domain, cluster.gpus_per_node)
            f_intra = 1.0 if role.gpus_per_instance <= local else (local - 1) / (e - 1)
            up = spec.scaleup_gbps * 1e9 * p.a2a_scaleup_eff
            out = spec.scaleout_gbps * 1e9 * p.a2a_scaleout_eff
            self.c_byte = max(f_intra / up, (1.0 - f_intra) / out)
        elif self.tp_experts and dp > 1:
            # DP attention with TP experts: vLLM falls back to all-gather + reduce-scatter over the DP group
            # whatever --all2all-backend says ("Detected DP deployment with no --enable-expert-parallel. Falling
            # back to AllGather+ReduceScatter dispatch/combine", fused_moe/all2all_utils.py): every rank receives
            # the hidden states of every other DP rank's tokens (BF16) and reduce-scatters the partial outputs
            self.agrs = True
            self.copies = 0.0
            self.bytes_copy = md.h * (2.0 + 2.0)
            self.a2a_lat = p.a2a_ht_latency_s
            self.ll_chunked = False
            self.own_div = 1.0  # each TP rank of a DP rank holds all of its rank's tokens
            local = max(spec.scaleup_domain, cluster.gpus_per_node)
            # peers of the DP group (same TP rank, other DP ranks) inside the NVLink domain
            per_domain = max(local // tp, 1)
            f_intra = 1.0 if role.gpus_per_instance <= local else (per_domain - 1) / (dp - 1)
            up = spec.scaleup_gbps * 1e9 * p.a2a_scaleup_eff
            out = spec.scaleout_gbps * 1e9 * p.a2a_scaleout_eff
            self.c_byte = max(f_intra / up, (1.0 - f_intra) / out)
        else:
            # One GPU, plain TP, or TP × EP with one DP rank: vLLM uses its all-to-all kernels only with DP > 1
            # (FusedMoEParallelConfig.use_all2all_kernels = dp_size > 1 and use_ep). With TEP every TP rank holds
            # the step's tokens already, runs them through its own experts, and the layer's TP all-reduce sums
            # the partial outputs: whole experts and their imbalance, no dispatch or combine.
            self.copies = self.bytes_copy = self.c_byte = self.a2a_lat = 0.0
            self.ll_chunked = False
        # tensor-parallel all-reduce: twice per layer, BF16 activations, NVLink (TP stays in a node)
        if tp > 1:
            self.ar_t0 = 2 * md.L * p.allreduce_latency_s
            self.ar_byte = 2 * md.L * md.h * 2.0 * 2.0 * (tp - 1) / tp / (spec.scaleup_gbps * 1e9 * p.a2a_scaleup_eff)
        else:
            self.ar_t0 = self.ar_byte = 0.0
        self.dbo = role.enable_dbo and self.ep and backend.supports_dbo
        self.graphable = spec.graphs and not (self.ep and backend is All2AllBackend.DEEPEP_HIGH_THROUGHPUT)
        self.eager = p.eager_layer_latency_s * md.L
        self.layer_floor = p.layer_latency_s * md.L
        self.dp_sync = p.cpu_dp_sync_s * math.log2(dp) if dp > 1 else 0.0
        if self.ep and role.eplb.enabled and e > 1:
            # a rearrangement rewrites about half of the local expert slots over NVLink/network
            move = 0.5 * self.slots_local * md.w_exp * max(self.c_byte, 1.0 / (spec.scaleup_gbps * 1e9))
            self.eplb_amort = move / role.eplb.step_interval
        else:
            self.eplb_amort = 0.0
        n = mtp if md.mtp_layers else 0
        self.tokens_per_decode_seq = 1.0 + n  # tokens one decode sequence puts in a step: itself + MTP drafts
        a = p.mtp_acceptance
        self.acc = 1.0 + sum(a ** i for i in range(1, n + 1))
        self.mtp_factor = 1.0 + n / md.L  # the MTP module is about one more layer per draft token
        self.kv_cap = kv_capacity_tokens(role, md.model, cluster)
        self.ctx_pf, self.ctx_dec = wd.ctx_pf, wd.ctx_dec

    def _layer_kinds(self, md: _ModelDerived, wd: _WorkloadDerived, rate_fp8: float) -> None:
        """Attention of a model whose layers are not all full attention, folded into the full-attention form the
        step model reads (``F_att·ctx`` per query token, ``ctx·kv`` bytes per sequence) at the workload's contexts:
        the attended entries per layer kind (sliding windows cap the context at the window, DSA at ``index_topk``,
        V4 at its window plus the compressed entries), the lightning indexers' FP8 scores over every cached
        (compressed) entry — converted to this role's attention rate — and the linear layers' per-token state
        update; cache reads the same way, with the indexers' keys and the linear layers' states."""
        m = md.model
        to_attn = self.rate_attn / rate_fp8
        lin = m.linear_flops_per_token()
        for ctx, pf in ((max(wd.ctx_dec, 1.0), False), (max(wd.ctx_pf, 1.0), True)):
            entries = m.attended(ctx)
            sparse = m.num_sparse_layers * min(ctx, m.index_topk)  # sparse MLA runs absorbed, prefill too
            if pf:
                f = md.fa_pf_l * (entries - sparse) + md.fa_dec_l * sparse
            else:
                f = md.fa_dec_l * entries
            f += m.indexer_flops(ctx) * to_attn + lin
            kr = m.kv_read_bytes(ctx) / (ctx * md.kv_tok)
            if pf:
                self.fa_pf = f / ctx / self.tp
                self.kr_pf = kr
            else:
                self.fa_dec = f / ctx / self.tp
                self.kr_dec = kr
