"""The vocabulary of a deployment: candidates, the space they come from, their rules, model, cluster,
workload and measurements. Imports nothing else of ours."""

from search_spaces.cluster import ClusterSpec
from search_spaces.deployment import (
    All2AllBackend,
    DeploymentConfig,
    EPLBConfig,
    Mode,
    Role,
    RoleConfig,
    vllm_flag,
)
from search_spaces.knobs import KNOBS, Knob
from search_spaces.hardware import GPU_TABLE, GPUSpec, gpu_spec, matmul_tflops, vllm_default_batch
from search_spaces.metrics import (
    DEFAULT_OBJECTIVE,
    DEFAULT_PARETO_Y,
    LATENCIES,
    PERCENTILES,
    Metric,
    Scaling,
    all_metrics,
    higher_is_better,
    maximizable,
    metric,
    register,
    scaling,
    slo_metrics,
    unregister,
)
from search_spaces.model_profile import MODEL_PRESETS, AttentionKind, ModelProfile, model_preset
from search_spaces.packing import PackingError, Slice, pack
from search_spaces.rules import Violation, check, instance_sizes, kv_capacity_tokens, weight_bytes_per_gpu
from search_spaces.space import EPLBSpace, RoleSpace, SearchSpace, load_preset, preset_names
from search_spaces.states import IllegalTransition, TrialState, transition
from search_spaces.workload import (
    DEFAULT_ERROR_SLO,
    LEVEL_FLAGS,
    PREFIX_REUSE_LIMIT,
    SLO,
    Dataset,
    LengthDist,
    Measurement,
    Workload,
    slo_violation,
)

__all__ = [
    "All2AllBackend", "AttentionKind", "ClusterSpec", "Dataset", "DeploymentConfig", "EPLBConfig", "EPLBSpace",
    "GPUSpec", "GPU_TABLE", "KNOBS", "Knob", "IllegalTransition", "SLO", "TrialState", "slo_violation", "transition", "LengthDist", "MODEL_PRESETS", "Measurement", "Mode",
    "ModelProfile", "PackingError", "Role", "RoleConfig", "RoleSpace", "SearchSpace", "Slice",
    "Violation", "Workload", "DEFAULT_ERROR_SLO", "LEVEL_FLAGS", "PREFIX_REUSE_LIMIT", "vllm_default_batch", "check", "gpu_spec", "instance_sizes", "kv_capacity_tokens", "load_preset",
    "DEFAULT_OBJECTIVE", "DEFAULT_PARETO_Y", "LATENCIES", "Metric", "PERCENTILES", "Scaling", "all_metrics", "higher_is_better", "maximizable", "metric",
    "register", "scaling", "slo_metrics", "unregister",
    "matmul_tflops", "model_preset", "pack", "preset_names", "vllm_flag", "weight_bytes_per_gpu",
]
