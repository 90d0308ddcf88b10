"""The Kubernetes export's objects: one LeaderWorkerSet per role, a Service per role, and the vllm-router in
front (``advisor.exports.k8s`` writes them as YAML with a README).

One instance of a role is one LeaderWorkerSet *group*: a leader pod on the instance's first node and one
worker pod on each further node, so ``size`` = nodes of the instance and ``replicas`` = instances of the role
(``leaderworkerset.x-k8s.io/v1``; the LWS controller must be installed). Each pod asks for the GPUs of its
node shard (``nvidia.com/gpu``) and, where the cluster has RDMA and the instance spans nodes, one RDMA device
(``rdma/ib``).

Every ``vllm serve`` line is written from the ``{flag: value}`` mapping ``executors.vllm.render.serve_flags`` builds
— the one real runs launch from — for the instance's head shard (the leader) and its second shard (every
worker), with two values put in: the leader's address is ``$(LWS_LEADER_ADDRESS)`` (the kubelet expands it:
the LWS controller puts it in each container's environment) and the worker's start rank is
``$((LWS_WORKER_INDEX * LOCAL))`` (the shell computes it per pod), where LOCAL is the data-parallel
size-local of a node shard. Each pod checks
``LWS_GROUP_SIZE`` against the instance's node count before it starts vLLM.

The router (a Deployment) reaches each instance at its leader's stable name ``<lws>-<group>.<lws>`` (the
headless Service the LWS controller creates), one URL per instance as ``render.router_args`` wants, so the
router's own policy balances over instances; the per-role Services select the leaders of a role for clients
and monitoring. Secrets are references only: HF_TOKEN comes from a Secret (``valueFrom.secretKeyRef``).

Every container gets the job's environment (``executor.env`` over the platform's, ``env_entries``): plain
values as values, ``${NAME}`` values from the same Secret (key NAME; HF_TOKEN's key is ``token``). With a
NIXL P/D deployment each vLLM pod advertises its own IP as the NIXL side channel (``status.podIP``).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import TYPE_CHECKING, Any

from advisor.executor_factory import platform_for
from executors import Endpoint, Instance, Platform, Topology, serve_command
from executors.vllm.render import (
    DEFAULT_DP_RPC_PORT,
    DP_START_RANK,
    ENV_REF,
    Flags,
    router_args,
    serve_flags,
    to_argv,
    uses_nixl,
)
from search_spaces import DeploymentConfig, Role

if TYPE_CHECKING:
    from advisor.exports import Evidence, ExportOptions
    from advisor.job import TuningJob

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
#: Labels the LWS controller puts on every pod of a LeaderWorkerSet (the leader has worker index 0).
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
#: Environment variables the LWS controller puts in every container of a group.
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
GROUP_SIZE = "$(LWS_GROUP_SIZE)"
WORKER_INDEX_VAR = "LWS_WORKER_INDEX"

API_PORT = 8000  # every vLLM API server listens here inside its pod
ROUTER_PORT = 8000
ROUTER_METRICS_PORT = 9000
GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/ib"  # the name the common RDMA device plugins advertise
ANNOTATION_PREFIX = "deploy-advisor"

#: Waits until every URL answers (the router's init container; the vLLM image has python3).
_WAIT_PY = (
    "import sys, time, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    while True:\n"
    "        try:\n"
    "            urllib.request.urlopen(url, timeout=5)\n"
    "            break\n"
    "        except Exception:\n"
    "            print('waiting for', url, flush=True)\n"
    "            time.sleep(5)\n"
)


# ------------------------------------------------------------------------------------------ names
def slug(text: str, limit: int = 30) -> str:
    """A DNS-1035 label prefix: lowercase letters, digits and '-', starting with a letter."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].rstrip("-")
    return s if s[:1].isalpha() else f"x-{s}".rstrip("-")


def lws_name(prefix: str, role: Role) -> str:
    return f"{prefix}-{role.value}"


