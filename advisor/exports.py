"""Ready-to-run output of a chosen trial: a launch script (``vllm``) and the whole config with its
evidence (``json``). Command lines come from ``executors.render`` — the renderer real runs use.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from advisor.executor_factory import platform_for
from advisor.job import ExecutorKind, TuningJob
from executors import Endpoint, launch_script, place, serve_args, serve_command
from executors.render import DEFAULT_DP_RPC_PORT, router_args
from search_spaces import DeploymentConfig, Measurement

FORMATS = ("vllm", "json")

#: Where the presets' weights live on a model hub; an export names them, a real run needs a local path.
HUB_IDS = {"deepseek-v3": "deepseek-ai/DeepSeek-V3", "qwen3-moe-235b": "Qwen/Qwen3-235B-A22B"}


@dataclass(frozen=True)
class Evidence:
    """Why this configuration: which trial, what it measured (or the model predicted), on what."""

    study: str
    trial: int
    source: str  # measured | simulated
    engine_version: str
    hardware: str
    measurements: list[Measurement]

    def as_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "trial": self.trial,
            "source": self.source,
            "engine_version": self.engine_version,
            "hardware": self.hardware,
            "measurements": [m.model_dump(mode="json", exclude={"raw"}) for m in self.measurements],
        }

    def header(self) -> str:
        lines = [f"deploy-advisor export — study {self.study!r}, trial {self.trial} ({self.source})",
                 f"engine: {self.engine_version}; hardware: {self.hardware}"]
        for m in self.measurements:
            lines.append(
                f"concurrency {m.concurrency}: {_f(m.throughput_per_gpu)} tok/s/GPU, "
                f"P90 {_f(m.p90_tokens_per_s_per_user)} tok/s/user, P90 TTFT {_f(m.p90_ttft_ms)} ms"
            )
        lines.append(f"exported {datetime.now(UTC).isoformat(timespec='seconds')}")
        return "\n".join(lines)


def _f(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.1f}"


def model_name(job: TuningJob, override: str | None = None) -> str:
    if override:
        return override
    if job.model.path:
        return str(job.resolve_path(job.model.path))
    return HUB_IDS.get(job.model.preset or "", job.model.preset or "MODEL")


def render_vllm(job: TuningJob, cfg: DeploymentConfig, ev: Evidence, model: str) -> str:
    topo = place(cfg, job.cluster)
    return launch_script(
        topo, model=model, platform=platform_for(job), max_model_len=job.workload.max_model_len,
        served_model_name=job.executor.served_model_name, header=ev.header(),
    )


def render_json(job: TuningJob, cfg: DeploymentConfig, ev: Evidence, model: str) -> str:
    topo = place(cfg, job.cluster)
    platform = platform_for(job)
    pd = cfg.mode.value == "disaggregated"
    commands, urls = [], {}
    for k, inst in enumerate(topo.instances):
        head = Endpoint(host=f"${{NODE{inst.head.node}_IP}}", port=8100 + k, dp_rpc_port=DEFAULT_DP_RPC_PORT + k)
        urls[inst.name] = head.url
        for shard in inst.shards:
            args = serve_args(inst, shard, model=model, platform=platform, head=head, pd=pd,
                              max_model_len=job.workload.max_model_len,
                              served_model_name=job.executor.served_model_name)
            commands.append({"instance": inst.name, "role": inst.role.value, "node": shard.node,
                             "gpus": list(shard.gpus), "argv": serve_command(platform, args)})
    doc = {
        "description": cfg.describe(),
        "config": cfg.model_dump(mode="json"),
        "topology": topo.to_dict(),
        "model": model,
        "env": platform.env,
        "commands": commands,
        "router": [*platform.router_cmd, *router_args(topo, urls, host="127.0.0.1", port=8000, prometheus_port=9000)],
        "evidence": ev.as_dict(),
    }
    return json.dumps(doc, indent=2) + "\n"


RENDERERS = {"vllm": ("launch.sh", render_vllm), "json": ("deployment.json", render_json)}


def write_export(job: TuningJob, cfg: DeploymentConfig, ev: Evidence, fmt: str, out: Path,
                 model: str | None = None) -> tuple[Path, str]:
    """Write one format under ``out``; returns the path and its sha256."""
    filename, render = RENDERERS[fmt]
    text = render(job, cfg, ev, model_name(job, model))
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    path.write_text(text)
    if fmt == "vllm":
        path.chmod(0o755)
    return path, hashlib.sha256(text.encode()).hexdigest()


def evidence_source(job: TuningJob) -> str:
    return "simulated" if job.executor.kind is ExecutorKind.SIMULATED else "measured"
