"""Validity rules: each one says, in words, why a candidate cannot run — checked before any launch.

The rules mirror what vLLM itself refuses at start-up (so a trial never spends GPU time to learn it)
plus the arithmetic of the cluster and of GPU memory. ``docs/parallelism.md`` lists every rule per
parallelism (TP, DEP/EP, TP × DP with TP experts) with the vLLM source it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from search_spaces.cluster import ClusterSpec
from search_spaces.deployment import DeploymentConfig, RoleConfig
from search_spaces.hardware import GPU_TABLE, GPUSpec
from search_spaces.knobs import KNOBS, KV_DTYPE_BYTES
from search_spaces.model_profile import AttentionKind, ModelProfile, WeightFormat
from search_spaces.packing import PackingError, pack

GIB = 1024**3
#: Memory vLLM keeps back besides weights and KV (CUDA context, NCCL buffers, graphs), per GPU.
RUNTIME_RESERVE_GIB = 3.0
#: Peak activation bytes per batched token per hidden unit (temporaries of attention + MoE dispatch).
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 24
#: FP8 block-quantisation tile of 1-byte checkpoints (``weight_block_size: [128, 128]`` in DeepSeek-V3's and
#: Qwen3-*-FP8's ``quantization_config``). vLLM's ``validate_fp8_block_shape_moe``
#: (vllm/model_executor/layers/quantization/utils/fp8_utils.py) refuses an expert shard whose
#: ``intermediate_size_per_partition`` is not a multiple of block_n (and, with TP > 1, of block_k).
#: Assumption: every profile with 1-byte experts is block-quantised this way (the profile does not say).
FP8_BLOCK = 128


@dataclass(frozen=True)
class Violation:
    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"


def expert_shards(role: RoleConfig) -> int:
    """GPUs each routed expert is tensor-sharded over: ``tp × dp`` without expert parallelism, else 1.

    vLLM's ``FusedMoEParallelConfig.make`` (vllm/model_executor/layers/fused_moe/config.py) flattens the MoE
    layer's TP size to ``tp × dp`` when ``--enable-expert-parallel`` is off: every expert is split over all
    ranks of the instance ("DP attention with TP experts"); with EP on, its TP size is 1 and whole experts
    are spread over the ``tp × dp`` EP ranks."""
    return 1 if role.enable_expert_parallel else role.gpus_per_instance


def expert_shard_width(role: RoleConfig, model: ModelProfile) -> float:
    """The per-GPU slice of ``moe_intermediate_size`` (vLLM's ``intermediate_size_per_partition``)."""
    return model.moe_intermediate_size / expert_shards(role)


def weight_bytes_per_gpu(role: RoleConfig, model: ModelProfile) -> float:
    """Weights one GPU of ``role`` holds: non-expert weights split by TP (attention TP, within a DP rank); the
    routed experts spread over all ``tp × dp`` GPUs of the instance either way — whole experts (plus EPLB
    replicas) with EP, a ``1/(tp·dp)`` slice of every expert without (TP experts)."""
    wb, we = model.weight_bytes, model.expert_bytes
    dense = model.non_expert_params * wb / role.tensor_parallel_size
    if role.enable_expert_parallel:
        slots = model.n_routed_experts + role.eplb.num_redundant_experts
        experts = model.num_moe_layers * model.expert_params * we * slots / role.ep_size
    else:
        experts = model.routed_params * we / expert_shards(role)
    return dense + experts


def precision_error(model: ModelProfile, spec: GPUSpec) -> str | None:
    """Why ``model``'s weights cannot run on ``spec`` (one line), or None. NVFP4 is W4A4 on FP4 tensor cores, which
    Hopper has not (vLLM refuses ModelOpt NVFP4 checkpoints below compute capability 10.0); MXFP4 runs there
    weight-only (Marlin / Triton W4A16), so it is allowed and costed so (``hardware.format_tflops``)."""
    if spec.fp4_tflops is None and WeightFormat.NVFP4 in model.fp4_formats:
        fp4 = ", ".join(k for k, g in GPU_TABLE.items() if g.fp4_tflops)
        return (f"{model.name} has NVFP4 weights (model.weight_bytes / expert_weight_bytes 0.5), which need FP4 "
                f"tensor cores; {spec.name} has none. Allowed on {spec.name}: bf16 (2), fp8 (1) or mxfp4 experts "
                f"(expert_format: mxfp4, weight-only); NVFP4 runs on {fp4}")
    return None


def kv_bytes_per_token_per_gpu(role: RoleConfig, model: ModelProfile) -> float:
    """MLA's latent is replicated over TP ranks; GQA's KV heads are split over them (at least one each). A
    ``--kv-cache-dtype`` other than ``auto`` stores its own width per element instead of the model's."""
    if role.kv_cache_dtype != "auto":
        return _kv_bytes_per_token_per_gpu(role, model) * KV_DTYPE_BYTES[role.kv_cache_dtype] / model.kv_bytes
    return _kv_bytes_per_token_per_gpu(role, model)


def _kv_share(role: RoleConfig, model: ModelProfile) -> float:
    """The share of a layer's KV one TP rank holds: MLA's latent and V4's single K=V head are replicated over TP
    ranks; GQA's KV heads are split over them (at least one each)."""
    if model.attention in (AttentionKind.MLA, AttentionKind.CSA):
        return 1.0
    return max(1, model.num_kv_heads // role.tensor_parallel_size) / model.num_kv_heads


def _kv_bytes_per_token_per_gpu(role: RoleConfig, model: ModelProfile) -> float:
    if model.attention is AttentionKind.MLA:
        return model.kv_bytes_per_token
    return model.kv_bytes_per_token * _kv_share(role, model)


def state_bytes_per_seq_per_gpu(role: RoleConfig, model: ModelProfile) -> float:
    """Cache bytes one sequence holds on one GPU whatever its length: its sliding windows (split over TP as its KV
    heads are; ``--kv-cache-dtype`` applies) and its linear layers' recurrent states (value heads split over TP)."""
    state = model.state_bytes_per_seq
    if not state:
        return 0.0
    linear = model.num_linear_layers * model.linear_state_bytes
    heads = model.linear_num_value_heads
    lin_share = max(1, heads // role.tensor_parallel_size) / heads if heads else 1.0
    window = (state - linear) * _kv_share(role, model)
    if role.kv_cache_dtype != "auto":
        window *= KV_DTYPE_BYTES[role.kv_cache_dtype] / model.kv_bytes
    return window + linear * lin_share


def kv_capacity_tokens(
    role: RoleConfig, model: ModelProfile, cluster: ClusterSpec, gpu_memory_utilization: float = 0.9
) -> float:
    """KV tokens one DP rank can hold after weights, activations and the runtime reserve (≤0: none). Models with
    per-sequence state (sliding windows, linear layers) first set aside ``max_num_seqs`` sequences' states, at most
    half of what is free: vLLM's hybrid cache holds both in one pool and runs as many sequences as their states and
    KV fit, so the tokens left are the pool less the states of the sequences that run."""
    budget = cluster.spec.memory_gib * GIB * gpu_memory_utilization
    activations = role.max_num_batched_tokens * model.hidden_size * ACTIVATION_BYTES_PER_TOKEN_HIDDEN
    free = budget - weight_bytes_per_gpu(role, model) - activations - RUNTIME_RESERVE_GIB * GIB
    state = state_bytes_per_seq_per_gpu(role, model)
    if state and free > 0:
        free -= min(role.max_num_seqs * state, free / 2)
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
    shards = expert_shards(role)
    if shards > 1 and model.moe_intermediate_size % shards:
        # vLLM: FusedMoEConfig.__post_init__ asserts intermediate_size % tp_size == 0 (tp_size = tp × dp here)
        out.append(
            Violation(
                "tp-experts-divide-intermediate",
                f"{name}: without expert parallelism each expert is sharded over TP{tp} × DP{role.data_parallel_size}"
                f" = {shards} GPUs, which does not divide moe_intermediate_size {model.moe_intermediate_size}",
            )
        )
    elif shards > 1 and model.expert_bytes == 1.0 and (model.moe_intermediate_size // shards) % FP8_BLOCK:
        out.append(
            Violation(
                "tp-experts-fp8-block",
                f"{name}: an expert sharded over {shards} GPUs keeps {model.moe_intermediate_size // shards} of "
                f"moe_intermediate_size {model.moe_intermediate_size}, not a multiple of the {FP8_BLOCK}-wide FP8 "
                f"quantisation block vLLM requires (use fewer GPUs per instance or expert parallelism)",
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
    if cluster.spec.name == "CPU":
        out += [Violation(f"{k.flag.removeprefix('--')}-gpu-only",
                          f"{name}: {k.flag} {getattr(role, k.name)} runs only on GPUs")
                for k in KNOBS if k.gpu_only and getattr(role, k.name) != k.default]
    if role.kv_cache_dtype != "auto" and model.attention in (AttentionKind.MLA, AttentionKind.CSA):
        out.append(Violation("kv-cache-dtype-mla", f"{name}: --kv-cache-dtype {role.kv_cache_dtype} is not searched "
                             f"with MLA attention (vLLM's MLA backends take their own FP8 KV formats)"))
    refused = precision_error(model, cluster.spec)
    if refused:
        out.append(Violation("fp4-needs-blackwell", f"{name}: {refused}"))
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
    for role in cfg.roles:
        out.extend(_role_rules(role, model, cluster, max_model_len))
    if cfg.speculative_mtp_tokens and not model.mtp_layers:
        out.append(Violation("mtp-needs-layers", f"{model.name} has no MTP layers for speculative decoding"))
    out.extend(deployment_violations([(r.instances, r.gpus_per_instance) for r in cfg.roles], cluster))
    return out


def instance_sizes(cfg: DeploymentConfig) -> list[int]:
    """GPU counts of every instance, prefill first then decode — the order placement uses."""
    return [r.gpus_per_instance for r in cfg.roles for _ in range(r.instances)]


def role_violations(role: RoleConfig, model: ModelProfile, cluster: ClusterSpec,
                    max_model_len: int) -> list[Violation]:
    """The rules one role breaks on its own; ``check`` adds those of the whole deployment (GPUs, placement),
    which depend only on each role's instances × GPUs (``search_spaces.valid_space`` relies on that)."""
    return _role_rules(role, model, cluster, max_model_len)


def deployment_violations(footprints: list[tuple[int, int]], cluster: ClusterSpec) -> list[Violation]:
    """The rules of the whole deployment, from its roles' (instances, GPUs per instance) alone, prefill first.
    The total is checked before any per-instance list is built (a fuzzed ``instances: 2**64`` must not)."""
    total = sum(n * g for n, g in footprints)
    if total > cluster.total_gpus:
        return [Violation("gpus-fit", f"uses {total} GPUs; the cluster has {cluster.total_gpus}")]
    try:
        pack([g for n, g in footprints for _ in range(n)], cluster)
    except PackingError as e:
        return [Violation("placement", str(e))]
    return []