def leader_host(prefix: str, inst: Instance) -> str:
    """The leader pod of group ``inst.index``: ``<lws>-<group>`` under the LWS's headless Service ``<lws>``."""
    name = lws_name(prefix, inst.role)
    return f"{name}-{inst.index}.{name}"


# ------------------------------------------------------------------------------------ commands
def k8s_platform(job: TuningJob) -> Platform:
    """The job's platform as the container sees it: the image's ``vllm`` and ``vllm-router`` on PATH."""
    return platform_for(job).model_copy(update={"engine_cmd": ["vllm"], "router_cmd": ["vllm-router"]})


def _head(bind_host: str = "0.0.0.0") -> Endpoint:
    return Endpoint(host=LEADER_ADDRESS, port=API_PORT, dp_rpc_port=DEFAULT_DP_RPC_PORT, bind_host=bind_host)


def _group_check(name: str, size: int) -> str:
    return (f'test "{GROUP_SIZE}" = "{size}" || {{ echo "{name}: a group of this LeaderWorkerSet must be {size} '
            f'pod(s), one per node; LWS_GROUP_SIZE={GROUP_SIZE}" >&2; exit 1; }}')


class ShellArith(str):
    """A flag value the pod's shell computes (``$((…))``): written unquoted, every other word is quoted."""


def pod_flags(job: TuningJob, cfg: DeploymentConfig, inst: Instance,
               platform: Platform) -> tuple[Flags, Flags | None]:
    """(leader's, worker's or None) ``{flag: value}`` of one instance, as ``serve_flags`` builds them for its
    head shard and its second shard; the worker's start rank is the shell's ``LWS_WORKER_INDEX`` × ranks per
    node."""
    kw = dict(cfg=cfg, platform=platform, head=_head(), served_model_name=job.executor.served_model_name,
              max_model_len=job.workload.max_model_len)
    leader = serve_flags(inst, inst.head, **kw)  # type: ignore[arg-type]
    if not inst.multi_node:
        return leader, None
    worker = serve_flags(inst, inst.shards[1], **kw)  # type: ignore[arg-type]
    local = inst.head.local_ranks
    if any(s.local_ranks != local or s.start_rank != k * local for k, s in enumerate(inst.shards)):
        raise ValueError(f"{inst.name}: ranks are not {local} per node, numbered node by node: {inst.shards}")
    if worker[DP_START_RANK] != local:  # worker 1 starts where the leader's ranks end
        raise ValueError(f"{inst.name}: node 1 starts at rank {worker[DP_START_RANK]}, not {local}")
    worker[DP_START_RANK] = ShellArith(f"$(({WORKER_INDEX_VAR} * {local}))")
    return leader, worker


def shell_script(name: str, size: int, platform: Platform, model: str, flags: Flags) -> str:
    """The container's ``sh -c`` script: check the group size, then ``exec`` vLLM — one flag a line (each as
    ``to_argv`` writes it), every word shell-quoted except a ``ShellArith`` value."""
    words = [shlex.quote(w) for w in serve_command(platform, [model])]
    for flag, value in flags.items():
        words += ["\\\n  " + " ".join(w if isinstance(w, ShellArith) else shlex.quote(w)
                                       for w in to_argv({flag: value}))]
    return f"{_group_check(name, size)}\nexec {' '.join(words)}\n"


# ------------------------------------------------------------------------------------ objects
def _labels(prefix: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": prefix,
            "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": "deploy-advisor"}


def evidence_annotations(cfg: DeploymentConfig, ev: Evidence) -> dict[str, str]:
    keep = ("concurrency", "throughput_per_gpu", "p90_tokens_per_s_per_user", "p90_ttft_ms", "p90_tpot_ms")
    numbers = [{k: getattr(m, k) for k in keep} for m in ev.measurements]
    a = ANNOTATION_PREFIX
    return {f"{a}/study": ev.study, f"{a}/trial": str(ev.trial), f"{a}/source": ev.source,
            f"{a}/engine-version": ev.engine_version, f"{a}/hardware": ev.hardware,
            f"{a}/deployment": cfg.describe(), f"{a}/measurements": json.dumps(numbers, separators=(",", ":"))}


