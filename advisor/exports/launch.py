"""The two single-file formats: ``vllm`` (a launch script: one ``vllm serve`` per node shard and the router) and
``json`` (the configuration, its placement, every shard's flags and argv, and the evidence), both from the launch
plan ``executors.vllm.render`` builds, the one real runs start from."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from advisor.executor_factory import platform_for
from executors import launch_script
from executors.vllm.render import launch_plan

if TYPE_CHECKING:
    from advisor.exports import Evidence
    from advisor.job import TuningJob
    from executors import Topology


def render_vllm(job: TuningJob, topo: Topology, ev: Evidence, model: str) -> str:
    return launch_script(
        topo, model=model, platform=platform_for(job), max_model_len=job.workload.max_model_len,
        served_model_name=job.executor.served_model_name, header=ev.header(),
    )


def render_json(job: TuningJob, topo: Topology, ev: Evidence, model: str) -> str:
    cfg = topo.config
    platform = platform_for(job)
    plan = launch_plan(topo, model=model, platform=platform, max_model_len=job.workload.max_model_len,
                       served_model_name=job.executor.served_model_name)
    doc = {
        "description": cfg.describe(),
        "config": cfg.model_dump(mode="json"),
        "topology": topo.to_dict(),
        "model": model,
        "env": platform.env,  # ${NAME}: read from the environment where it runs, never a value here
        "commands": [{"instance": c.instance.name, "role": c.instance.role.value, "node": c.shard.node,
                      "gpus": list(c.shard.gpus), "env": {**c.slot_env, **c.node_env}, "flags": c.flags,
                      "argv": c.argv}
                     for c in plan.commands],
        "router": plan.router_argv,
        "evidence": ev.as_dict(),
    }
    return json.dumps(doc, indent=2) + "\n"
