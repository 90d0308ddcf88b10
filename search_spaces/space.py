"""The dimensions a study searches and the one function that turns choices into a DeploymentConfig.

``build`` is written once against a ``choose(name, choices)`` callback. ``suggest`` hands it Optuna's
``trial.suggest_categorical``; ``enumerate`` hands it an odometer, which walks every path of the same
conditional tree — so the exhaustive grid and the sampler can never disagree about the space.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from search_spaces.deployment import DeploymentConfig, EPLBConfig, Mode, Role, RoleConfig
from search_spaces.knobs import KNOBS, Knob

if TYPE_CHECKING:
    import optuna

T = TypeVar("T")
Choose = Callable[[str, Sequence[Any]], Any]

PRESET_DIR = Path(__file__).parent / "presets"


#: The most choices one dimension may list: a space is searched, not swept; a longer list is a generated one.
MAX_CHOICES = 256
#: The largest instance count, TP or DP size a space may name: every GPU of the largest cluster a job may name
#: (``cluster.nodes`` ≤ 4096 × ``gpus_per_node`` ≤ 128).
MAX_SIZE = 4096 * 128
#: The largest EPLB value a space may name (redundant experts, window and step counts).
MAX_EPLB = 1 << 24


def _nonempty(v: list[Any]) -> list[Any]:
    if not v:
        raise ValueError("needs at least one choice")
    if len(v) > MAX_CHOICES:
        raise ValueError(f"lists {len(v):,} choices; at most {MAX_CHOICES} are allowed")
    if len(set(map(str, v))) != len(v):
        raise ValueError("choices repeat")
    return v


def _at_most(v: list[int], le: int) -> list[int]:
    if (big := max(v, default=0)) > le:
        raise ValueError(f"{big:,} is too large; allowed: at most {le:,}")
    return v


@lru_cache(maxsize=256)
def _knob_choices(lists: tuple[tuple[Any, ...], ...]) -> tuple[tuple[Knob, list[Any], list[Any] | None], ...]:
    """``RoleSpace.knob_choices`` of the knobs' lists: worked out once per space, not once per candidate."""
    out = []
    for k, values in zip(KNOBS, lists, strict=True):
        encoded = [k.encode(v) for v in values]
        decoded = [k.decode(v) for v in encoded]
        out.append((k, encoded, decoded if any(d is not e for d, e in zip(decoded, encoded)) else None))
    return tuple(out)


