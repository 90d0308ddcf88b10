"""The knee of vLLM's defaults for a job's model at full depth, predicted before it is measured: from the stored
profile of the job's shape (``advisor.profile.resolve_params``) and from the GPU kind's defaults, each level predicted
as the benchmark sends it (where a real knee search starts) and in the steady view.

    python3 research/gpu/dsv2lite_predict.py JOB.yaml OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import db
from advisor.job import load_job
from advisor.profile import resolve_params
from executors import place
from executors.measuring.loop import MeasurePlan
from executors.perf import default_params
from executors.perf.params import reference_params
from executors.simulated.executor import levels_as_sent, predicted_knee
from search_spaces import DeploymentConfig, Mode, Role, RoleConfig, gpu_spec, vllm_default_batch


def main(job_path: str, out: str) -> None:
    job = load_job(job_path)
    database = db.connect(job.storage)
    resolved = resolve_params(job, database)
    seqs, tokens = vllm_default_batch(gpu_spec(job.cluster.gpu))
    cfg = DeploymentConfig(mode=Mode.AGGREGATED, decode=RoleConfig(role=Role.MIXED, data_parallel_size=1,
                                                                    max_num_seqs=seqs, max_num_batched_tokens=tokens))
    topo, model, plan = place(cfg, job.cluster), job.model_profile(), MeasurePlan(tuple(job.slos))
    doc = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": job.cluster.gpu,
           "layers": model.num_layers, "config": {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}}
    sets = [("profile", resolved.params), ("defaults", default_params(job.cluster.gpu))]
    reference = reference_params(job.cluster.gpu)  # the published-rows calibration, where it covers the kind
    if reference is not None:
        sets.append(("reference", reference))
    for name, params in sets:
        for as_sent in (True, False):
            knee = predicted_knee(topo, model, job.workload, plan, params, as_sent=as_sent)
            lv = levels_as_sent(topo, model, job.workload, params, [knee])[0] if knee else None
            doc[f"{name} | {'as sent' if as_sent else 'steady'}"] = {
                "knee": knee, "throughput_per_gpu": lv.throughput_per_gpu if lv else None,
                "p90_ttft_ms": lv.p90_ttft_ms if lv else None,
                "p90_tokens_per_s_per_user": lv.p90_tokens_per_s_per_user if lv else None}
    doc["profile_source"] = resolved.source
    doc["params"] = resolved.params.model_dump()
    Path(out).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "params"}, indent=2, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:3])
