"""Model folders vLLM can serve with dummy weights: the job's model at its real widths, at any depth.

A hardware profile (``advisor.profile``) measures the job's model *shape* — hidden size, attention kinds (MLA,
GQA, DSA, DeepSeek-V4's compressed layers, sliding windows, linear attention), heads, experts, top-k, dtype and
quantization — at a reduced depth, so that a 671B-parameter model's layers
can be timed on one GPU: every layer costs what it costs in the full model, and two depths separate the per-layer
part of a step from the fixed part. Nothing is downloaded: a folder is a ``config.json`` and a tokenizer.

The tokenizer is the job's own when its folder has one for the same vocabulary; otherwise a word-level tokenizer
of exactly ``vocab_size`` tokens is generated. Its size matters: ``vllm bench serve``'s random prompts are runs of
consecutive token ids from a random offset, so with a small vocabulary two prompts often start at the same id and
share their first KV blocks — 2.9–9.4% prefix-cache hits on a "no reuse" workload with an 8,192-token vocabulary.
With the model's real vocabulary (129,280 for DeepSeek-V3) such collisions are rare. A word-level
tokenizer also decodes and re-encodes a random prompt to exactly the same ids (each token is one
whitespace-separated word), so the prompt length asked is the length served.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from search_spaces import AttentionKind, ModelProfile
from search_spaces.model_profile import WeightFormat

#: Bump when anything below changes what a folder holds (part of each folder's stamp).
RECIPE_VERSION = 1
STAMP = ".model-folder.json"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


# ------------------------------------------------------------------------------------------------ configs
def hf_config(model: ModelProfile) -> dict[str, Any]:
    """An HF ``config.json`` vLLM reads as ``model``, in its family's spelling (``model.architecture``; a profile
    naming none: DeepSeek-V3 spelling for MLA, Qwen3-MoE for GQA). Reading it back
    (``ModelProfile.from_hf_dict``) gives the same shape.

    For presets, which have no folder. Only the widths ``ModelProfile`` knows are set; the rest takes the
    architecture's usual values (sigmoid routing with groups for DeepSeek-V3, normalised top-k for Qwen3)."""
    common: dict[str, Any] = {
        "vocab_size": model.vocab_size, "hidden_size": model.hidden_size, "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads, "num_key_value_heads": model.num_kv_heads,
        "num_experts_per_tok": model.top_k, "moe_intermediate_size": model.moe_intermediate_size,
        "intermediate_size": model.dense_intermediate_size or 4 * model.hidden_size, "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": 0,
        "torch_dtype": "bfloat16", "initializer_range": 0.02, "norm_topk_prob": True,
    }
    arch = model.architecture
    if model.attention is AttentionKind.CSA:
        cfg = _deepseek_v4(model, common)
    elif model.attention is AttentionKind.MLA:
        cfg = _deepseek(model, common, arch or "DeepseekV3ForCausalLM")
    elif arch == "Glm4MoeForCausalLM":
        cfg = {"architectures": [arch], "model_type": "glm4_moe", **common, "head_dim": model.head_dim,
               "n_routed_experts": model.n_routed_experts, "n_shared_experts": model.n_shared_experts,
               "first_k_dense_replace": model.num_dense_layers, "num_nextn_predict_layers": model.mtp_layers,
               "partial_rotary_factor": 0.5, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
               "use_qk_norm": False, "rope_theta": 1000000.0}
    elif arch == "MiniMaxM2ForCausalLM":
        cfg = {"architectures": [arch], "model_type": "minimax_m2", **common, "head_dim": model.head_dim,
               "num_local_experts": model.n_routed_experts, "intermediate_size": model.moe_intermediate_size,
               "rotary_dim": 64, "partial_rotary_factor": 0.5, "use_qk_norm": True, "qk_norm_type": "per_layer",
               "scoring_func": "sigmoid", "use_routing_bias": True, "rope_theta": 5000000.0}
        cfg.pop("moe_intermediate_size")
    elif arch == "GptOssForCausalLM":
        layers = ["sliding_attention" if i % 2 == 0 and i // 2 < model.num_sliding_layers else "full_attention"
                  for i in range(model.num_layers)]
        cfg = {"architectures": [arch], "model_type": "gpt_oss", **common, "head_dim": model.head_dim,
               "num_local_experts": model.n_routed_experts, "intermediate_size": model.moe_intermediate_size,
               "sliding_window": model.sliding_window, "layer_types": layers, "swiglu_limit": 7.0,
               "rope_theta": 150000.0, "experts_per_token": model.top_k}
        cfg.pop("moe_intermediate_size")
    elif model.num_linear_layers:
        cfg = _qwen3_next(model, common, arch or "Qwen3NextForCausalLM")
    else:
        cfg = {
            "architectures": [arch or "Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common,
            "head_dim": model.head_dim, "num_experts": model.n_routed_experts, "decoder_sparse_step": 1,
            "mlp_only_layers": list(range(model.num_dense_layers)), "rope_theta": 1000000.0,
            "use_sliding_window": False, "sliding_window": None,
        }
    quant = _quantization(model)
    if quant:
        cfg["quantization_config"] = quant
    if arch.endswith("ForConditionalGeneration"):  # a multimodal wrapper: the language model is its text_config
        cfg = {"architectures": [arch], "model_type": cfg.get("model_type", ""), "text_config": cfg,
               **({"quantization_config": quant} if quant else {})}
    return cfg


def _deepseek(model: ModelProfile, common: dict[str, Any], arch: str) -> dict[str, Any]:
    groups = 8 if model.n_routed_experts % 8 == 0 else 1
    cfg = {
        "architectures": [arch], "model_type": _MODEL_TYPE.get(arch, "deepseek_v3"), **common,
        "first_k_dense_replace": model.num_dense_layers, "n_shared_experts": model.n_shared_experts,
        "n_routed_experts": model.n_routed_experts, "n_group": groups, "topk_group": min(4, groups),
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "routed_scaling_factor": 2.5, "moe_layer_freq": 1,
        "kv_lora_rank": model.kv_lora_rank, "q_lora_rank": model.q_lora_rank or None,
        "qk_rope_head_dim": model.qk_rope_head_dim, "qk_nope_head_dim": model.head_dim - model.qk_rope_head_dim,
        "v_head_dim": model.v_head_dim, "rope_theta": 10000, "num_nextn_predict_layers": model.mtp_layers,
    }
    if model.num_sparse_layers:
        cfg.update(index_topk=model.index_topk, index_n_heads=model.index_n_heads, index_head_dim=model.index_head_dim)
    return cfg


def _deepseek_v4(model: ModelProfile, common: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V4 spelling; ``compress_ratios`` lays the window-only layers at both ends and alternates the
    compressed kinds between them, the more numerous first (as the released schedules do)."""
    csa, hca, win = model.num_csa_layers, model.num_hca_layers, model.num_sliding_layers
    first, second = (128, 4) if hca >= csa else (4, 128)
    counts = {128: hca, 4: csa}
    middle: list[int] = []
    while counts[first] or counts[second]:
        for r in (first, second):
            if counts[r]:
                middle.append(r)
                counts[r] -= 1
    ratios = [0] * ((win + 1) // 2) + middle + [0] * (win // 2)
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", **common,
        "head_dim": model.head_dim, "qk_rope_head_dim": model.qk_rope_head_dim, "q_lora_rank": model.q_lora_rank,
        "n_routed_experts": model.n_routed_experts, "n_shared_experts": model.n_shared_experts,
        "num_nextn_predict_layers": model.mtp_layers, "sliding_window": model.sliding_window,
        "compress_ratios": ratios, "index_topk": model.index_topk, "index_n_heads": model.index_n_heads,
        "index_head_dim": model.index_head_dim, "o_lora_rank": model.o_lora_rank, "o_groups": model.o_groups,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "num_hash_layers": 3, "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "routed_scaling_factor": 1.5, "rope_theta": 10000.0,
    }
    cfg.pop("intermediate_size")
    return cfg


def _qwen3_next(model: ModelProfile, common: dict[str, Any], arch: str) -> dict[str, Any]:
    full = model.num_layers - model.num_linear_layers
    every = max(1, round(model.num_layers / full)) if full else model.num_layers + 1
    layers = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(model.num_layers)]
    shared = model.moe_intermediate_size * model.n_shared_experts
    return {
        "architectures": [arch], "model_type": "qwen3_5_moe_text" if "3_5" in arch else "qwen3_next", **common,
        "head_dim": model.head_dim, "num_experts": model.n_routed_experts, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "shared_expert_intermediate_size": shared, "full_attention_interval": every,
        "layer_types": layers, "linear_num_key_heads": model.linear_num_key_heads,
        "linear_num_value_heads": model.linear_num_value_heads, "linear_key_head_dim": model.linear_key_head_dim,
        "linear_value_head_dim": model.linear_value_head_dim, "linear_conv_kernel_dim": model.linear_conv_kernel,
        "attn_output_gate": model.attn_output_gate, "partial_rotary_factor": 0.25, "rope_theta": 10000000.0,
        "num_nextn_predict_layers": model.mtp_layers,
    }


def _quantization(model: ModelProfile) -> dict[str, Any] | None:
    """The checkpoint's ``quantization_config``: FP8 blocks as DeepSeek-V3 ships, gpt-oss's MXFP4 experts beside
    BF16, DeepSeek-V4's FP4 experts beside FP8 (``expert_dtype``), ModelOpt NVFP4 experts."""
    body, experts = model.body_format, model.experts_format
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if model.attention is AttentionKind.CSA:
        return {**fp8, "scale_fmt": "ue8m0"} if body is WeightFormat.FP8 else None
    if experts is WeightFormat.MXFP4:
        return {"quant_method": "mxfp4"}
    if experts is WeightFormat.NVFP4:
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                "exclude_modules": ["lm_head"]}
    return fp8 if body is WeightFormat.FP8 else None


_MODEL_TYPE = {"DeepseekV32ForCausalLM": "deepseek_v32", "GlmMoeDsaForCausalLM": "glm_moe_dsa",
               "DeepseekV2ForCausalLM": "deepseek_v2", "KimiK25ForConditionalGeneration": "kimi_k25"}


def at_depth(cfg: dict[str, Any], layers: int) -> dict[str, Any]:
    """``cfg`` with ``layers`` decoder layers and every width unchanged.

    Leading dense layers are kept up to one (so a DeepSeek-V3 stack of 4 is 1 dense + 3 MoE layers, as its
    first layers are); multi-token-prediction layers are dropped (a profile times the main stack). Per-layer
    lists keep their pattern: ``layer_types`` (gpt-oss's sliding/full alternation, Qwen3-Next's three linear
    layers to one full) and DeepSeek-V4's ``compress_ratios`` are cut to the first ``layers`` entries, with at
    least one full-attention layer kept in a hybrid (its last layer), so a reduced stack still holds every kind
    the first layers do. A multimodal wrapper's ``text_config`` is cut the same way."""
    if layers < 1:
        raise ValueError(f"a model needs at least one layer (got {layers})")
    if isinstance(cfg.get("text_config"), dict):
        return {**cfg, "text_config": at_depth(cfg["text_config"], layers)}
    out = dict(cfg)
    out["num_hidden_layers"] = layers
    if "first_k_dense_replace" in out:
        dense = min(int(out.get("first_k_dense_replace") or 0), 1)
        out["first_k_dense_replace"] = dense if layers > dense else 0
    if out.get("mlp_only_layers"):
        out["mlp_only_layers"] = [i for i in out["mlp_only_layers"] if i < min(layers - 1, 1)]
    if "num_nextn_predict_layers" in out:
        out["num_nextn_predict_layers"] = 0
    types = out.get("layer_types")
    if isinstance(types, list) and types:
        cut = list(types[:layers]) + [types[-1]] * max(0, layers - len(types))
        if "linear_attention" in cut and "full_attention" not in cut:
            cut[-1] = "full_attention"
        out["layer_types"] = cut
    ratios = out.get("compress_ratios")
    if isinstance(ratios, list) and ratios:
        out["compress_ratios"] = list(ratios[:layers]) + [ratios[-1]] * max(0, layers - len(ratios))
    return out


# ------------------------------------------------------------------------------------------------ tokenizer
def word_tokenizer(vocab_size: int) -> str:
    """tokenizer.json of a word-level tokenizer with exactly ``vocab_size`` tokens: the special tokens, then
    ``w3`` … ``w{V-1}``, split on whitespace (so decode → encode gives back the same ids)."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} leaves no room for ordinary tokens")
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(SPECIAL_TOKENS)],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": SPECIAL_TOKENS[0]},
    }
    return json.dumps(doc, separators=(",", ":"))


def _tokenizer_files(vocab_size: int, eos_id: int) -> dict[str, str]:
    eos = SPECIAL_TOKENS[eos_id] if 0 <= eos_id < len(SPECIAL_TOKENS) else SPECIAL_TOKENS[0]
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20, "bos_token": None,
               "eos_token": eos, "pad_token": SPECIAL_TOKENS[0], "unk_token": SPECIAL_TOKENS[0],
               "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": word_tokenizer(vocab_size), "tokenizer_config.json": json.dumps(tok_cfg, indent=2),
            "generation_config.json": json.dumps({"eos_token_id": eos_id, "do_sample": False}, indent=2)}


def _own_tokenizer(folder: Path | None, vocab_size: int) -> Path | None:
    """``folder`` when its tokenizer.json covers ``vocab_size`` tokens (the job's own tokenizer is kept)."""
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    try:
        doc = json.loads((folder / "tokenizer.json").read_text())
        n = len(doc["model"]["vocab"]) + sum(1 for t in doc.get("added_tokens", [])
                                             if t["content"] not in doc["model"]["vocab"])
    except (ValueError, KeyError, TypeError):
        return None
    return folder if n == vocab_size else None


# ------------------------------------------------------------------------------------------------ folders
def write_model_folder(cfg: dict[str, Any], out: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
    """Write (or confirm) a servable folder at ``out``: ``cfg`` as config.json and a tokenizer — copied from
    ``tokenizer_from`` when it has one of ``cfg``'s vocabulary size, else generated. Idempotent: a folder whose
    stamp matches is left as it is (vLLM's compile cache is keyed on the files)."""
    out = Path(out)
    vocab = int(cfg["vocab_size"])
    src = _own_tokenizer(Path(tokenizer_from) if tokenizer_from else None, vocab)
    config_text = json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    want = {"recipe": RECIPE_VERSION, "config": _sha(config_text),
            "tokenizer": f"copied:{_sha((src / 'tokenizer.json').read_text())}" if src else f"words:{vocab}"}
    stamp = out / STAMP
    if stamp.is_file() and (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        try:
            if json.loads(stamp.read_text()) == want:
                return out
        except ValueError:
            pass
    out.mkdir(parents=True, exist_ok=True)
    if src is not None:
        for name in _TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, out / name)
    else:
        for name, text in _tokenizer_files(vocab, int(cfg.get("eos_token_id") or 0)).items():
            (out / name).write_text(text)
    (out / "config.json").write_text(config_text)
    stamp.write_text(json.dumps(want, indent=2) + "\n")
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