class _RoleLayoutSpace(BaseModel):
    """Choices of a role's layout; ``RoleSpace`` adds a list of choices per knob of ``search_spaces.knobs``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instances: list[int] = Field(default=[1])
    dp_sizes: list[int] = Field(default=[1])
    tp_sizes: list[int] = Field(default=[1], description="Tensor-parallel size inside each DP rank.")
    dp_sizes_by_tp: dict[int, list[int]] = Field(
        default={}, description="DP sizes searched with one TP size instead of dp_sizes (parameter {role}_tp{N}_dp), "
        "so that a space holds TP2 × DP16 and DP32 without TP2 × DP32.")
    instances_by_gpus: dict[int, list[int]] = Field(
        default={}, description="Instance counts searched for instances of N GPUs instead of instances (parameter "
        "{role}_g{N}_instances), so that 4 × DEP4 and 1 × DEP16 need not bring 4 × DEP16; when given, the "
        "instances are chosen after TP and DP.")
    expert_parallel: list[bool] = Field(default=[True], description="With TP × DP > 1: true spreads experts over "
                                        "the ranks (EP), false shards each expert over them (TP experts); "
                                        "[true, false] searches both.")


# One list of choices per knob, generated from the table: the fields exist only at run time, so the type checker
# sees the layout alone and a knob's list is read through ``RoleSpace.choices`` (typed, by the knob's name).
if TYPE_CHECKING:
    _RoleKnobSpace = _RoleLayoutSpace
else:
    _RoleKnobSpace = create_model("_RoleKnobSpace", __base__=_RoleLayoutSpace, **{
        k.space: (list[k.kind], Field(default=[k.default], description=f"{k.label}: {k.help} "
                                      f"(parameter {{role}}_{k.param}; vLLM's {k.flag})"))
        for k in KNOBS})


class RoleSpace(_RoleKnobSpace):
    """Choices for one role. An instance is TP × DP GPUs; with ``expert_parallel`` true its experts are spread
    over all TP × DP ranks (DEP/EP: ``dp_sizes`` is the DEP size, or with TP1 the decode EP width), false keeps
    attention data-parallel and shards every expert tensor-parallel over the TP × DP ranks (vLLM's behaviour
    without ``--enable-expert-parallel``). One list of choices per knob of ``search_spaces.knobs``."""

    _check = field_validator("instances", "dp_sizes", "tp_sizes", "expert_parallel", *(k.space for k in KNOBS))(
        _nonempty)

    @field_validator("instances", "dp_sizes", "tp_sizes", *(k.space for k in KNOBS if k.ge == 1))
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError("sizes must be ≥ 1")
        return v

    @field_validator(*(k.space for k in KNOBS if k.ge is not None and k.ge != 1), check_fields=False)
    @classmethod
    def _at_least(cls, v: list[int], info: ValidationInfo) -> list[int]:
        ge = next(k.ge for k in KNOBS if k.space == info.field_name)
        if any(x < ge for x in v):  # type: ignore[operator]
            raise ValueError(f"must be ≥ {ge}")
        return v

    @field_validator("instances", "dp_sizes", "tp_sizes", *(k.space for k in KNOBS if k.le is not None))
    @classmethod
    def _bounded(cls, v: list[int], info: ValidationInfo) -> list[int]:
        le = next((k.le for k in KNOBS if k.space == info.field_name and k.le is not None), MAX_SIZE)
        return _at_most(v, le)

    def choices(self, knob: str) -> list[Any]:
        """The choices listed for the knob named ``knob`` (its ``RoleConfig`` field name, ``Knob.name``)."""
        for k in KNOBS:
            if k.name == knob:
                lists: list[Any] = getattr(self, k.space)
                return lists
        raise KeyError(f"no knob named {knob!r}")

    @property
    def knob_choices(self) -> tuple[tuple[Knob, list[Any], list[Any] | None], ...]:
        """Each knob with its choices as the study's parameter holds them and, where they differ (an enum), as
        the ``RoleConfig`` field takes them."""
        return _knob_choices(tuple(tuple(getattr(self, k.space)) for k in KNOBS))

    @model_serializer(mode="wrap")
    def _knobs_named(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A knob declared after the table existed is written only where the space names it (a stored space
        keeps the text it had)."""
        out: dict[str, Any] = handler(self)
        for k in KNOBS:
            if not k.stored and getattr(self, k.space) == [k.default]:
                out.pop(k.space, None)
        return out

    @model_validator(mode="after")
    def _keyed_choices(self) -> RoleSpace:
        """A product of TP, DP and instance counts holds every pairing, most of them wider than the cluster where
        the sizes span narrow and wide instances; the keyed lists search the pairings meant."""
        for tp in self.dp_sizes_by_tp:
            if tp not in self.tp_sizes:
                raise ValueError(f"dp_sizes_by_tp: TP{tp} is not one of tp_sizes {self.tp_sizes}")
        for field, keyed in (("dp_sizes_by_tp", self.dp_sizes_by_tp), ("instances_by_gpus", self.instances_by_gpus)):
            if len(keyed) > MAX_CHOICES:
                raise ValueError(f"{field}: lists {len(keyed):,} keys; at most {MAX_CHOICES} are allowed")
            for key, sizes in keyed.items():
                if key < 1 or not sizes or any(x < 1 for x in sizes) or len(set(sizes)) != len(sizes):
                    raise ValueError(f"{field}: {key}: needs distinct sizes ≥ 1 under a key ≥ 1")
                if len(sizes) > MAX_CHOICES or max(key, *sizes) > MAX_SIZE:
                    raise ValueError(f"{field}: {key}: at most {MAX_CHOICES} sizes, each and the key at most "
                                     f"{MAX_SIZE:,}")
        return self

    def dp_choice(self, prefix: str, tp: int) -> tuple[str, list[int]]:
        """The study's parameter of the DP size under TP ``tp``, and its choices: one name per list of choices
        (Optuna keeps one list per name)."""
        if tp in self.dp_sizes_by_tp:
            return f"{prefix}_tp{tp}_dp", self.dp_sizes_by_tp[tp]
        return f"{prefix}_dp", self.dp_sizes

    def instances_choice(self, prefix: str, gpus: int) -> tuple[str, list[int]]:
        """The parameter of the instance count of instances of ``gpus`` GPUs, and its choices."""
        if gpus in self.instances_by_gpus:
            return f"{prefix}_g{gpus}_instances", self.instances_by_gpus[gpus]
        return f"{prefix}_instances", self.instances


