"""Kubernetes export: the objects of ``advisor.exports.k8s_objects`` (one LeaderWorkerSet per role, a Service
per role, the vllm-router in front) written as YAML files, with a README that says what is there, what the
cluster needs and how to apply it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from advisor.exports.k8s_objects import (
    ANNOTATION_PREFIX,
    HF_TOKEN_KEY,
    RDMA_RESOURCE,
    ROUTER_METRICS_PORT,
    ROUTER_PORT,
    evidence_annotations,
    k8s_platform,
    leader_worker_set,
    lws_name,
    role_service,
    router_objects,
    secret_key,
    secret_refs,
    slug,
)
from search_spaces import DeploymentConfig

if TYPE_CHECKING:
    from advisor.exports import Evidence, ExportOptions
    from advisor.job import TuningJob
    from executors import Topology


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line strings (the scripts), no anchors/aliases for repeated parts."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(doc: dict, header: str) -> str:
    comment = "".join(f"# {h}\n" if h else "#\n" for h in header.splitlines())
    return comment + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)


def render(job: TuningJob, topo: Topology, ev: Evidence, model: str, options: ExportOptions) -> dict[str, str]:
    """The ``k8s`` folder: ``<role>-leaderworkerset.yaml`` and ``<role>-service.yaml`` per role,
    ``router-deployment.yaml``, ``router-service.yaml`` and ``README.md``."""
    cfg = topo.config
    platform = k8s_platform(job)
    prefix = slug(options.name or ev.study)
    notes = evidence_annotations(cfg, ev)
    header = ev.header()
    files: dict[str, str] = {}
    for r in cfg.roles:
        lws = leader_worker_set(job, cfg, topo, r.role, prefix=prefix, model=model, platform=platform,
                                options=options, annotations=notes)
        files[f"{r.role.value}-leaderworkerset.yaml"] = to_yaml(lws, header)
        files[f"{r.role.value}-service.yaml"] = to_yaml(role_service(prefix, r.role, notes), header)
    deployment, service = router_objects(topo, prefix=prefix, platform=platform, options=options, annotations=notes)
    files["router-deployment.yaml"] = to_yaml(deployment, header)
    files["router-service.yaml"] = to_yaml(service, header)
    files["README.md"] = readme(job, cfg, topo, ev, prefix=prefix, model=model, options=options, files=sorted(files))
    return files


def readme(job: TuningJob, cfg: DeploymentConfig, topo: Topology, ev: Evidence, *, prefix: str, model: str,
           options: ExportOptions, files: list[str]) -> str:
    rows = []
    for r in cfg.roles:
        inst = topo.of_role(r.role)[0]
        rdma = job.cluster.rdma and inst.multi_node
        rows.append(f"| {r.role.value} | `{lws_name(prefix, r.role)}` | {r.instances} | {len(inst.shards)} | "
                    f"{len(inst.head.gpus)} | {'yes' if rdma else 'no'} | {r.describe()} |")
    m_rows = [f"| {m.concurrency} | {_n(m.throughput_per_gpu)} | {_n(m.p90_tokens_per_s_per_user)} | "
              f"{_n(m.p90_ttft_ms)} | {_n(m.p90_tpot_ms)} |" for m in ev.measurements]
    unit = "CPU cores" if k8s_platform(job).cpu_per_gpu_slot else "GPUs (`nvidia.com/gpu`)"
    router_image = options.router_image or options.image
    gpn = job.cluster.gpus_per_node
    multi_nvlink = job.cluster.spec.scaleup_domain > gpn and any(r.gpus_per_instance > gpn for r in cfg.roles)
    lines = [
        f"# Kubernetes manifests: {cfg.describe()}",
        "",
        f"Exported by deploy-advisor from study `{ev.study}`, trial {ev.trial} ({ev.source}); engine "
        f"{ev.engine_version}; hardware {ev.hardware}. The same numbers are in each object's "
        f"`{ANNOTATION_PREFIX}/*` annotations.",
        "",
        "| concurrency | tok/s/GPU | P90 tok/s/user | P90 TTFT ms | P90 TPOT ms |",
        "|---|---|---|---|---|",
        *(m_rows or ["| – | n/a | n/a | n/a | n/a |"]),
        "",
        "## What is here",
        "",
        "| role | LeaderWorkerSet | instances (replicas) | nodes per instance (group size) | "
        f"{unit} per pod | RDMA | vLLM settings |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        *(f"- `{f}`" for f in files),
        "",
        f"Model: `{model}`. vLLM image: `{options.image}`. Router image: `{router_image}` (must have `vllm-router` "
        "on PATH). The router balances over each instance's leader (`<lws>-<group>.<lws>:8000`); clients talk to "
        f"Service `{prefix}-router` on port {ROUTER_PORT} (Prometheus metrics on {ROUTER_METRICS_PORT}).",
        "",
        "## Prerequisites",
        "",
        "- The LeaderWorkerSet controller (kubernetes-sigs/lws, API `leaderworkerset.x-k8s.io/v1`) installed in the "
        "cluster: `kubectl get crd leaderworkersets.leaderworkerset.x-k8s.io` must find it.",
        "- GPU nodes advertising `nvidia.com/gpu` (NVIDIA device plugin or GPU Operator); where a row above says "
        f"RDMA, an RDMA device plugin advertising `{RDMA_RESOURCE}`.",
        *secret_lines(k8s_platform(job).env, options.hf_token_secret),
        "- An image with `vllm-router` for the router, e.g. `FROM " + options.image + "` plus "
        "`RUN pip install vllm-router==0.1.17`.",
        "- Where the model is a path, it must exist at that path inside the pods (mount it).",
        *(["- This configuration was tuned on the CPU build of vLLM (`--load-format dummy`): give an image of "
           "that build (the default image is the GPU one)."] if k8s_platform(job).cpu_per_gpu_slot else []),
        *(["- The instances' nodes share one NVLink domain: pods need multi-node NVLink (IMEX) set up, e.g. "
           "with NVIDIA's DRA driver for GPUs (a ComputeDomain)."]
          if multi_nvlink else []),
        "",
        "## Apply",
        "",
        "```bash",
        "kubectl apply -n NAMESPACE -f .        # this folder",
        f"kubectl get leaderworkerset -n NAMESPACE -l app.kubernetes.io/instance={prefix}",
        f"kubectl port-forward -n NAMESPACE svc/{prefix}-router {ROUTER_PORT}:{ROUTER_PORT}",
        f"curl localhost:{ROUTER_PORT}/v1/completions -H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"{job.executor.served_model_name or model}\", \"prompt\": \"Hello\", \"max_tokens\": 16}}'",
        "kubectl delete -n NAMESPACE -f .       # tear down",
        "```",
        "",
        "Each pod checks `LWS_GROUP_SIZE` before it starts vLLM; the leader runs `vllm serve` with the head's "
        "data-parallel flags and `--data-parallel-address $(LWS_LEADER_ADDRESS)`, every worker runs it "
        "`--headless` with `--data-parallel-start-rank $((LWS_WORKER_INDEX * <ranks per node>))`.",
        "",
    ]
    return "\n".join(lines)


def secret_lines(env: dict[str, str], secret: str) -> list[str]:
    """The README's Secret step: HF_TOKEN (optional unless the job names it) and every ``${NAME}`` of the
    job's environment, which the pods read from the Secret instead of a value written here."""
    refs = secret_refs(env)
    others = [r for r in refs if r != "HF_TOKEN"]
    need = "required" if "HF_TOKEN" in refs else "optional for public models"
    what = f"your Hugging Face token, read as `HF_TOKEN` ({need})"
    if others:
        what += f", and {', '.join(f'`{r}`' for r in others)} (the job's `executor.env` reads them at run time)"
    literals = "".join(f" --from-literal={secret_key(r)}=..." for r in others)
    return [f"- A Secret `{secret}` with {what}: "
            f"`kubectl create secret generic {secret} --from-literal={HF_TOKEN_KEY}=hf_...{literals}`"]


def _n(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.1f}"