HF_TOKEN_KEY = "token"  # the key of HF_TOKEN in the Secret (``ExportOptions.hf_token_secret``)


def secret_key(name: str) -> str:
    """The Secret key an environment reference ``${NAME}`` is read from: ``token`` for HF_TOKEN, else NAME."""
    return HF_TOKEN_KEY if name == "HF_TOKEN" else name


def secret_refs(env: dict[str, str]) -> list[str]:
    """The ``${NAME}`` references of a written environment: what the Secret must hold."""
    return sorted({m.group(1) for v in env.values() for m in ENV_REF.finditer(v)})


def env_entries(env: dict[str, str], secret: str) -> list[dict[str, Any]]:
    """A written environment (``executor.env`` over the platform's) as container env entries.

    A value written ``${NAME}`` is read from the environment at run time, so it must never become a value
    here: in a pod that environment is the Secret ``secret`` (``secretKeyRef``, key ``secret_key(NAME)``). A
    value with references inside text (``${HOME}/hf``) gets each NAME from the Secret first and then the
    kubelet's ``$(NAME)`` expansion, which sees only entries defined before it; a literal ``$(`` is escaped
    (``$$(``) so the kubelet leaves it alone.
    """
    def ref(name: str) -> dict[str, Any]:
        return {"secretKeyRef": {"name": secret, "key": secret_key(name), "optional": False}}

    out: list[dict[str, Any]] = []
    defined: set[str] = set()
    for key, value in env.items():
        whole = ENV_REF.fullmatch(value)
        if whole:
            out.append({"name": key, "valueFrom": ref(whole.group(1))})
        else:
            for name in dict.fromkeys(m.group(1) for m in ENV_REF.finditer(value)):
                if name not in defined and name not in env:
                    out.append({"name": name, "valueFrom": ref(name)})
                    defined.add(name)
            escaped = value.replace("$(", "$$(")
            out.append({"name": key, "value": ENV_REF.sub(lambda m: f"$({m.group(1)})", escaped)})
        defined.add(key)
    return out


def _env(platform: Platform, cfg: DeploymentConfig, secret: str) -> list[dict[str, Any]]:
    nixl = uses_nixl(cfg, platform)
    own = {"VLLM_NIXL_SIDE_CHANNEL_HOST"} if nixl else set()  # per pod below: one value for all pods is wrong
    env = env_entries({k: v for k, v in platform.env.items() if k not in own}, secret)
    if "HF_TOKEN" not in platform.env:
        env.append({"name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": secret, "key": HF_TOKEN_KEY, "optional": True}}})
    if nixl:
        # the prefill side advertises this host to decode (vLLM's default is localhost): the pod's own IP.
        # Each pod has its own IP, so the default port (5600 + DP rank) never collides.
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    return env


def _resources(platform: Platform, slots: int, rdma: bool) -> dict[str, dict[str, str]]:
    res = {"cpu": str(slots)} if platform.cpu_per_gpu_slot else {GPU_RESOURCE: str(slots)}
    if rdma:
        res[RDMA_RESOURCE] = "1"
    return {"requests": dict(res), "limits": dict(res)}


