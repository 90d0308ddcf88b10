"""The serving knobs of one role, each declared once: its ``vllm serve`` flag, default, domain, the study's
parameter name, its label and where it applies.

Everything else is derived from ``KNOBS``: the ``RoleConfig`` field (and through its flag metadata the
rendering to ``vllm serve`` flags, every export and the stored configuration), the ``RoleSpace`` field with
its list of choices and its validation, the ``choose(...)`` call of ``SearchSpace.build`` (the parameter
``{role}_{param}``, so the database and the dashboard's parameter table hold it), and the words of
``RoleConfig.short()`` / ``describe()`` (the dashboard's deployment column, ``advisor best``). Adding a knob
is one entry here, plus, where its effect is known, its term in the performance model (``model_term`` says
which; a knob without one is left to the sampler).

The layout of an instance (instances, TP, DP, expert parallelism) and EPLB are not here: they are the
structure ``build`` chooses the knobs inside of, with rules of their own.

Knobs declared before this table existed (``stored=True``) stay in every stored configuration, so the keys,
texts and seeded sequences of existing studies do not change; a newer knob is written into a stored
configuration only when set away from its default, and its default is a single choice, which ``build``
takes without asking the sampler: a space that does not name it searches exactly what it searched before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Literal

#: The roles a knob can apply to (``Role``'s values).
ALL_ROLES = frozenset({"mixed", "prefill", "decode"})


class All2AllBackend(StrEnum):
    """vLLM's ``--all2all-backend`` choices that matter for MoE serving."""

    ALLGATHER_REDUCESCATTER = "allgather_reducescatter"  # vLLM's default
    DEEPEP_HIGH_THROUGHPUT = "deepep_high_throughput"  # prefill: large batches
    DEEPEP_LOW_LATENCY = "deepep_low_latency"  # decode: small batches, CUDA-graph friendly
    NIXL_EP = "nixl_ep"
    FLASHINFER_NVLINK_TWO_SIDED = "flashinfer_nvlink_two_sided"

    @property
    def supports_dbo(self) -> bool:
        """vLLM allows dual-batch overlap only with these kernels (they split dispatch from compute)."""
        return self in (All2AllBackend.DEEPEP_HIGH_THROUGHPUT, All2AllBackend.DEEPEP_LOW_LATENCY,
                        All2AllBackend.NIXL_EP)


def _always(chosen: Mapping[str, Any]) -> bool:
    return True


def _none(value: Any, chosen: Mapping[str, Any]) -> str | None:
    return None


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One serving setting of a role, declared by keyword with its name given once.

    ``name`` is the RoleConfig field and vLLM's engine-argument name; the flag (``--`` and the name with dashes),
    the RoleSpace field, the study's parameter and the label are derived from it unless given (an older knob
    keeps the field and parameter its stored studies hold).
    ``when``: given the role's choices so far (the layout's fields, the knobs before this one), whether the
    knob is searched; otherwise it keeps its default. ``cell`` / ``words``: its text in a table cell and in
    ``describe()`` (``None``: nothing), given its value and the choices. ``after_eplb``: shown after EPLB's text
    (the order the texts had before the table). ``stored``: always in a stored configuration (see the module's
    docstring). ``gpu_only``: set away from its default only on GPUs (``rules`` refuses it on the CPU build).
    ``model_term``: where the performance model reads it, or ``None`` (left to the sampler).
    """

    name: str  # the RoleConfig field, vLLM's engine-argument name
    default: Any
    kind: Any  # the type of one value
    help: str
    flag: str = ""  # vLLM's flag; default ``--`` + the name with dashes
    space: str = ""  # the RoleSpace field holding the choices; default the name
    param: str = ""  # the study's parameter, {role}_{param}; default the name
    label: str = ""  # a column or axis title; default the name with dashes
    cell: Callable[[Any, Mapping[str, Any]], str | None] = _none
    words: Callable[[Any, Mapping[str, Any]], str | None] = _none
    when: Callable[[Mapping[str, Any]], bool] = _always
    roles: frozenset[str] = ALL_ROLES
    ge: int | None = None
    le: int | None = None  # the largest value a job may name (vLLM takes any int; a typo like 1e28 is refused)
    omit_default: bool = False
    requires: str | None = None  # rendered only when this RoleConfig field is true
    negated_flag: str | None = None  # a ``False`` value is written as this flag (vLLM's ``--no-…``)
    after_eplb: bool = True
    stored: bool = False
    gpu_only: bool = False
    model_term: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        dashed = self.name.replace("_", "-")
        for attr, derived in (("flag", f"--{dashed}"), ("space", self.name), ("param", self.name), ("label", dashed)):
            if not getattr(self, attr):
                object.__setattr__(self, attr, derived)

    def encode(self, value: Any) -> Any:
        """A value as the study's parameter holds it (an enum by its value)."""
        return value.value if isinstance(value, Enum) else value

    def decode(self, value: Any) -> Any:
        """The study's parameter value as the RoleConfig field's."""
        if isinstance(self.kind, type) and issubclass(self.kind, Enum):
            return self.kind(value)
        return value

    def applies(self, role: str, chosen: Mapping[str, Any]) -> bool:
        return role in self.roles and self.when(chosen)


