"""The baseline every real study measures first: vLLM's defaults on the deployment a user would start with.

A tuned deployment's number means little without it: the 1 × H200 study found its best at 1.02× vLLM's
defaults, which is a tie, not a win. By default the baseline is one aggregated instance, data parallel with
expert parallelism over the fewest GPUs — a power of two — that hold the model under the
project's validity rules, with the batch sizes ``vllm serve`` picks by itself on the GPU kind
(``search_spaces.vllm_default_batch``). ``baseline.config`` names another one.
"""

from __future__ import annotations

from advisor.job import TuningJob
from search_spaces import DeploymentConfig, Mode, Role, RoleConfig, check, gpu_spec, vllm_default_batch


def baseline_config(job: TuningJob) -> DeploymentConfig | None:
    """The job's baseline deployment (None when nothing at vLLM's defaults fits the cluster)."""
    if job.baseline.config is not None:
        return job.baseline.config
    model = job.model_profile()
    seqs, tokens = vllm_default_batch(gpu_spec(job.cluster.gpu))
    n = 1
    while n <= job.cluster.total_gpus:
        role = RoleConfig(role=Role.MIXED, data_parallel_size=n, enable_expert_parallel=n > 1,
                          max_num_seqs=seqs, max_num_batched_tokens=tokens)
        cfg = DeploymentConfig(mode=Mode.AGGREGATED, decode=role)
        if not check(cfg, model, job.cluster, job.workload.max_model_len):
            return cfg
        n *= 2
    return None
