"""The model families the tuner describes, by their vLLM architecture name (config.json ``architectures[0]``).

Each family has a reader (HF ``config.json`` keys → ``ModelProfile`` fields), the keys it cannot do without, the
vLLM attention backends its attention layers run on (``attention_backend``), and whether vLLM's CPU build serves it
(what ``advisor profile`` and the CPU tests need). An architecture outside this table is refused with one line
naming the ones allowed: a model read with the wrong family's spelling would be costed silently wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search_spaces.layer_kinds import AttentionKind, WeightFormat

if TYPE_CHECKING:
    from search_spaces.hardware import GPUSpec
    from search_spaces.model_profile import ModelProfile

#: A reader's output: ``ModelProfile`` keyword arguments (without ``name`` and ``architecture``).
Fields = dict[str, Any]


@dataclass(frozen=True)
class Family:
    """One model family: how its config.json is read and what serves it."""

    label: str
    architectures: tuple[str, ...]
    needs: tuple[str, ...]
    read: Callable[[dict[str, Any]], Fields]
    #: vLLM's attention backends for its layer kinds on Hopper and on Blackwell (``attention_backend``; what a
    #: report names: the model's attention term is the kind's FLOPs and bytes, not a per-backend efficiency).
    hopper: str
    blackwell: str
    #: Whether vLLM's CPU build serves it (dummy weights): CPU-served families can be profiled on the CPU build.
    cpu_servable: bool


# ------------------------------------------------------------------------------------------------ precision
_QUANT_ALLOWED = "none, fp8, mxfp4, modelopt (FP8 or NVFP4)"


def _precision(cfg: dict[str, Any], *, fp4_experts: bool = False) -> Fields:
    """Weight and KV precision per layer kind from ``quantization_config``: FP8 checkpoints (DeepSeek, Kimi, GLM,
    MiniMax, Qwen -FP8) hold every linear layer in FP8; gpt-oss's MXFP4 holds only the experts in FP4 (attention
    BF16, ``modules_to_not_convert``); ModelOpt NVFP4 checkpoints hold the experts in NVFP4 (the rest counted
    BF16: their exclude lists vary). ``fp4_experts``: the family stores FP4 experts beside FP8 (DeepSeek-V4)."""

    qc = cfg.get("quantization_config") or {}
    if not isinstance(qc, dict):
        raise TypeError(f"quantization_config must be an object (got {type(qc).__name__})")
    method = qc.get("quant_method")
    kv = 1.0 if str(qc.get("kv_cache_quant_algo") or "").upper() == "FP8" else 2.0
    if method is None:
        return {"weight_bytes": 2.0, "kv_bytes": kv}
    if method == "fp8":
        out: Fields = {"weight_bytes": 1.0, "kv_bytes": kv}
        if fp4_experts and str(cfg.get("expert_dtype", "fp4")).lower() == "fp4":
            out.update(expert_weight_bytes=0.5, expert_format=WeightFormat.MXFP4)
        return out
    if method == "mxfp4":
        return {"weight_bytes": 2.0, "expert_weight_bytes": 0.5, "expert_format": WeightFormat.MXFP4, "kv_bytes": kv}
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or "").upper()
        if algo == "NVFP4":
            return {"weight_bytes": 2.0, "expert_weight_bytes": 0.5, "expert_format": WeightFormat.NVFP4,
                    "kv_bytes": kv}
        if algo == "FP8":
            return {"weight_bytes": 1.0, "kv_bytes": kv}
        raise ValueError(f"quantization_config.quant_algo {qc.get('quant_algo')!r} of a modelopt checkpoint is not "
                         f"described; allowed: FP8, NVFP4 (or give model.weight_bytes in the job)")
    raise ValueError(f"quantization_config.quant_method {method!r} is not described; allowed: {_QUANT_ALLOWED} "
                     f"(or give model.weight_bytes / model.expert_weight_bytes in the job)")


def _shared(cfg: dict[str, Any], moe: int) -> int:
    """Shared experts: DeepSeek-style ``n_shared_experts``, or Qwen's one shared expert of its own width
    (counted in routed-expert widths, at least one)."""
    if cfg.get("n_shared_experts") is not None:
        return int(cfg["n_shared_experts"] or 0)
    width = cfg.get("shared_expert_intermediate_size") or 0
    return max(1, round(width / moe)) if width else 0


# ------------------------------------------------------------------------------------------------ readers
def _read_mla(cfg: dict[str, Any]) -> Fields:
    """DeepSeek-V2/V3/R1, Kimi-K2 (DeepseekV3ForCausalLM spelling); V3.2 and GLM-5 add the DSA indexer."""

    nope, rope = cfg.get("qk_nope_head_dim", 128), cfg.get("qk_rope_head_dim", 64)
    layers = cfg["num_hidden_layers"]
    out: Fields = {
        "num_layers": layers, "num_dense_layers": cfg.get("first_k_dense_replace", 0) or 0,
        "hidden_size": cfg["hidden_size"], "vocab_size": cfg["vocab_size"], "attention": AttentionKind.MLA,
        "num_heads": cfg["num_attention_heads"],
        "num_kv_heads": cfg.get("num_key_value_heads", cfg["num_attention_heads"]), "head_dim": nope + rope,
        "kv_lora_rank": cfg["kv_lora_rank"], "q_lora_rank": cfg.get("q_lora_rank") or 0, "qk_rope_head_dim": rope,
        "v_head_dim": cfg.get("v_head_dim", 128), "n_routed_experts": cfg["n_routed_experts"],
        "n_shared_experts": cfg.get("n_shared_experts", 0) or 0, "top_k": cfg["num_experts_per_tok"],
        "moe_intermediate_size": cfg["moe_intermediate_size"],
        "dense_intermediate_size": cfg.get("intermediate_size", 0) or 0,
        "mtp_layers": cfg.get("num_nextn_predict_layers", 0) or 0, **_precision(cfg),
    }
    if cfg.get("index_topk"):
        out.update(num_sparse_layers=layers, index_topk=cfg["index_topk"], index_n_heads=cfg["index_n_heads"],
                   index_head_dim=cfg["index_head_dim"], kv_bytes=1.0)  # vLLM's sparse MLA caches FP8 latents
    return out


def _read_dsv4(cfg: dict[str, Any]) -> Fields:
    """DeepSeek-V4 (Pro, Flash): MQA over one shared K=V head of ``head_dim``, every layer with a sliding window;
    ``compress_ratios`` per layer: 0 window only, 4 CSA (indexer top-k over 4× compressed KV), 128 HCA (128×
    compressed KV read whole). Without ``compress_ratios`` the transformers default schedule is taken
    (0, then 128/4 alternating, then 0). Experts FP4 (MXFP4: e2m1 with UE8M0 scales), the rest FP8."""

    n = cfg["num_hidden_layers"]
    ratios = cfg.get("compress_ratios")
    if ratios is None:
        ratios = [0] + [4 if i % 2 else 128 for i in range(max(n - 2, 0))] + ([0] if n >= 2 else [])
    if not isinstance(ratios, list) or any(r not in (0, 4, 128) for r in ratios[:n]) or len(ratios) < n:
        raise ValueError(f"compress_ratios must list 0, 4 or 128 for each of the {n} layers")
    ratios = ratios[:n]
    return {
        "num_layers": n, "hidden_size": cfg["hidden_size"], "vocab_size": cfg["vocab_size"],
        "attention": AttentionKind.CSA, "num_heads": cfg["num_attention_heads"], "num_kv_heads": 1,
        "head_dim": cfg.get("head_dim", 512), "q_lora_rank": cfg.get("q_lora_rank") or 0,
        "qk_rope_head_dim": cfg.get("qk_rope_head_dim", 64), "n_routed_experts": cfg["n_routed_experts"],
        "n_shared_experts": cfg.get("n_shared_experts", 1) or 0, "top_k": cfg["num_experts_per_tok"],
        "moe_intermediate_size": cfg["moe_intermediate_size"],
        "mtp_layers": cfg.get("num_nextn_predict_layers", 0) or 0,
        "sliding_window": cfg.get("sliding_window", 128), "num_sliding_layers": ratios.count(0),
        "num_csa_layers": ratios.count(4), "num_hca_layers": ratios.count(128),
        "index_topk": cfg.get("index_topk", 512), "index_n_heads": cfg.get("index_n_heads", 64),
        "index_head_dim": cfg.get("index_head_dim", 128), "o_lora_rank": cfg.get("o_lora_rank", 1024),
        "o_groups": cfg.get("o_groups", 8), **_precision(cfg, fp4_experts=True), "kv_bytes": 1.0,
    }


def _read_gqa(cfg: dict[str, Any]) -> Fields:
    """Qwen2/3-MoE, Mixtral, GLM-4.5/4.6 (Glm4Moe: DeepSeek-style expert keys over GQA), MiniMax-M2
    (``intermediate_size`` is the expert width, no dense layers)."""

    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
    heads = cfg["num_attention_heads"]
    moe = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    dense = cfg.get("first_k_dense_replace")
    return {
        "num_layers": cfg["num_hidden_layers"],
        "num_dense_layers": dense if dense is not None else len(cfg.get("mlp_only_layers", []) or []),
        "hidden_size": cfg["hidden_size"], "vocab_size": cfg["vocab_size"], "attention": AttentionKind.GQA,
        "num_heads": heads, "num_kv_heads": cfg.get("num_key_value_heads", heads),
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads, "n_routed_experts": experts,
        "n_shared_experts": _shared(cfg, moe), "top_k": cfg["num_experts_per_tok"], "moe_intermediate_size": moe,
        "dense_intermediate_size": cfg.get("intermediate_size", 0) or 0,
        "mtp_layers": cfg.get("num_nextn_predict_layers", 0) or 0, **_precision(cfg),
    }


def _read_minimax(cfg: dict[str, Any]) -> Fields:
    out = _read_gqa(cfg)
    out.update(num_dense_layers=0, dense_intermediate_size=0, mtp_layers=0)  # vLLM serves no MiniMax MTP drafter
    return out


def _read_hybrid(cfg: dict[str, Any]) -> Fields:
    """Qwen3-Next / Qwen3.5-MoE: gated DeltaNet linear attention with gated full attention every
    ``full_attention_interval``-th layer (or as ``layer_types`` lists them)."""
    out = _read_gqa(cfg)
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list):
            raise TypeError("layer_types must be a list")
        linear = sum(1 for t in types[:n] if t == "linear_attention")
    else:
        every = int(cfg.get("full_attention_interval") or 4)
        linear = n - n // every
    out.update(
        num_linear_layers=linear, linear_num_key_heads=cfg["linear_num_key_heads"],
        linear_num_value_heads=cfg["linear_num_value_heads"], linear_key_head_dim=cfg["linear_key_head_dim"],
        linear_value_head_dim=cfg["linear_value_head_dim"], linear_conv_kernel=cfg.get("linear_conv_kernel_dim", 4),
        attn_output_gate=bool(cfg.get("attn_output_gate", True)),
        mtp_layers=cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0,
        dense_intermediate_size=0,
    )
    return out


def _read_gpt_oss(cfg: dict[str, Any]) -> Fields:
    """gpt-oss: GQA with attention sinks, sliding window (128) on alternate layers, MXFP4 experts, BF16 attention."""
    out = _read_gqa(cfg)
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        sliding = (n + 1) // 2  # even layers slide (transformers' GptOssConfig default)
    elif isinstance(types, list):
        sliding = sum(1 for t in types[:n] if t == "sliding_attention")
    else:
        raise TypeError("layer_types must be a list")
    out.update(num_dense_layers=0, dense_intermediate_size=0, sliding_window=cfg.get("sliding_window") or 128,
               num_sliding_layers=sliding, attention_sinks=True)
    return out


_COMMON = ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_experts_per_tok")
_MLA_NEEDS = (*_COMMON, "kv_lora_rank", "n_routed_experts", "moe_intermediate_size")

FAMILIES: tuple[Family, ...] = (
    Family("DeepSeek-V2/V3/R1, Kimi-K2 (MLA)", ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                                                 "KimiK25ForConditionalGeneration"),
           _MLA_NEEDS, _read_mla, "FLASHMLA", "CUTLASS_MLA (or FLASHINFER_MLA)", True),
    Family("DeepSeek-V3.2, GLM-5 (MLA + DSA)", ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"),
           (*_MLA_NEEDS, "index_topk", "index_n_heads", "index_head_dim"), _read_mla,
           "FLASHMLA_SPARSE (FP8 KV) + DeepGEMM FP8 MQA logits for the indexer",
           "FLASHMLA_SPARSE (FP8 KV) + DeepGEMM FP8 MQA logits for the indexer", False),
    Family("DeepSeek-V4 (CSA/HCA + sliding window)", ("DeepseekV4ForCausalLM",),
           (*_COMMON, "n_routed_experts", "moe_intermediate_size"), _read_dsv4,
           "FLASHMLA_SPARSE_DSV4 over the window and the compressed entries (FP8 KV); experts Marlin MXFP4",
           "FLASHMLA_SPARSE_DSV4 over the window and the compressed entries (FP8 KV)", False),
    Family("GLM-4.5/4.6 (GQA)", ("Glm4MoeForCausalLM",), (*_COMMON, "n_routed_experts", "moe_intermediate_size"),
           _read_gqa, "FLASH_ATTN (FlashAttention 3)", "FLASHINFER", True),
    Family("Qwen2/3-MoE, Mixtral (GQA)", ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"),
           _COMMON, _read_gqa, "FLASH_ATTN (FlashAttention 3)", "FLASHINFER", True),
    Family("Qwen3-Next, Qwen3.5-MoE (gated DeltaNet + gated GQA)",
           ("Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
           (*_COMMON, "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim"), _read_hybrid,
           "GDN_ATTN (FLA Triton kernels, mamba-style state cache) + FLASH_ATTN for the full layers",
           "GDN_ATTN (FLA Triton kernels, mamba-style state cache) + FLASHINFER for the full layers", False),
    Family("MiniMax-M2/M2.5 (GQA)", ("MiniMaxM2ForCausalLM",), (*_COMMON, "num_local_experts", "intermediate_size"),
           _read_minimax, "FLASH_ATTN (FlashAttention 3)", "FLASHINFER", True),
    Family("gpt-oss (GQA, sliding window with sinks)", ("GptOssForCausalLM",),
           (*_COMMON, "num_local_experts", "intermediate_size"), _read_gpt_oss,
           "FLASH_ATTN (FlashAttention 3 with sinks)", "FLASHINFER (TRT-LLM attention with sinks)", False),
)
_BY_ARCH = {a: f for f in FAMILIES for a in f.architectures}
ARCHITECTURES: tuple[str, ...] = tuple(_BY_ARCH)


#: Dense architectures whose config.json may still carry a MoE's expert keys, read as their MoE sibling: the
#: project's own stand-in for MoE with data parallelism on vLLM's CPU build (``executors.vllm.tiny_model``,
#: ``dense=True``: vLLM's dense Qwen3 serves it and ignores the expert keys; the model reads the MoE they describe). A
#: dense config without expert keys is still refused: its architecture is no family the tuner describes.
DENSE_STAND_INS: dict[str, str] = {"Qwen3ForCausalLM": "Qwen3MoeForCausalLM"}


def family_of(architecture: str, cfg: dict[str, Any] | None = None) -> Family:
    """The family of a vLLM architecture name (a dense stand-in's MoE sibling where ``cfg`` names routed experts,
    ``DENSE_STAND_INS``); a ``ValueError`` of one line naming those allowed."""
    sibling = DENSE_STAND_INS.get(architecture)
    if sibling is not None and cfg is not None and (cfg.get("num_experts") or cfg.get("num_local_experts")):
        architecture = sibling
    try:
        return _BY_ARCH[architecture]
    except KeyError:
        raise ValueError(f"architectures[0] {architecture!r} is not a model family the tuner describes; allowed: "
                         f"{', '.join(ARCHITECTURES)}") from None


def attention_backend(model: ModelProfile, spec: GPUSpec) -> str:
    """The vLLM attention backend ``model``'s layer kinds run on with ``spec`` (Hopper or Blackwell; vLLM's CPU
    build has its own, ``CPU_ATTN``): the family's by architecture, else by attention kind."""

    if spec.name == "CPU":
        return "CPU_ATTN"
    if model.architecture in _BY_ARCH:
        fam = _BY_ARCH[model.architecture]
    else:
        arch = {AttentionKind.MLA: "DeepseekV32ForCausalLM" if model.num_sparse_layers else "DeepseekV3ForCausalLM",
                AttentionKind.CSA: "DeepseekV4ForCausalLM"}.get(model.attention, "Qwen3MoeForCausalLM")
        fam = _BY_ARCH[arch]
    return fam.blackwell if spec.fp4_tflops else fam.hopper


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A multimodal wrapper's language model (Qwen3.5, Kimi-K2.5: ``text_config``) as one flat config, the
    wrapper's architecture and quantization kept."""
    inner = cfg.get("text_config")
    if not isinstance(inner, dict):
        return cfg
    out = {**inner}
    for key in ("architectures", "quantization_config"):
        if key in cfg and key not in out:
            out[key] = cfg[key]
    return out
