"""The space a job gets when it names none: derived from the model and the cluster, so that it fits.

A user who brings a model the presets do not know should not have to know which instance sizes hold its
weights before the first study. The derivation keeps what an operator would try first, role by role:

* **layouts**: every TP × DP split, with and without expert parallelism, of the narrowest ``WIDTHS`` instance
  widths that hold the role. Widths are powers of two within a node and whole nodes beyond it (how ``pack``
  places instances); TP is a power of two that divides a node and the attention heads, DP the rest, so TP > 1
  inside DP ranks (``TP2×DP16 EP32``) and DP attention with tensor-parallel experts (``DP8 TP-experts``) are
  offered beside DEP and plain TP. A layout holds when it breaks none of the rules no other knob lifts (TP within
  a node and dividing the heads, EP dividing the routed experts, the expert shard dividing
  ``moe_intermediate_size`` and its FP8 block, memory) and keeps KV for what the role holds per DP rank:
  ``KV_SEQUENCES`` full-length sequences for mixed and decode instances, one chunk (the prefill token budget)
  for a prefill instance, which hands each request's KV on once it is computed. So a width that can never divide
  the experts nor the expert width is never offered (384 experts on 72 GB300s: no DEP20);
* **both modes** where a prefill and a decode instance fit together; in P/D each role's widths and instance
  counts leave room for the other role's narrowest instance;
* **instances** 1 up to as many of the role's narrowest width as fit (at most ``MAX_INSTANCES``; decode at most
  ``MAX_DECODE_INSTANCES``);
* **batch sizes** around vLLM's own defaults for the GPU kind (``vllm_default_batch``): half, the default and
  double the default for ``max_num_seqs`` of mixed and decode instances, the default and double for the
  prefill token budget;
* **all-to-all kernels**: vLLM's default, plus DeepEP's (low-latency for decode and mixed, high-throughput
  with and without DBO for prefill) on GPUs, where some layout of the role spreads its experts; **EPLB** off
  and on, with 0 redundant experts or as many as the widest EP group (only where every EP width still divides
  the expert slots).

**One node** is where most users start, and what they need ranked are the layouts published runs compare on
it (TP8, TEP8, DEP8, 2 × TP4 …) and the batch knobs of the one they pick (the only one-GPU win the project
has measured came from the token budget, at 16384). So a cluster of one node keeps *every* width of the node
(not the narrowest ``WIDTHS``) and as many instances of a width as the node holds, and searches the token budget
of mixed instances beside ``max_num_seqs`` (``ONE_NODE_TOKENS``). On one GPU no layout is left to search, so
the batch knobs get a wider grid (``ONE_GPU_SEQS`` × ``ONE_GPU_TOKENS``, eighth to double vLLM's
``max_num_seqs``, half to four times its token budget), and the one-GPU serving knobs join
(``one_gpu_knobs``): those the model has a term for wherever the rules allow them (an FP8 KV cache for a
GQA model on GPUs), those it has none for only where the budget covers half the candidates they make
(``UNMODELLED_COVER``), since the sampler learns them only by measuring them. Expert parallelism, all-to-all
kernels and EPLB mean nothing for an instance of one GPU and are not offered there.

A role's dimensions are its layouts' TP sizes, each with the DP sizes of its own layouts
(``RoleSpace.dp_sizes_by_tp``): a product of TP and DP sizes would pair TP8 with DP32, mostly wider than the
cluster. Expert parallelism on and off, instances and the batch knobs are searched as a product; what the rules
refuse of it is left to ``ValidSpace`` (it costs no trial). ``advisor validate --show`` prints the derived
space, and the job stores it, so a continued study searches the same one.
"""

from __future__ import annotations

from typing import Any

from search_spaces.cluster import ClusterSpec
from search_spaces.deployment import All2AllBackend, Role, RoleConfig
from search_spaces.hardware import vllm_default_batch
from search_spaces.knobs import BY_NAME
from search_spaces.layer_kinds import AttentionKind
from search_spaces.model_profile import ModelProfile
from search_spaces.rules import kv_capacity_tokens, role_violations
from search_spaces.space import EPLBSpace, RoleSpace, SearchSpace

#: A mixed or decode instance must hold this many full-length sequences of KV per DP rank to be worth searching.
KV_SEQUENCES = 4
#: How many widths (the narrowest that hold the role) the derived space keeps per role.
WIDTHS = 3
MAX_INSTANCES = 4
MAX_DECODE_INSTANCES = 2
#: One node: the token budgets of mixed instances, as multiples of vLLM's default.
ONE_NODE_TOKENS = (1, 2)
#: One GPU: ``max_num_seqs`` and the token budget, as multiples of vLLM's defaults.
ONE_GPU_SEQS = (1 / 8, 1 / 4, 1 / 2, 1, 2)
ONE_GPU_TOKENS = (1 / 2, 1, 2, 4)
#: One GPU: the knobs without a model term, each with the choices it adds (in the order they join), and what share
#: of the candidates with them the budget must cover for them to join.
UNMODELLED: tuple[tuple[str, tuple[Any, ...]], ...] = (("performance_mode", ("balanced", "throughput")),
                                                      ("long_prefill_token_threshold", (0, 2048)))
