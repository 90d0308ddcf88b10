"""One candidate deployment, and the vLLM flag behind each of its knobs.

Each field that maps to a ``vllm serve`` flag names the flag in its metadata (``vllm_flag``): when it is
written (``omit_default``, ``requires``) and, for a JSON-valued flag, which method gives its value
(``value``). ``flags_of`` reads them into an ordered ``{flag: value}`` mapping, which ``executors.vllm.render``
turns into argv and every export reads, so the flag is written once. Fields without a flag are facts about
the deployment (how many instances, which role).
"""

from __future__ import annotations

import json
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, create_model, model_serializer
from pydantic import model_validator

from search_spaces.knobs import KNOBS, All2AllBackend, Knob


#: A flag's value in a ``{flag: value}`` mapping: ``True`` for a flag without a value, a dict for a JSON one.
FlagValue = str | int | float | bool | dict[str, Any]


def vllm_flag(flag: str, default: Any, *, omit_default: bool = False, requires: str | None = None,
              value: str | None = None, negated: str | None = None, **kwargs: Any) -> Any:
    """A pydantic field that is also a ``vllm serve`` flag. ``omit_default``: written only when it differs from
    the default (vLLM's default is the same); ``requires``: written only when that field (dotted path) of the
    same model is true; ``value``: the model's method that gives the flag's value (a JSON flag's dict);
    ``negated``: the flag that writes ``False`` (vLLM's ``--no-…`` of a boolean that defaults to ``None``)."""
    extra = {"vllm_flag": flag, "omit_default": omit_default, "requires": requires, "value": value,
             "negated": negated}
    return Field(default, json_schema_extra={k: v for k, v in extra.items() if v}, **kwargs)


def flag_name(model: type[BaseModel], field: str) -> str:
    """The ``vllm serve`` flag a field declares."""
    return model.model_fields[field].json_schema_extra["vllm_flag"]  # type: ignore[index,return-value]


def _path(model: BaseModel, dotted: str) -> Any:
    for name in dotted.split("."):
        model = getattr(model, name)
    return model


def flags_of(model: BaseModel) -> dict[str, FlagValue]:
    """The ``{flag: value}`` of a model's declared flags, in field order; a flag field holding a model
    contributes that model's own flags first (``--enable-eplb`` before ``--eplb-config``). A flag without a
    value is ``True`` when set and absent when not; enums are their values."""
    out: dict[str, FlagValue] = {}
    for name, f in type(model).model_fields.items():
        meta = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        flag, v = meta.get("vllm_flag"), getattr(model, name)
        if not flag:
            continue
        if isinstance(v, BaseModel):
            out |= flags_of(v)
        if (meta.get("omit_default") and v == f.default) or (meta.get("requires") and not _path(model, meta["requires"])):
            continue
        if meta.get("value"):
            v = getattr(model, meta["value"])()  # type: ignore[arg-type]
        if v is False and meta.get("negated"):
            out[meta["negated"]] = True
        elif v is not False:
            out[flag] = v.value if isinstance(v, Enum) else v
    return out


def knob_field(k: Knob) -> Any:
    """The ``RoleConfig`` field a knob declares."""
    return vllm_flag(k.flag, k.default, omit_default=k.omit_default, requires=k.requires, negated=k.negated_flag,
                     description=k.help, **{b: v for b, v in (("ge", k.ge), ("le", k.le)) if v is not None})


class Mode(StrEnum):
    AGGREGATED = "aggregated"  # every instance does prefill and decode
    DISAGGREGATED = "disaggregated"  # prefill instances hand KV to decode instances (P/D)


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"  # aggregated serving: both phases on one instance


