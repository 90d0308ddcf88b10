"""The kinds a model's layers come in: its attention kind and the formats its weights are stored in.

Apart from ``search_spaces.model_profile`` so that the family readers (``search_spaces.model_families``) and the
profile they fill both name them without importing each other."""

from __future__ import annotations

from enum import StrEnum


class AttentionKind(StrEnum):
    """The kind of the model's context-growing attention layers (what ``num_heads``/``head_dim`` describe)."""

    MLA = "MLA"  # multi-head latent attention (DeepSeek): caches one compressed latent per token
    GQA = "GQA"  # grouped-query attention: caches K and V for each KV head
    CSA = "CSA"  # DeepSeek-V4: one shared K=V head of head_dim, KV compressed 4× (CSA) or 128× (HCA) + a window


class WeightFormat(StrEnum):
    """How a group of weights is stored; what vLLM computes with follows (``search_spaces.hardware.matmul_tflops``)."""

    BF16 = "bf16"
    FP8 = "fp8"  # e4m3, per-tensor or 128 × 128 blocks
    NVFP4 = "nvfp4"  # e2m1 + FP8 scale per 16 values (NVIDIA ModelOpt): W4A4 on Blackwell FP4 tensor cores
    MXFP4 = "mxfp4"  # e2m1 + e8m0 scale per 32 values (OCP MX: gpt-oss, DeepSeek-V4 experts)