class EPLBSpace(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: list[bool] = Field(default=[False])
    num_redundant_experts: list[int] = Field(default=[0])
    window_size: list[int] = Field(default=[1000])
    step_interval: list[int] = Field(default=[3000])

    _check = field_validator("enabled", "num_redundant_experts", "window_size", "step_interval")(_nonempty)

    @field_validator("num_redundant_experts")
    @classmethod
    def _not_negative(cls, v: list[int]) -> list[int]:
        if any(x < 0 for x in v):
            raise ValueError("redundant experts must be ≥ 0")
        return v

    @field_validator("window_size", "step_interval")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError("steps must be ≥ 1")
        return v

    @field_validator("num_redundant_experts", "window_size", "step_interval")
    @classmethod
    def _bounded(cls, v: list[int]) -> list[int]:
        return _at_most(v, MAX_EPLB)


class SearchSpace(BaseModel):
    """Every dimension of the seed's study. A list of one choice fixes that knob."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    modes: list[Mode] = Field(default=[Mode.AGGREGATED, Mode.DISAGGREGATED])
    mixed: RoleSpace = RoleSpace()
    prefill: RoleSpace = RoleSpace()
    decode: RoleSpace = RoleSpace()
    eplb: EPLBSpace = EPLBSpace()
    router_policy: str = "round_robin"

    _check = field_validator("modes")(_nonempty)

    @model_validator(mode="after")
    def _knobs_where_they_apply(self) -> SearchSpace:
        """A knob searched in a role it does not apply to would be silently dropped by ``build``: refused."""
        for name in ("mixed", "prefill", "decode"):
            for k in KNOBS:
                if name not in k.roles and getattr(getattr(self, name), k.space) != [k.default]:
                    raise ValueError(f"{name}.{k.space}: {k.label} applies to the "
                                     f"{' and '.join(sorted(k.roles))} role only")
        return self

    # ------------------------------------------------------------------ building
    def build(self, choose: Choose) -> DeploymentConfig:
        """The candidate that ``choose``'s answers describe; parameter names are the study's."""
        mode = Mode(choose("mode", [m.value for m in self.modes]))
        if mode is Mode.AGGREGATED:
            return self.assemble(mode, self._role(choose, "mixed", Role.MIXED, self.mixed))
        return self.assemble(mode, self._role(choose, "prefill", Role.PREFILL, self.prefill),
                             self._role(choose, "decode", Role.DECODE, self.decode))

    def assemble(self, mode: Mode, *roles: RoleConfig) -> DeploymentConfig:
        """The candidate of ``mode`` made of roles already built (the mixed one; or prefill, decode): ``build``'s
        last step, which ``valid_space`` also takes with the role rows it built once."""
        if mode is Mode.AGGREGATED:
            (mixed,) = roles
            return DeploymentConfig(mode=mode, decode=mixed, router_policy=self.router_policy)
        prefill, decode = roles
        return DeploymentConfig(mode=mode, prefill=prefill, decode=decode, router_policy=self.router_policy)

    def _role(self, choose_any: Choose, p: str, role: Role, rs: RoleSpace) -> RoleConfig:
        def choose(name: str, choices: Sequence[Any]) -> Any:
            # a knob with one choice is a constant, not a parameter: nothing for the sampler to learn, and each
            # parameter is a write to Optuna's storage per trial (most of the tuner's own time)
            return choices[0] if len(choices) == 1 else choose_any(name, choices)

        keyed = bool(rs.instances_by_gpus)  # then the count follows the width it is of
        instances = 0 if keyed else choose(*rs.instances_choice(p, 0))
        tp = choose(f"{p}_tp", rs.tp_sizes)
        dp = choose(*rs.dp_choice(p, tp))
        instances = choose(*rs.instances_choice(p, tp * dp)) if keyed else instances
        # EP (DEP with TP1): experts spread over the ranks; else each expert is sharded over them (TP experts)
        ep = bool(choose(f"{p}_ep", rs.expert_parallel)) if tp * dp > 1 else False
        kw: dict[str, Any] = dict(role=role, instances=instances, tensor_parallel_size=tp, data_parallel_size=dp,
                                  enable_expert_parallel=ep)
        r = role.value
        for k, choices, decoded in rs.knob_choices:  # each knob where it applies (the order is the study's)
            if k.applies(r, kw):
                v = choose(f"{p}_{k.param}", choices)
                kw[k.name] = decoded[choices.index(v)] if decoded else v
        if ep:
            if choose(f"{p}_eplb", self.eplb.enabled):
                kw["eplb"] = EPLBConfig(
                    enabled=True,
                    num_redundant_experts=choose(f"{p}_eplb_redundant", self.eplb.num_redundant_experts),
                    window_size=choose(f"{p}_eplb_window", self.eplb.window_size),
                    step_interval=choose(f"{p}_eplb_interval", self.eplb.step_interval),
                )
        return RoleConfig(**kw)

    def suggest(self, trial: optuna.Trial) -> DeploymentConfig:
        """Ask Optuna for every dimension (categorical: the domains are small, discrete and unordered)."""
        return self.build(lambda name, choices: trial.suggest_categorical(name, list(choices)))

    def params_of(self, cfg: DeploymentConfig) -> dict[str, Any]:
        """The parameter dict that ``build`` turns into ``cfg`` (for enqueuing a known candidate)."""
        for params, c in self.enumerate():
            if c == cfg:
                return params
        raise ValueError("configuration is not in this search space")

    def enumerate(self) -> Iterator[tuple[dict[str, Any], DeploymentConfig]]:
        """Every candidate of the space once, with its parameters (the exhaustive grid)."""
        return odometer(self.build)

    def role_rows(self, role: Role) -> Iterator[tuple[dict[str, Any], RoleConfig]]:
        """Every choice of one role with its (prefixed) parameters: the same branch of ``build`` that a
        candidate takes for this role, so ``valid_space`` can check roles one at a time."""
        p, rs = {Role.MIXED: ("mixed", self.mixed), Role.PREFILL: ("prefill", self.prefill),
                 Role.DECODE: ("decode", self.decode)}[role]
        return odometer(lambda choose: self._role(choose, p, role, rs))

    def size(self) -> int:
        return sum(1 for _ in self.enumerate())


def odometer(build: Callable[[Choose], T]) -> Iterator[tuple[dict[str, Any], T]]:
    """Every path of the conditional tree that ``build`` walks with ``choose``, once each, with its choices."""
    path: list[int] = []
    while True:
        widths: list[int] = []
        params: dict[str, Any] = {}

        def choose(name: str, choices: Sequence[Any]) -> Any:
            i = len(widths)
            if i == len(path):
                path.append(0)
            widths.append(len(choices))
            params[name] = choices[path[i]]
            return choices[path[i]]

        result = build(choose)
        yield dict(params), result
        del path[len(widths):]
        while path and path[-1] + 1 >= widths[len(path) - 1]:
            path.pop()
        if not path:
            return
        path[-1] += 1


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """The raw preset document (model, cluster, space and default workload/SLOs) by file stem."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"unknown preset {name!r}; allowed: {', '.join(preset_names())}")
    return yaml.safe_load(path.read_text())