class EPLBConfig(BaseModel):
    """Expert-parallel load balancing; rendered as ``--enable-eplb --eplb-config JSON``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = vllm_flag("--enable-eplb", False)
    num_redundant_experts: int = Field(0, ge=0, description="Extra expert replicas spread over EP ranks.")
    window_size: int = Field(1000, ge=1, description="Steps of load statistics EPLB looks back over.")
    step_interval: int = Field(3000, ge=1, description="Steps between rearrangements.")

    def config(self) -> dict[str, Any]:
        """The ``--eplb-config`` value, with vLLM's own key names."""
        return {"window_size": self.window_size, "step_interval": self.step_interval,
                "num_redundant_experts": self.num_redundant_experts}

    def config_json(self) -> str:
        return json.dumps(self.config(), separators=(",", ":"))


class _RoleLayout(BaseModel):
    """The layout of a role's instances; ``RoleConfig`` adds the knobs of ``search_spaces.knobs`` and EPLB."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    instances: int = Field(1, ge=1)
    tensor_parallel_size: int = vllm_flag("--tensor-parallel-size", 1, ge=1, omit_default=True)
    data_parallel_size: int = vllm_flag("--data-parallel-size", 1, ge=1, omit_default=True)
    enable_expert_parallel: bool = vllm_flag("--enable-expert-parallel", False)


if TYPE_CHECKING:
    class _RoleKnobs(_RoleLayout):
        """The knobs' fields as the type checker sees them (the table declares them, ``create_model`` makes them)."""

        max_num_seqs: int
        max_num_batched_tokens: int
        all2all_backend: All2AllBackend
        enable_dbo: bool
        async_scheduling: bool | None
        performance_mode: str
        long_prefill_token_threshold: int
        kv_cache_dtype: str
else:
    _RoleKnobs = create_model("_RoleKnobs", __base__=_RoleLayout,
                              **{k.name: (k.kind, knob_field(k)) for k in KNOBS})