UNMODELLED_COVER = 0.5

#: The rules of a layout that no other knob of the derived space can lift.
_HARD = {"tp-within-node", "tp-divides-heads", "ep-divides-experts", "tp-experts-divide-intermediate",
         "tp-experts-fp8-block", "memory-fit"}


def _node_widths(cluster: ClusterSpec) -> list[int]:
    """Instance widths inside one node: powers of two (and 72, one NVL72 rack) that divide a node."""
    return [w for w in (1, 2, 4, 8, 16, 32, 64, 72) if w <= cluster.gpus_per_node and cluster.gpus_per_node % w == 0]


def _widths(cluster: ClusterSpec) -> list[int]:
    per_node = cluster.gpus_per_node
    across = [per_node * k for k in range(2, cluster.nodes + 1)]
    return sorted(set(_node_widths(cluster) + across + [per_node])) or [1]


def _kv_needed(role: RoleConfig, max_model_len: int) -> int:
    """KV tokens per DP rank a role must hold to be worth searching: a prefill instance computes one chunk at a
    time and hands its KV on; mixed and decode instances keep ``KV_SEQUENCES`` whole sequences."""
    return role.max_num_batched_tokens if role.role is Role.PREFILL else KV_SEQUENCES * max_model_len


def _holds(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, max_model_len: int) -> bool:
    broken = {v.rule for v in role_violations(role, model, cluster, max_model_len)} & _HARD
    return not broken and kv_capacity_tokens(role, model, cluster) >= _kv_needed(role, max_model_len)


def _layouts(role: Role, room: int, model: ModelProfile, cluster: ClusterSpec, max_model_len: int,
            tokens: int) -> list[RoleConfig]:
    """Every TP × DP layout (EP on and off) of the narrowest ``WIDTHS`` widths (on one node: of every width) of at
    most ``room`` GPUs that holds ``role`` with a token budget of ``tokens``."""
    tps = [t for t in _node_widths(cluster) if model.num_heads % t == 0]
    most = len(_widths(cluster)) if cluster.nodes == 1 else WIDTHS
    out: list[RoleConfig] = []
    kept = 0
    for w in _widths(cluster):
        if w > room or kept == most:
            break
        held = [cfg for tp in tps if w % tp == 0 for ep in ((True, False) if w > 1 else (False,))
                if _holds(cfg := RoleConfig(role=role, tensor_parallel_size=tp, data_parallel_size=w // tp,
                                            enable_expert_parallel=ep, max_num_batched_tokens=tokens),
                          model, cluster, max_model_len)]
        kept += bool(held)
        out += held
    return out


def _narrowest(held: list[RoleConfig]) -> int:
    return min(c.gpus_per_instance for c in held)