PerformanceMode = Literal["balanced", "interactivity", "throughput"]
KVCacheDType = Literal["auto", "fp8"]

KNOBS: tuple[Knob, ...] = (
    Knob(name="max_num_seqs", default=256, kind=int, help="Most sequences a DP rank schedules in one step.",
         ge=1, le=1 << 20, after_eplb=False, stored=True,
         cell=lambda v, c: f"s{v}", words=lambda v, c: f"max-num-seqs {v}",
         model_term="the decode batch (perf.levels: a level's concurrency is capped at it per rank)"),
    Knob(name="max_num_batched_tokens", default=8192, kind=int, help="Token budget of one step (the prefill chunk).",
         ge=1, le=1 << 26, after_eplb=False, stored=True, cell=lambda v, c: f"b{v // 1024}k",
         words=lambda v, c: f"batched tokens {v}",
         model_term="the prefill chunk and the activation memory (perf.step, rules.kv_capacity_tokens)"),
    Knob(name="all2all_backend", default=All2AllBackend.ALLGATHER_REDUCESCATTER, kind=All2AllBackend,
         space="all2all_backends", param="all2all", label="all-to-all backend",
         help="The MoE dispatch/combine kernels (expert parallelism only).",
         requires="enable_expert_parallel", after_eplb=False, stored=True,
         when=lambda c: bool(c["enable_expert_parallel"]),
         words=lambda v, c: v.value if c["enable_expert_parallel"] else None,
         model_term="the all-to-all cost (perf.derived: latency, chunking, DeepEP low-latency limits)"),
    Knob(name="enable_dbo", default=False, kind=bool, space="dbo", param="dbo", label="DBO",
         help="Dual-batch overlap: one micro-batch's all-to-all hides behind the other's compute.", stored=True,
         when=lambda c: bool(c["enable_expert_parallel"]) and c["all2all_backend"].supports_dbo,
         cell=lambda v, c: "DBO" if v else None, words=lambda v, c: "DBO" if v else None,
         model_term="the all-to-all overlap (perf.step: split steps above the DBO thresholds)"),
    # ---- one-GPU serving settings; in a space only where it names them (docs/jobs.md)
    Knob(name="async_scheduling", default=None, kind=bool | None, label="async scheduling",
         help="Schedule step n+1 while step n runs on the GPU; null: vLLM decides (on where supported).",
         omit_default=True, negated_flag="--no-async-scheduling", roles=frozenset({"mixed"}),
         cell=lambda v, c: None if v is None else ("async" if v else "sync"),
         words=lambda v, c: None if v is None else f"async scheduling {'on' if v else 'off'}"),
    Knob(name="performance_mode", default="balanced", kind=PerformanceMode, label="performance mode",
         help="vLLM's preset of CUDA-graph sizes and kernels: interactivity favours small batches, throughput "
              "large ones.", omit_default=True, roles=frozenset({"mixed"}),
         cell=lambda v, c: None if v == "balanced" else v, words=lambda v, c: None if v == "balanced" else f"{v} mode"),
    Knob(name="long_prefill_token_threshold", default=0, kind=int, param="long_prefill",
         label="long-prefill threshold",
         help="Tokens of one long prompt scheduled per step (0: no cap): decodes beside a long prefill keep their "
              "pace, its TTFT grows.", ge=0, le=1 << 26, omit_default=True,
         roles=frozenset({"mixed"}), cell=lambda v, c: f"lp{v}" if v else None,
         words=lambda v, c: f"long prefills {v} tokens/step" if v else None),
    Knob(name="kv_cache_dtype", default="auto", kind=KVCacheDType, label="KV-cache dtype",
         help="fp8 halves the KV cache of a bf16 model (more sequences fit); GQA models on GPUs, aggregated "
              "serving only (both sides of a P/D transfer must agree).", omit_default=True,
         roles=frozenset({"mixed"}), gpu_only=True, cell=lambda v, c: None if v == "auto" else f"kv-{v}",
         words=lambda v, c: None if v == "auto" else f"{v} KV cache",
         model_term="KV capacity per rank (rules.kv_bytes_per_token_per_gpu), hence memory fit and the "
                    "KV-limited batch"),
)

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
#: The byte width a ``--kv-cache-dtype`` other than ``auto`` stores per KV element.
KV_DTYPE_BYTES: dict[str, float] = {"fp8": 1.0}