class RoleConfig(_RoleKnobs):
    """The instances of one role. An instance is one vLLM deployment of ``tp × dp`` GPUs; its serving knobs are
    the fields ``search_spaces.knobs.KNOBS`` declares."""

    eplb: EPLBConfig = vllm_flag("--eplb-config", EPLBConfig(), requires="eplb.enabled", value="eplb_config")

    @model_serializer(mode="wrap")
    def _knobs_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A knob declared after the table existed is stored only when set: a configuration without it keeps
        the text, key and hash it had (``knobs``' docstring)."""
        out: dict[str, Any] = handler(self)
        for k in KNOBS:
            if not k.stored and getattr(self, k.name) == k.default:
                out.pop(k.name, None)
        return out

    def eplb_config(self) -> dict[str, Any]:
        return self.eplb.config()

    @property
    def gpus_per_instance(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size

    @property
    def gpus(self) -> int:
        return self.instances * self.gpus_per_instance

    @property
    def ep_size(self) -> int:
        """vLLM's EP group is TP × DP when expert parallelism is on; otherwise experts are TP-sharded."""
        return self.gpus_per_instance if self.enable_expert_parallel else 1

    @property
    def shape(self) -> str:
        """``DEP4`` (prefill/mixed), ``EP16`` (decode), ``TP2×DP4 EP8``, ``TP4``; without expert parallelism
        and DP > 1 (DP attention, every expert sharded over the instance's TP × DP GPUs): ``DP8 TP-experts``
        (TP1) or ``TP2×DP4``."""
        if self.enable_expert_parallel and self.tensor_parallel_size == 1:
            return f"EP{self.ep_size}" if self.role is Role.DECODE else f"DEP{self.data_parallel_size}"
        if self.enable_expert_parallel:
            return f"TP{self.tensor_parallel_size}×DP{self.data_parallel_size} EP{self.ep_size}"
        if self.data_parallel_size > 1 and self.tensor_parallel_size == 1:
            return f"DP{self.data_parallel_size} TP-experts"
        if self.data_parallel_size > 1:
            return f"TP{self.tensor_parallel_size}×DP{self.data_parallel_size}"
        return f"TP{self.tensor_parallel_size}"

    def _knob_texts(self, text: str, after_eplb: bool) -> list[str]:
        chosen = dict(self)
        return [t for k in KNOBS if k.after_eplb is after_eplb
                for t in [getattr(k, text)(getattr(self, k.name), chosen)] if t]

    def short(self) -> str:
        """One cell of a table: ``2×DEP4 s256 b8k EPLB32 DBO`` (each knob's ``cell``)."""
        n = f"{self.instances}×" if self.instances > 1 else ""
        parts = [f"{n}{self.shape}", *self._knob_texts("cell", False)]
        if self.eplb.enabled:
            parts.append(f"EPLB{self.eplb.num_redundant_experts}")
        return " ".join(parts + self._knob_texts("cell", True))

    def describe(self) -> str:
        """The role in an operator's words: ``2 × DEP4 (…)``, ``EP16 (…)``, ``TP4 (…)``, ``DP8 TP-experts (…,
        experts sharded over 8 GPUs)``; each knob's ``words``."""
        n = f"{self.instances} × " if self.instances > 1 else ""
        extras = self._knob_texts("words", False)
        if not self.enable_expert_parallel and self.data_parallel_size > 1:
            extras.append(f"experts sharded over {self.gpus_per_instance} GPUs")
        if self.eplb.enabled:
            extras.append(f"EPLB {self.eplb.num_redundant_experts} redundant")
        extras += self._knob_texts("words", True)
        return f"{n}{self.shape} ({', '.join(extras)})"


class DeploymentConfig(BaseModel):
    """One candidate: what runs, not where (placement is ``executors.place``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode
    prefill: RoleConfig | None = None
    decode: RoleConfig
    kv_connector: str | None = Field(None, description="None: the executor's platform picks (Nixl on GPUs).")
    router_policy: str = "round_robin"
    speculative_mtp_tokens: int = vllm_flag("--speculative-config", 0, ge=0, omit_default=True,
                                            value="speculative_config", description="MTP draft tokens; 0 = off.")

    def speculative_config(self) -> dict[str, Any]:
        return {"method": "mtp", "num_speculative_tokens": self.speculative_mtp_tokens}

    @model_validator(mode="after")
    def _roles_match_mode(self) -> DeploymentConfig:
        if self.mode is Mode.DISAGGREGATED:
            if self.prefill is None or self.prefill.role is not Role.PREFILL or self.decode.role is not Role.DECODE:
                raise ValueError("a disaggregated deployment needs a prefill role and a decode role")
        else:
            if self.prefill is not None or self.decode.role is not Role.MIXED:
                raise ValueError("an aggregated deployment has one role, 'mixed', in 'decode'")
        return self

    @property
    def roles(self) -> list[RoleConfig]:
        return [r for r in (self.prefill, self.decode) if r is not None]

    @property
    def total_gpus(self) -> int:
        return sum(r.gpus for r in self.roles)

    def describe(self) -> str:
        """E.g. ``prefill 2 × DEP2 (…); decode EP8 (…)`` — the words `advisor best` prints."""
        if self.mode is Mode.AGGREGATED:
            text = f"aggregated {self.decode.describe()}"
        else:
            assert self.prefill is not None
            text = f"prefill {self.prefill.describe()}; decode {self.decode.describe()}"
        if self.speculative_mtp_tokens:
            text += f"; MTP {self.speculative_mtp_tokens}"
        return f"{text} — {self.total_gpus} GPU{'s' if self.total_gpus != 1 else ''}"

    def short(self) -> str:
        """One table cell: ``P 4×DEP4 … | D EP16 …`` or ``agg 2×DEP8 …``."""
        if self.mode is Mode.AGGREGATED:
            return f"agg {self.decode.short()}"
        assert self.prefill is not None
        return f"P {self.prefill.short()} | D {self.decode.short()}"

    def key(self) -> str:
        """A stable identity, to spot a candidate proposed twice."""
        return self.model_dump_json()
