"""The seed report's scenario, as the model's tests and the doc's figures both use it.

GB300 NVL72, DeepSeek-V3 shapes with NVFP4 weights, ISL 8192 / OSL 1024 ± 80%, prefix reuse 0.5, and the role
shapes the seed compares (DEP prefill with DeepEP high-throughput, Wide-EP decode with DeepEP low-latency).
``tests/test_perf_model.py`` checks the seed's lessons as directions on it; ``benchmarks/model_figures.py``
writes the numbers the doc quotes from it (``docs/performance-model.md`` §7).
"""

from __future__ import annotations

from typing import Any

from search_spaces import (
    All2AllBackend,
    ClusterSpec,
    DeploymentConfig,
    EPLBConfig,
    LengthDist,
    Mode,
    Role,
    RoleConfig,
    Workload,
    model_preset,
)

A = All2AllBackend
DSV3_FP4 = model_preset("deepseek-v3").model_copy(update={"weight_bytes": 0.5})
GB300 = ClusterSpec(gpu="GB300", nodes=18, gpus_per_node=4)
AGENTIC = Workload(isl=LengthDist(mean=8192, range_ratio=0.8), osl=LengthDist(mean=1024, range_ratio=0.8),
                   prefix_reuse=0.5, load_levels=[256, 1024, 4096])
#: The seed report's figures (/work/shared/seed/vllm-wide-ep-deepseek-report.txt): DEP2 and DEP4 prefill input
#: tok/s/GPU at concurrency 256, and the share of DEP4's throughput its replay put down to DP imbalance.
SEED_DEP2, SEED_DEP4, SEED_DP_LOSS = 64_400, 53_300, 0.136


def prefill(dp: int, instances: int = 1, **kw: Any) -> RoleConfig:
    """A DEP prefill role: ``instances`` × DEP``dp``, DeepEP high-throughput, 16K-token budget."""
    kw.setdefault("all2all_backend", A.DEEPEP_HIGH_THROUGHPUT)
    kw.setdefault("max_num_batched_tokens", 16384)
    return RoleConfig(role=Role.PREFILL, instances=instances, data_parallel_size=dp, enable_expert_parallel=True, **kw)


def decode(ep: int, instances: int = 1, eplb: int | None = None, **kw: Any) -> RoleConfig:
    """A Wide-EP decode role: ``instances`` × EP``ep``, DeepEP low-latency, EPLB with ``eplb`` redundant experts."""
    kw.setdefault("all2all_backend", A.DEEPEP_LOW_LATENCY)
    if eplb is not None:
        kw["eplb"] = EPLBConfig(enabled=True, num_redundant_experts=eplb)
    return RoleConfig(role=Role.DECODE, instances=instances, data_parallel_size=ep, enable_expert_parallel=True, **kw)


def pd(p: RoleConfig, d: RoleConfig) -> DeploymentConfig:
    return DeploymentConfig(mode=Mode.DISAGGREGATED, prefill=p, decode=d)