def _pod(prefix: str, role: Role, script: str, *, image: str, env: list[dict[str, Any]],
         resources: dict[str, dict[str, str]], leader: bool, rdma: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "vllm",
        "image": image,
        "command": ["/bin/sh", "-c", script],
        "env": env,
        "resources": resources,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if leader:
        health = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
        container["ports"] = [{"name": "http", "containerPort": API_PORT, "protocol": "TCP"}]
        container["startupProbe"] = {**health, "failureThreshold": 360}  # loading large weights: up to an hour
        container["readinessProbe"] = {**health, "failureThreshold": 3}
    if rdma:
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}  # pinned memory for RDMA
    return {
        "metadata": {"labels": {**_labels(prefix, role.value), "deploy-advisor/pod": "leader" if leader else "worker"}},
        "spec": {
            "containers": [container],
            # vLLM's processes share tensors through /dev/shm; the container default (64 MiB) is too small
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def leader_worker_set(job: TuningJob, cfg: DeploymentConfig, topo: Topology, role: Role, *, prefix: str,
                      model: str, platform: Platform, options: ExportOptions, annotations: dict[str, str]) -> dict:
    insts = topo.of_role(role)
    inst = insts[0]
    size = len(inst.shards)
    shapes = {(len(i.shards), tuple(len(s.gpus) for s in i.shards), tuple(s.local_ranks for s in i.shards))
              for i in insts}
    if len(shapes) != 1 or len({len(s.gpus) for s in inst.shards}) != 1:
        raise ValueError(f"{role.value}: instances of unequal shapes {sorted(shapes)} fit no single LeaderWorkerSet")
    slots = len(inst.head.gpus)
    rdma = job.cluster.rdma and inst.multi_node
    name = lws_name(prefix, role)
    leader_flags, worker_flags = pod_flags(job, cfg, inst, platform)
    env = _env(platform, cfg, options.hf_token_secret)
    res = _resources(platform, slots, rdma)
    leader = _pod(prefix, role, shell_script(name, size, platform, model, leader_flags), image=options.image,
                  env=env, resources=res, leader=True, rdma=rdma)
    template: dict[str, Any] = {"size": size, "restartPolicy": "RecreateGroupOnPodRestart"}
    if worker_flags is None:
        template["workerTemplate"] = leader  # a group of one: the leader is made from the worker template
    else:
        template["leaderTemplate"] = leader
        template["workerTemplate"] = _pod(prefix, role, shell_script(name, size, platform, model, worker_flags),
                                          image=options.image, env=env, resources=res, leader=False, rdma=rdma)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": _labels(prefix, role.value), "annotations": annotations},
        "spec": {
            "replicas": len(insts),
            "leaderWorkerTemplate": template,
            # workers need only the leader's name, and the leader is not ready before its workers join
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate"},
            # the router addresses leaders as <lws>-<group>.<lws>: one headless Service for all groups
            "networkConfig": {"subdomainPolicy": "Shared"},
        },
    }


def role_service(prefix: str, role: Role, annotations: dict[str, str]) -> dict:
    name = lws_name(prefix, role)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-api", "labels": _labels(prefix, role.value), "annotations": annotations},
        "spec": {
            "selector": {LWS_NAME_LABEL: name, LWS_WORKER_INDEX_LABEL: "0"},  # the leaders: they serve the API
            "ports": [{"name": "http", "port": API_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def router_urls(topo: Topology, prefix: str) -> dict[str, str]:
    return {inst.name: f"http://{leader_host(prefix, inst)}:{API_PORT}" for inst in topo.instances}


def router_objects(topo: Topology, *, prefix: str, platform: Platform, options: ExportOptions,
                   annotations: dict[str, str]) -> tuple[dict, dict]:
    urls = router_urls(topo, prefix)
    args = router_args(topo, urls, host="0.0.0.0", port=ROUTER_PORT, prometheus_port=ROUTER_METRICS_PORT)
    labels = _labels(prefix, "router")
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{prefix}-router", "labels": labels, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "initContainers": [{
                        "name": "wait-for-vllm",
                        "image": options.image,
                        "command": ["python3", "-c", _WAIT_PY, *(f"{u}/health" for u in urls.values())],
                    }],
                    "containers": [{
                        "name": "router",
                        "image": options.router_image or options.image,
                        "command": [*platform.router_cmd, *args],
                        **({"env": env_entries(platform.env, options.hf_token_secret)} if platform.env else {}),
                        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
                                  {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"}],
                    }],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{prefix}-router", "labels": labels, "annotations": annotations},
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"},
                      {"name": "metrics", "port": ROUTER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }
    return deployment, service
