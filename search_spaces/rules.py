"""Validity rules: each one says, in words, why a candidate cannot run — checked before any launch.

The rules mirror what vLLM itself refuses at start-up (so a trial never spends GPU time to learn it)
plus the arithmetic of the cluster and of GPU memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from search_spaces.cluster import ClusterSpec
from search_spaces.deployment import DeploymentConfig, RoleConfig
from search_spaces.model_profile import AttentionKind, ModelProfile
from search_spaces.packing import PackingError, pack

GIB = 1024**3
#: Memory vLLM keeps back besides weights and KV (CUDA context, NCCL buffers, graphs), per GPU.
RUNTIME_RESERVE_GIB = 3.0
#: Peak activation bytes per batched token per hidden unit (temporaries of attention + MoE dispatch).
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 24


@dataclass(frozen=True)
class Violation:
    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"


def weight_bytes_per_gpu(role: RoleConfig, model: ModelProfile) -> float:
    """Weights one GPU of ``role`` holds: non-expert weights split by TP, experts split by EP (plus replicas)."""
    wb = model.weight_bytes
    dense = model.non_expert_params * wb / role.tensor_parallel_size
    if role.enable_expert_parallel:
        slots = model.n_routed_experts + role.eplb.num_redundant_experts
        experts = model.num_moe_layers * model.expert_params * wb * slots / role.ep_size
    else:
        experts = model.routed_params * wb / role.tensor_parallel_size
    return dense + experts


def kv_bytes_per_token_per_gpu(role: RoleConfig, model: ModelProfile) -> float:
    """MLA's latent is replicated over TP ranks; GQA's KV heads are split over them (at least one each)."""
    if model.attention is AttentionKind.MLA:
        return model.kv_bytes_per_token
    share = max(1, model.num_kv_heads // role.tensor_parallel_size) / model.num_kv_heads
    return model.kv_bytes_per_token * share


def kv_capacity_tokens(
    role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, gpu_memory_utilization: float = 0.9
) -> float:
    """KV tokens one DP rank can hold after weights, activations and the runtime reserve (≤0: none)."""
    budget = cluster.spec.memory_gib * GIB * gpu_memory_utilization
    activations = role.max_num_batched_tokens * model.hidden_size * ACTIVATION_BYTES_PER_TOKEN_HIDDEN
    free = budget - weight_bytes_per_gpu(role, model) - activations - RUNTIME_RESERVE_GIB * GIB
    return free / kv_bytes_per_token_per_gpu(role, model)


def _role_rules(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, max_model_len: int) -> list[Violation]:
    out: list[Violation] = []
    name = role.role.value
    tp, ep = role.tensor_parallel_size, role.ep_size
    if tp > cluster.gpus_per_node:
        out.append(Violation("tp-within-node", f"{name}: TP{tp} is wider than a node of {cluster.gpus_per_node} GPUs"))
    if model.num_heads % tp:
        out.append(Violation("tp-divides-heads", f"{name}: TP{tp} does not divide {model.num_heads} attention heads"))
    if role.enable_expert_parallel:
        slots = model.n_routed_experts + role.eplb.num_redundant_experts
        if slots % ep:
            out.append(
                Violation(
                    "ep-divides-experts",
                    f"{name}: EP{ep} does not divide {model.n_routed_experts} routed + "
                    f"{role.eplb.num_redundant_experts} redundant experts",
                )
            )
    if role.eplb.enabled and (not role.enable_expert_parallel or ep < 2):
        out.append(Violation("eplb-needs-ep", f"{name}: EPLB needs expert parallelism over at least 2 GPUs"))
    if role.eplb.num_redundant_experts and not role.eplb.enabled:
        out.append(Violation("redundant-needs-eplb", f"{name}: redundant experts need EPLB enabled"))
    if role.enable_dbo and not role.all2all_backend.supports_dbo:
        out.append(
            Violation(
                "dbo-needs-deepep",
                f"{name}: DBO runs only with deepep_high_throughput, deepep_low_latency or nixl_ep, "
                f"not {role.all2all_backend.value}",
            )
        )
    if role.enable_dbo and not role.enable_expert_parallel:
        out.append(Violation("dbo-needs-ep", f"{name}: DBO needs expert parallelism"))
    weights = weight_bytes_per_gpu(role, model) / GIB
    cap = kv_capacity_tokens(role, model, cluster)
    if cap < max_model_len:
        out.append(
            Violation(
                "memory-fit",
                f"{name}: {weights:.1f} GiB of weights per GPU leave room for {max(cap, 0):.0f} KV tokens on a "
                f"{cluster.spec.memory_gib:g} GiB {cluster.gpu}; one {max_model_len}-token sequence needs more",
            )
        )
    return out


def check(cfg: DeploymentConfig, model: ModelProfile, cluster: ClusterSpec, max_model_len: int) -> list[Violation]:
    """Every rule ``cfg`` breaks on this model and cluster; empty when it may be launched."""
    out: list[Violation] = []
    if cfg.total_gpus > cluster.total_gpus:
        out.append(Violation("gpus-fit", f"uses {cfg.total_gpus} GPUs; the cluster has {cluster.total_gpus}"))
    for role in cfg.roles:
        out.extend(_role_rules(role, model, cluster, max_model_len))
    if cfg.speculative_mtp_tokens and not model.mtp_layers:
        out.append(Violation("mtp-needs-layers", f"{model.name} has no MTP layers for speculative decoding"))
    if cfg.total_gpus <= cluster.total_gpus:
        try:
            pack(instance_sizes(cfg), cluster)
        except PackingError as e:
            out.append(Violation("placement", str(e)))
    return out


def instance_sizes(cfg: DeploymentConfig) -> list[int]:
    """GPU counts of every instance, prefill first then decode — the order placement uses."""
    return [r.gpus_per_instance for r in cfg.roles for _ in range(r.instances)]
