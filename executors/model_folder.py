"""Model folders vLLM can serve with dummy weights: the job's model at its real widths, at any depth.

A hardware profile (``advisor.profile``) measures the job's model *shape* — hidden size, attention kind (MLA or
GQA), heads, experts, top-k, dtype and quantization — at a reduced depth, so that a 671B-parameter model's layers
can be timed on one GPU: every layer costs what it costs in the full model, and two depths separate the per-layer
part of a step from the fixed part. Nothing is downloaded: a folder is a ``config.json`` and a tokenizer.

The tokenizer is the job's own when its folder has one for the same vocabulary; otherwise a word-level tokenizer
of exactly ``vocab_size`` tokens is generated. Its size matters: ``vllm bench serve``'s random prompts are runs of
consecutive token ids from a random offset, so with a small vocabulary two prompts often start at the same id and
share their first KV blocks — 2.9–9.4% prefix-cache hits on a "no reuse" workload with an 8,192-token vocabulary
(issue 30). With the model's real vocabulary (129,280 for DeepSeek-V3) such collisions are rare. A word-level
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

#: Bump when anything below changes what a folder holds (part of each folder's stamp).
RECIPE_VERSION = 1
STAMP = ".model-folder.json"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


# ------------------------------------------------------------------------------------------------ configs
def hf_config(model: ModelProfile) -> dict[str, Any]:
    """An HF ``config.json`` vLLM reads as ``model``: DeepSeek-V3 spelling for MLA models, Qwen3-MoE for GQA.

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
    if model.attention is AttentionKind.MLA:
        groups = 8 if model.n_routed_experts % 8 == 0 else 1
        cfg = {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **common,
            "first_k_dense_replace": model.num_dense_layers, "n_shared_experts": model.n_shared_experts,
            "n_routed_experts": model.n_routed_experts, "n_group": groups, "topk_group": min(4, groups),
            "topk_method": "noaux_tc", "scoring_func": "sigmoid", "routed_scaling_factor": 2.5, "moe_layer_freq": 1,
            "kv_lora_rank": model.kv_lora_rank, "q_lora_rank": model.q_lora_rank or None,
            "qk_rope_head_dim": model.qk_rope_head_dim, "qk_nope_head_dim": model.head_dim - model.qk_rope_head_dim,
            "v_head_dim": model.v_head_dim, "rope_theta": 10000, "num_nextn_predict_layers": model.mtp_layers,
        }
    else:
        cfg = {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common, "head_dim": model.head_dim,
            "num_experts": model.n_routed_experts, "decoder_sparse_step": 1,
            "mlp_only_layers": list(range(model.num_dense_layers)), "rope_theta": 1000000.0,
            "use_sliding_window": False, "sliding_window": None,
        }
    if model.weight_bytes == 1.0:  # FP8 with 128 x 128 block scales, as DeepSeek-V3 ships
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}
    return cfg


def at_depth(cfg: dict[str, Any], layers: int) -> dict[str, Any]:
    """``cfg`` with ``layers`` decoder layers and every width unchanged.

    Leading dense layers are kept up to one (so a DeepSeek-V3 stack of 4 is 1 dense + 3 MoE layers, as its
    first layers are); multi-token-prediction layers are dropped (a profile times the main stack)."""
    if layers < 1:
        raise ValueError(f"a model needs at least one layer (got {layers})")
    out = dict(cfg)
    out["num_hidden_layers"] = layers
    if "first_k_dense_replace" in out:
        dense = min(int(out.get("first_k_dense_replace") or 0), 1)
        out["first_k_dense_replace"] = dense if layers > dense else 0
    if out.get("mlp_only_layers"):
        out["mlp_only_layers"] = [i for i in out["mlp_only_layers"] if i < min(layers - 1, 1)]
    if "num_nextn_predict_layers" in out:
        out["num_nextn_predict_layers"] = 0
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
