"""The one place command lines are written: `vllm serve` per instance and node, `vllm-router`, and the
launch script. The Ray and local executors run exactly these argument lists; the exports print them.

Flags of the candidate come from ``search_spaces.deployment`` (each field names its flag); flags of the
placement (data-parallel rank layout, ports, ``--headless``) are written here, once.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from enum import Enum
from typing import Any

from executors.platform import Platform
from executors.topology import Instance, NodeShard, Topology
from search_spaces import DeploymentConfig, Mode, Role, RoleConfig

#: Fields rendered only when they differ from the declared default (vLLM's own default is the same).
_ONLY_WHEN_SET = {"tensor_parallel_size", "data_parallel_size", "enable_expert_parallel", "enable_dbo"}
#: vLLM's default data-parallel RPC port (REFERENCE.md); the same on every node of an instance.
DEFAULT_DP_RPC_PORT = 29550


@dataclass(frozen=True)
class Endpoint:
    """Where one node shard of an instance listens (head: the API; other nodes: headless)."""

    host: str  # address the others reach this node at
    port: int  # API port (head) — unused by headless shards
    dp_rpc_port: int = DEFAULT_DP_RPC_PORT
    bind_host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _value(v: Any) -> str:
    return v.value if isinstance(v, Enum) else str(v)


def role_flags(role: RoleConfig) -> list[str]:
    """The candidate's own flags for one role, read off the fields' ``vllm_flag`` metadata."""
    out: list[str] = []
    for name, field in RoleConfig.model_fields.items():
        flag = (field.json_schema_extra or {}).get("vllm_flag") if isinstance(field.json_schema_extra, dict) else None
        if not flag:
            continue
        value = getattr(role, name)
        if name in _ONLY_WHEN_SET and value == field.default:
            continue
        if name == "data_parallel_size":
            continue  # rendered with the rank layout in ``dp_flags``
        if name == "all2all_backend" and not role.enable_expert_parallel:
            continue  # the backend only exists for expert parallelism
        if isinstance(value, bool):
            if value:
                out.append(flag)
        else:
            out += [flag, _value(value)]
    if role.eplb.enabled:
        eplb_flag = type(role.eplb).model_fields["enabled"].json_schema_extra["vllm_flag"]  # type: ignore[index]
        out += [eplb_flag, "--eplb-config", role.eplb.config_json()]
    return out


def dp_flags(inst: Instance, shard: NodeShard, head: Endpoint) -> list[str]:
    """Data-parallel layout of one node shard; single-node instances need only the size."""
    dp = inst.config.data_parallel_size
    if dp == 1:
        return []
    out = ["--data-parallel-size", str(dp)]
    if not inst.multi_node:
        return out
    out += ["--data-parallel-size-local", str(shard.local_ranks)]
    if not shard.is_head:
        out += ["--headless", "--data-parallel-start-rank", str(shard.start_rank)]
    out += ["--data-parallel-address", head.host, "--data-parallel-rpc-port", str(head.dp_rpc_port)]
    return out


def serve_args(
    inst: Instance,
    shard: NodeShard,
    *,
    cfg: DeploymentConfig,
    model: str,
    platform: Platform,
    head: Endpoint,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """Arguments after ``vllm serve`` for one node shard of one instance of ``cfg``."""
    args = [model]
    if shard.is_head:
        args += ["--host", head.bind_host, "--port", str(head.port)]
    if served_model_name:
        args += ["--served-model-name", served_model_name]
    if max_model_len:
        args += ["--max-model-len", str(max_model_len)]
    args += role_flags(inst.config)
    args += dp_flags(inst, shard, head)
    if cfg.mode is Mode.DISAGGREGATED:
        args += ["--kv-transfer-config", platform.kv_transfer_config(inst.role, cfg.kv_connector)]
    if cfg.speculative_mtp_tokens:
        spec = {"method": "mtp", "num_speculative_tokens": cfg.speculative_mtp_tokens}
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    args += platform.extra_serve_args
    args += extra or []
    return args


def serve_command(platform: Platform, args: list[str]) -> list[str]:
    return [*platform.engine_cmd, "serve", *args]


def router_args(topology: Topology, urls: dict[str, str], *, host: str, port: int, prometheus_port: int) -> list[str]:
    """``vllm-router`` arguments: P/D mode for a disaggregated deployment, plain balancing otherwise.

    ``urls`` maps instance name → its API URL.
    """
    cfg = topology.config
    args = ["--host", host, "--port", str(port), "--policy", cfg.router_policy,
            "--prometheus-host", host, "--prometheus-port", str(prometheus_port)]
    if cfg.mode is Mode.DISAGGREGATED:
        args.append("--vllm-pd-disaggregation")
        for inst in topology.of_role(Role.PREFILL):
            args += ["--prefill", urls[inst.name]]
        for inst in topology.of_role(Role.DECODE):
            args += ["--decode", urls[inst.name]]
    else:
        args.append("--worker-urls")
        args += [urls[inst.name] for inst in topology.instances]
    return args


def _shell_line(argv: list[str]) -> str:
    """shlex.join, but node-address placeholders (``${NODE0_IP}``) stay expandable."""
    return re.sub(r"'(\$\{NODE\d+_IP\})'", r'"\1"', shlex.join(argv))


@dataclass(frozen=True)
class ShardCommand:
    """One process to start: a node shard of an instance, its argv and the GPU slots it may use."""

    instance: Instance
    shard: NodeShard
    argv: list[str]
    slot_env: dict[str, str]


@dataclass(frozen=True)
class LaunchPlan:
    """Every command of a deployment on named hosts — what exports print (executors pick their own ports)."""

    endpoints: dict[str, Endpoint]  # instance name → its head's endpoint
    commands: list[ShardCommand]
    router_argv: list[str]


def slot_env(platform: Platform, gpus: tuple[int, ...] | list[int]) -> dict[str, str]:
    """The environment that pins a shard to its GPU slots (CPU cores on the CPU platform)."""
    if platform.cpu_per_gpu_slot:
        return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, gpus))}
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}


def node_placeholders(topology: Topology) -> list[str]:
    """Node addresses to fill in: ``${NODEn_IP}`` per node, or loopback when the cluster is one node."""
    if topology.cluster.nodes == 1:
        return ["127.0.0.1"]
    return [f"${{NODE{n}_IP}}" for n in range(topology.cluster.nodes)]


def launch_plan(
    topology: Topology,
    *,
    model: str,
    platform: Platform,
    node_hosts: list[str] | None = None,
    base_port: int = 8100,
    router_port: int = 8000,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
) -> LaunchPlan:
    """Ports ``base_port + k`` and DP RPC ports ``29550 + k`` for the k-th instance; node addresses are
    ``${NODEn_IP}`` placeholders unless ``node_hosts`` names them."""
    cfg = topology.config
    hosts = node_hosts or node_placeholders(topology)
    bind = "0.0.0.0" if topology.cluster.nodes > 1 else "127.0.0.1"
    endpoints: dict[str, Endpoint] = {}
    commands: list[ShardCommand] = []
    for k, inst in enumerate(topology.instances):
        head = Endpoint(host=hosts[inst.head.node], port=base_port + k, dp_rpc_port=DEFAULT_DP_RPC_PORT + k,
                        bind_host=bind)
        endpoints[inst.name] = head
        for shard in inst.shards:
            args = serve_args(inst, shard, cfg=cfg, model=model, platform=platform, head=head,
                              served_model_name=served_model_name, max_model_len=max_model_len)
            commands.append(ShardCommand(inst, shard, serve_command(platform, args), slot_env(platform, shard.gpus)))
    urls = {name: e.url for name, e in endpoints.items()}
    router = [*platform.router_cmd, *router_args(topology, urls, host="127.0.0.1", port=router_port,
                                                prometheus_port=router_port + 1000)]
    return LaunchPlan(endpoints, commands, router)


def launch_script(
    topology: Topology,
    *,
    model: str,
    platform: Platform,
    node_hosts: list[str] | None = None,
    base_port: int = 8100,
    router_port: int = 8000,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    header: str = "",
) -> str:
    """A bash script with one ``vllm serve`` line per instance and node, then the router line.

    Lines are grouped by node: an operator runs the block of node N on node N.
    """
    plan = launch_plan(topology, model=model, platform=platform, node_hosts=node_hosts, base_port=base_port,
                       router_port=router_port, served_model_name=served_model_name, max_model_len=max_model_len)
    hosts = node_hosts or node_placeholders(topology)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in platform.env.items())
    lines = ["#!/usr/bin/env bash", "set -euo pipefail"]
    if header:
        lines += [f"# {h}" if h else "#" for h in header.splitlines()]
    lines += [f': "{h[:-1]}:?set it to node {n}\'s address}}"' for n, h in enumerate(hosts) if h.startswith("${")]
    if env:
        lines.append(f"export {env}")
    by_node: dict[int, list[str]] = {}
    for c in plan.commands:
        pin = " ".join(f"{k}={shlex.quote(v)}" for k, v in c.slot_env.items())
        line = f"{pin} {_shell_line(c.argv)} > {c.instance.name}-node{c.shard.node}.log 2>&1 &"
        ranks = f"{c.shard.start_rank}..{c.shard.start_rank + c.shard.local_ranks - 1}"
        by_node.setdefault(c.shard.node, []).append(f"# {c.instance.name}, DP ranks {ranks}\n{line}")
    for node in sorted(by_node):
        lines.append(f"\n# ---- node {node} ({hosts[node]}) ----")
        lines += by_node[node]
    urls = " ".join(e.url for e in plan.endpoints.values())
    lines.append("\n# ---- router (node 0), once every /health answers ----")
    lines.append(f"for u in {urls}; do until curl -sf $u/health >/dev/null; do sleep 2; done; done")
    lines.append(_shell_line(plan.router_argv))
    return "\n".join(lines) + "\n"