def _role_space(held: list[RoleConfig], room: int, most: int, **choices: object) -> RoleSpace:
    """The role's dimensions: its layouts' TP sizes, each with the DP sizes of its own layouts (the narrowest TP's
    are ``dp_sizes``, the others' ``dp_sizes_by_tp`` where they differ), EP where some layout of > 1 GPU uses it;
    per width, 1 up to as many instances as ``room`` GPUs hold (at most ``most``)."""
    by_tp: dict[int, list[int]] = {}
    for c in held:
        by_tp.setdefault(c.tensor_parallel_size, [])
        if c.data_parallel_size not in by_tp[c.tensor_parallel_size]:
            by_tp[c.tensor_parallel_size].append(c.data_parallel_size)
    tps = sorted(by_tp)
    dps = sorted(by_tp[tps[0]])
    ep = sorted({c.enable_expert_parallel for c in held if c.gpus_per_instance > 1}, reverse=True)
    if not ep:  # no instance of more than one GPU: nothing to spread, the all-to-all kernel is never asked
        choices["all2all_backends"] = [All2AllBackend.ALLGATHER_REDUCESCATTER]
    counts = {w: list(range(1, min(most, room // w) + 1)) for w in sorted({c.gpus_per_instance for c in held})}
    narrow = counts[min(counts)]
    return RoleSpace(instances=narrow, instances_by_gpus={w: n for w, n in counts.items() if n != narrow},
                     tp_sizes=tps, dp_sizes=dps,
                     dp_sizes_by_tp={tp: sorted(by_tp[tp]) for tp in tps if sorted(by_tp[tp]) != dps},
                     expert_parallel=ep or [False], **choices)  # type: ignore[arg-type]


def _scaled(default: int, factors: tuple[float, ...]) -> list[int]:
    return sorted({max(1, int(default * f)) for f in factors})


def one_gpu_knobs(model: ModelProfile, cluster: ClusterSpec, budget: int | None) -> dict[str, list[Any]]:
    """The batch knobs of an instance of one GPU, and the one-GPU serving knobs (``RoleSpace`` fields): an FP8 KV
    cache where the model caches K and V at two bytes or more on a GPU (the rules refuse it for MLA and on the CPU
    build); then each knob without a model term (``UNMODELLED``) while ``budget`` trials cover
    ``UNMODELLED_COVER`` of the candidates it would make."""
    seqs, tokens = vllm_default_batch(cluster.spec)
    out: dict[str, list[Any]] = {"max_num_seqs": _scaled(seqs, ONE_GPU_SEQS),
                                 "max_num_batched_tokens": _scaled(tokens, ONE_GPU_TOKENS)}
    gpu = cluster.spec.name != "CPU"
    if gpu and model.attention is AttentionKind.GQA and model.kv_bytes > 1.0:
        out["kv_cache_dtype"] = ["auto", "fp8"]
    size = 1
    for values in out.values():
        size *= len(values)
    for name, values in UNMODELLED:
        if not gpu or budget is None or budget < UNMODELLED_COVER * size * len(values):
            break
        out[BY_NAME[name].space] = list(values)
        size *= len(values)
    return out


def default_space(model: ModelProfile, cluster: ClusterSpec, max_model_len: int,
                  budget: int | None = None) -> SearchSpace:
    """A space of deployments that hold ``model`` on ``cluster`` (see the module's docstring); ``budget``: the
    study's trials (on one GPU, whether the knobs without a model term join)."""
    seqs, tokens = vllm_default_batch(cluster.spec)
    total = cluster.total_gpus
    one_node = cluster.nodes == 1

    def held(role: Role, room: int) -> list[RoleConfig]:
        return _layouts(role, room, model, cluster, max_model_len, tokens)

    mixed, prefill, decode = held(Role.MIXED, total), held(Role.PREFILL, total), held(Role.DECODE, total)
    disaggregated = bool(prefill and decode) and _narrowest(prefill) + _narrowest(decode) <= total
    if not mixed and not disaggregated:  # nothing holds the model: the widest instance, so that validate names why
        mixed = [RoleConfig(role=Role.MIXED, data_parallel_size=_widths(cluster)[-1], enable_expert_parallel=True)]
    gpu = cluster.spec.name != "CPU"
    default = All2AllBackend.ALLGATHER_REDUCESCATTER
    ll, ht = All2AllBackend.DEEPEP_LOW_LATENCY, All2AllBackend.DEEPEP_HIGH_THROUGHPUT
    batch = sorted({max(1, seqs // 2), seqs, seqs * 2})
    modes = (["aggregated"] if mixed else []) + (["disaggregated"] if disaggregated else [])
    roles: dict[str, RoleSpace] = {}
    if mixed:
        knobs: dict[str, Any] = {"max_num_seqs": batch, "max_num_batched_tokens": [tokens]}
        if total == 1:
            knobs = one_gpu_knobs(model, cluster, budget)
        elif one_node:
            knobs["max_num_batched_tokens"] = _scaled(tokens, ONE_NODE_TOKENS)
        roles["mixed"] = _role_space(mixed, total, total if one_node else MAX_INSTANCES,
                                     all2all_backends=[default, ll] if gpu else [default], **knobs)
    if disaggregated:
        n_p, n_d = _narrowest(prefill), _narrowest(decode)
        prefill, decode = held(Role.PREFILL, total - n_d), held(Role.DECODE, total - n_p)
        roles["prefill"] = _role_space(prefill, total - n_d, MAX_INSTANCES, max_num_seqs=[seqs],
                                       max_num_batched_tokens=[tokens, tokens * 2],
                                       all2all_backends=[ht, default] if gpu else [default],
                                       dbo=[False, True] if gpu else [False])
        roles["decode"] = _role_space(decode, total - n_p, MAX_DECODE_INSTANCES, max_num_seqs=batch,
                                      max_num_batched_tokens=[tokens],
                                      all2all_backends=[ll, default] if gpu else [default])
    if one_node and not disaggregated:  # the roles P/D would search stay unused: nothing in them to spread
        roles.update(prefill=RoleSpace(expert_parallel=[False]), decode=RoleSpace(expert_parallel=[False]))
    searched = (mixed if "mixed" in roles else []) + (prefill + decode if disaggregated else [])
    ep_widths = {c.gpus_per_instance for c in searched if c.enable_expert_parallel}
    widest = max(ep_widths, default=0)
    redundant = [0, widest] if widest and all((model.n_routed_experts + widest) % w == 0 for w in ep_widths) else [0]
    return SearchSpace(modes=modes, **roles,
                       eplb=EPLBSpace(enabled=[False, True] if widest else [False], num_redundant_experts=redundant))
