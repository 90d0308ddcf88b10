"""The space a job gets when it names none: derived from the model and the cluster, so that it fits.

A user who brings a model the presets do not know should not have to know which instance sizes hold its
weights before the first study. The derivation keeps what an operator would try first:

* **instance widths** that hold the weights and at least ``KV_SEQUENCES`` full-length sequences of KV cache
  per DP rank (``kv_capacity_tokens``), the narrowest ``WIDTHS`` of them: powers of two within a node, whole
  nodes beyond it (how ``pack`` places instances); expert parallelism where the width divides the routed
  experts, tensor-parallel experts (no EP) otherwise — both where both are possible;
* a **tensor-parallel instance** of one node (TP = GPUs per node, the low-latency decode shape) where it holds
  the model and divides the attention heads;
* **instances** 1 up to as many of the narrowest width as the cluster holds (at most 4); **both modes** where
  two instances fit (P/D needs a prefill and a decode instance);
* **batch sizes** around vLLM's own defaults for the GPU kind (``vllm_default_batch``): half, the default and
  double the default for ``max_num_seqs`` of mixed and decode instances, the default and double for the
  prefill token budget;
* **all-to-all kernels**: vLLM's default, plus DeepEP's (low-latency for decode and mixed, high-throughput
  with and without DBO for prefill) on GPUs; **EPLB** off and on, with 0 redundant experts or as many as the
  widest EP group (which keeps every width dividing the expert slots).

Anything the rules reject is left to ``ValidSpace`` (it costs no trial); ``advisor validate --show`` prints
the derived space, and the job stores it, so a continued study searches the same one.
"""

from __future__ import annotations

from search_spaces.cluster import ClusterSpec
from search_spaces.deployment import All2AllBackend, Role, RoleConfig
from search_spaces.hardware import vllm_default_batch
from search_spaces.model_profile import ModelProfile
from search_spaces.rules import kv_capacity_tokens, role_violations
from search_spaces.space import EPLBSpace, RoleSpace, SearchSpace

#: A width must hold this many full-length sequences of KV per DP rank to be worth searching.
KV_SEQUENCES = 4
#: How many widths (the narrowest that fit) the derived space keeps.
WIDTHS = 3
MAX_INSTANCES = 4

_HARD = {"tp-within-node", "tp-divides-heads", "ep-divides-experts", "memory-fit"}


def _widths(cluster: ClusterSpec) -> list[int]:
    per_node, total = cluster.gpus_per_node, cluster.total_gpus
    inside = [w for w in (1, 2, 4, 8, 16, 32, 64, 72) if w <= per_node and per_node % w == 0]
    across = [per_node * k for k in range(2, cluster.nodes + 1)]
    return sorted(set(inside + across + ([per_node] if per_node <= total else []))) or [1]


def _holds(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, max_model_len: int) -> bool:
    broken = {v.rule for v in role_violations(role, model, cluster, max_model_len)} & _HARD
    return not broken and kv_capacity_tokens(role, model, cluster) >= KV_SEQUENCES * max_model_len


def default_space(model: ModelProfile, cluster: ClusterSpec, max_model_len: int) -> SearchSpace:
    """A space of deployments that hold ``model`` on ``cluster`` (see the module's docstring)."""
    seqs, tokens = vllm_default_batch(cluster.spec)
    dp_sizes: list[int] = []
    ep_choices: set[bool] = set()
    for w in _widths(cluster):
        if len(dp_sizes) >= WIDTHS:
            break
        fits = [ep for ep in (True, False) if (w > 1 or not ep) and _holds(
            RoleConfig(role=Role.MIXED, data_parallel_size=w, enable_expert_parallel=ep, max_num_batched_tokens=tokens),
            model, cluster, max_model_len)]
        if fits:
            dp_sizes.append(w)
            ep_choices.update(fits if w > 1 else ())
    holding = list(dp_sizes)  # instance sizes that hold the model
    tp_sizes = [1]
    node_tp = RoleConfig(role=Role.MIXED, tensor_parallel_size=cluster.gpus_per_node, max_num_batched_tokens=tokens)
    if cluster.gpus_per_node > 1 and _holds(node_tp, model, cluster, max_model_len):
        tp_sizes.append(cluster.gpus_per_node)
        holding.append(cluster.gpus_per_node)
        dp_sizes = sorted({1, *dp_sizes})
    if not holding:  # nothing holds the model: the widest instance, so that validate names the rule
        dp_sizes = holding = [_widths(cluster)[-1]]
    narrow = min(holding)
    instances = list(range(1, min(MAX_INSTANCES, max(1, cluster.total_gpus // narrow)) + 1))
    modes = ["aggregated"] + (["disaggregated"] if cluster.total_gpus >= 2 * narrow else [])
    gpu = cluster.spec.name != "CPU"
    default = All2AllBackend.ALLGATHER_REDUCESCATTER
    ll, ht = All2AllBackend.DEEPEP_LOW_LATENCY, All2AllBackend.DEEPEP_HIGH_THROUGHPUT
    common = dict(dp_sizes=dp_sizes, tp_sizes=tp_sizes, expert_parallel=sorted(ep_choices, reverse=True) or [True])
    widest_ep = max([d for d in dp_sizes if d > 1] or [0]) if True in ep_choices else 0
    redundant = [0, widest_ep] if widest_ep and all((model.n_routed_experts + widest_ep) % d == 0
                                                     for d in dp_sizes if d > 1) else [0]
    return SearchSpace(
        modes=modes,
        mixed=RoleSpace(instances=instances, **common, max_num_seqs=sorted({max(1, seqs // 2), seqs, seqs * 2}),
                        max_num_batched_tokens=[tokens], all2all_backends=[default, ll] if gpu else [default]),
        prefill=RoleSpace(instances=instances, **common, max_num_seqs=[seqs],
                          max_num_batched_tokens=[tokens, tokens * 2],
                          all2all_backends=[ht, default] if gpu else [default], dbo=[False, True] if gpu else [False]),
        decode=RoleSpace(instances=instances[:2], **common, max_num_seqs=sorted({max(1, seqs // 2), seqs, seqs * 2}),
                         max_num_batched_tokens=[tokens], all2all_backends=[ll, default] if gpu else [default]),
        eplb=EPLBSpace(enabled=[False, True] if widest_ep else [False], num_redundant_experts=redundant),
    )
