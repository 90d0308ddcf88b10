"""The one place command lines are written: `vllm serve` per instance and node, `vllm-router`, and the
launch script. The Ray and local executors run exactly these argument lists; the exports print them.

A node shard's ``vllm serve`` is first an ordered ``{flag: value}`` mapping (``serve_flags``): the candidate's
flags from ``search_spaces.deployment`` (each field names its flag: ``flags_of``), then the flags of the
placement (data-parallel rank layout, ports, ``--headless``), the P/D connector and the platform's, each
declared once below. ``to_argv`` is the one function that writes a mapping as argv; every export reads the
mapping (``ShardCommand.flags``), never an argv back.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from executors.topology import Instance, NodeShard, Topology
from executors.vllm.platform import Platform
from search_spaces import DeploymentConfig, Mode, Role, RoleConfig
from search_spaces.deployment import FlagValue, flag_name, flags_of

#: ``{flag: value}``, in the order the flags are written.
Flags = dict[str, FlagValue]
#: The flags of the API server and the placement (the candidate's are on its fields), declared once.
HOST, PORT, SERVED_MODEL_NAME, MAX_MODEL_LEN = "--host", "--port", "--served-model-name", "--max-model-len"
DP_SIZE_LOCAL, HEADLESS, DP_START_RANK = "--data-parallel-size-local", "--headless", "--data-parallel-start-rank"
DP_ADDRESS, DP_RPC_PORT = "--data-parallel-address", "--data-parallel-rpc-port"
KV_TRANSFER_CONFIG = "--kv-transfer-config"  # the P/D connector: the platform's, per role
#: vLLM's default data-parallel RPC port (REFERENCE.md); the same on every node of an instance.
DEFAULT_DP_RPC_PORT = 29550
#: vLLM's default ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (vllm/envs.py); a server's rank r listens on it + r.
DEFAULT_NIXL_PORT = 5600
#: The launch script's fixed ports (and the Ray executor's with ``executor.port_base``): instance k's API on
#: ``API_PORT + k``, the router ``API_PORT - ROUTER_BELOW_API``, its Prometheus metrics ``METRICS_ABOVE`` higher.
API_PORT, ROUTER_BELOW_API, METRICS_ABOVE = 8100, 100, 1000


def flag_text(value: FlagValue) -> str:
    """A flag's value as one argv word: JSON for a dict (compact, as vLLM's examples write it)."""
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return value if isinstance(value, str) else str(value)


def to_argv(flags: Flags) -> list[str]:
    """The one writer of flags: ``--flag value`` each, a ``True`` flag alone, ``False``/``None`` left out."""
    out: list[str] = []
    for flag, value in flags.items():
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            out += [flag, flag_text(value)]
    return out


def kwarg_name(flag: str) -> str:
    """A flag as vLLM names the engine argument behind it: ``--max-num-seqs`` → ``max_num_seqs``."""
    return flag.removeprefix("--").replace("-", "_")


def engine_kwarg(flag: str, value: FlagValue) -> tuple[str, FlagValue]:
    """A rendered flag as vLLM's engine argument: ``--max-num-seqs 8`` → ``("max_num_seqs", 8)``; a negated
    boolean (``--no-async-scheduling``, how a ``False`` knob that defaults to ``None`` is written) → ``False``."""
    if flag.startswith("--no-") and value is True:
        return kwarg_name("--" + flag.removeprefix("--no-")), False
    return kwarg_name(flag), value


def fixed_ports(base: int, k: int) -> tuple[int, int]:
    """(API port, DP RPC port) of the k-th instance with fixed ports from ``base``."""
    return base + k, DEFAULT_DP_RPC_PORT + k


def fixed_router_ports(base: int) -> tuple[int, int]:
    """(router port, router metrics port) with fixed ports from ``base``."""
    return base - ROUTER_BELOW_API, base - ROUTER_BELOW_API + METRICS_ABOVE


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


def role_mapping(role: RoleConfig, *, log_balancedness: bool = False) -> Flags:
    """The candidate's own flags for one role (``flags_of``). ``log_balancedness``
    (``workload.eplb_log_balancedness``, a diagnosis) adds ``"log_balancedness": true`` to ``--eplb-config``:
    EP rank 0 then logs each step's balancedness, which the executors read per level."""
    out = flags_of(role)
    eplb_flag = flag_name(RoleConfig, "eplb")
    if log_balancedness and eplb_flag in out:
        out[eplb_flag] = {**out[eplb_flag], "log_balancedness": True}  # type: ignore[dict-item]
    return out


def role_flags(role: RoleConfig, *, log_balancedness: bool = False) -> list[str]:
    """``role_mapping`` as argv."""
    return to_argv(role_mapping(role, log_balancedness=log_balancedness))


def eplb_config_json(role: RoleConfig, *, log_balancedness: bool = False) -> str:
    """``--eplb-config``'s value: the candidate's EPLB settings, plus vLLM's ``log_balancedness`` when asked."""
    return flag_text({**role.eplb.config(), **({"log_balancedness": True} if log_balancedness else {})})


def dp_mapping(inst: Instance, shard: NodeShard, head: Endpoint) -> Flags:
    """Data-parallel layout of one node shard across nodes (the size itself is the role's field)."""
    if inst.config.data_parallel_size == 1 or not inst.multi_node:
        return {}
    out: Flags = {DP_SIZE_LOCAL: shard.local_ranks}
    if not shard.is_head:
        out |= {HEADLESS: True, DP_START_RANK: shard.start_rank}
    return out | {DP_ADDRESS: head.host, DP_RPC_PORT: head.dp_rpc_port}


def serve_flags(
    inst: Instance,
    shard: NodeShard,
    *,
    cfg: DeploymentConfig,
    platform: Platform,
    head: Endpoint,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    log_balancedness: bool = False,
) -> Flags:
    """The ``{flag: value}`` of one node shard of one instance of ``cfg`` (``log_balancedness``: see
    ``role_mapping``): what every command line and export of it is written from."""
    out: Flags = {HOST: head.bind_host, PORT: head.port} if shard.is_head else {}
    if served_model_name:
        out[SERVED_MODEL_NAME] = served_model_name
    if max_model_len:
        out[MAX_MODEL_LEN] = max_model_len
    out |= role_mapping(inst.config, log_balancedness=log_balancedness) | dp_mapping(inst, shard, head)
    if cfg.mode is Mode.DISAGGREGATED:
        out[KV_TRANSFER_CONFIG] = platform.kv_transfer_config(inst.role, cfg.kv_connector)
    return out | flags_of(cfg) | platform.serve_flags


def serve_args(inst: Instance, shard: NodeShard, *, model: str, extra: list[str] | None = None,
               **options: Any) -> list[str]:
    """Arguments after ``vllm serve`` for one node shard: the model, ``serve_flags(inst, shard, **options)`` as
    argv, then ``extra`` (the job's ``executor.extra_serve_args``, an operator's own words)."""
    return [model, *to_argv(serve_flags(inst, shard, **options)), *(extra or [])]


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


#: ``${NAME}``: a value read from the environment where the script runs (node addresses, ``executor.env``'s
#: secrets); the one thing in a rendered line the shell may expand.
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DQ_SPECIAL = re.compile(r'([\\"$`])')  # what a backslash must protect inside double quotes


def shell_word(text: str) -> str:
    """``text`` as one shell word, literal except its ``${NAME}`` references, which the operator's shell expands.

    shlex.quote single-quotes ``$``: ``'http://${NODE1_IP}:8100'`` reaches vllm-router as that very text.
    Words with references are double-quoted, every other ``$``, backquote, backslash and quote escaped.
    """
    if not ENV_REF.search(text):
        return shlex.quote(text)
    parts, pos = [], 0
    for m in ENV_REF.finditer(text):
        parts += [_DQ_SPECIAL.sub(r"\\\1", text[pos:m.start()]), m.group(0)]
        pos = m.end()
    parts.append(_DQ_SPECIAL.sub(r"\\\1", text[pos:]))
    return '"' + "".join(parts) + '"'


def shell_line(argv: list[str]) -> str:
    return " ".join(shell_word(a) for a in argv)


def shell_env(env: dict[str, str]) -> str:
    """``NAME=word`` assignments, values as ``shell_word`` renders them."""
    return " ".join(f"{k}={shell_word(v)}" for k, v in env.items())


@dataclass(frozen=True)
class ShardCommand:
    """One process to start: a node shard of an instance, its flags and argv, the GPU slots it may use and the
    environment that differs by node (NIXL's side channel, the node's own address)."""

    instance: Instance
    shard: NodeShard
    argv: list[str]  # ``serve_command`` of ``model`` and ``to_argv(flags)``
    slot_env: dict[str, str]
    node_env: dict[str, str] = field(default_factory=dict)
    flags: Flags = field(default_factory=dict)  # ``serve_flags``: what the argv is written from


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


def uses_nixl(cfg: DeploymentConfig, platform: Platform) -> bool:
    return cfg.mode is Mode.DISAGGREGATED and (cfg.kv_connector or platform.kv_connector) == "NixlConnector"


def nixl_base_ports(topology: Topology, first: int = DEFAULT_NIXL_PORT) -> dict[str, int]:
    """Instance name → its ``VLLM_NIXL_SIDE_CHANNEL_PORT``. vLLM listens on that port + the global DP rank,
    on every node of the instance, so each instance gets a range of its DP size and no two ranges overlap —
    instances sharing a node never collide, whichever node that is."""
    out, nxt = {}, first
    for inst in topology.instances:
        out[inst.name] = nxt
        nxt += inst.config.data_parallel_size
    return out


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
    base_port: int = API_PORT,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    nixl_port: int = DEFAULT_NIXL_PORT,
) -> LaunchPlan:
    """Ports ``base_port + k`` and DP RPC ports ``29550 + k`` for the k-th instance, NIXL side-channel ranges
    from ``nixl_port`` (``nixl_base_ports``); node addresses are ``${NODEn_IP}`` placeholders unless
    ``node_hosts`` names them."""
    cfg = topology.config
    hosts = node_hosts or node_placeholders(topology)
    # across nodes each server listens on its own node's address (what the others reach it at), not on all
    # interfaces; on one node on loopback
    multi = topology.cluster.nodes > 1
    nixl = nixl_base_ports(topology, nixl_port) if uses_nixl(cfg, platform) else {}
    endpoints: dict[str, Endpoint] = {}
    commands: list[ShardCommand] = []
    for k, inst in enumerate(topology.instances):
        port, rpc = fixed_ports(base_port, k)
        head = Endpoint(host=hosts[inst.head.node], port=port, dp_rpc_port=rpc,
                        bind_host=hosts[inst.head.node] if multi else "127.0.0.1")
        endpoints[inst.name] = head
        for shard in inst.shards:
            flags = serve_flags(inst, shard, cfg=cfg, platform=platform, head=head,
                                served_model_name=served_model_name, max_model_len=max_model_len)
            node_env: dict[str, str] = {}
            if inst.name in nixl:  # the prefill side advertises this host to decode: never the default localhost
                node_env |= {"VLLM_NIXL_SIDE_CHANNEL_HOST": hosts[shard.node],
                             "VLLM_NIXL_SIDE_CHANNEL_PORT": str(nixl[inst.name])}
            if inst.multi_node:  # the address vLLM's ranks give each other: this node's, not a guess
                node_env["VLLM_HOST_IP"] = hosts[shard.node]
            argv = serve_command(platform, [model, *to_argv(flags)])
            commands.append(ShardCommand(inst, shard, argv, slot_env(platform, shard.gpus), node_env, flags))
    urls = {name: e.url for name, e in endpoints.items()}
    router_port, metrics_port = fixed_router_ports(base_port)
    router = [*platform.router_cmd, *router_args(topology, urls, host="127.0.0.1", port=router_port,
                                                prometheus_port=metrics_port)]
    return LaunchPlan(endpoints, commands, router)


#: The launch script's command variables: an operator (or a test) replaces the engine or the router.
ENGINE_VAR, ROUTER_VAR = "VLLM", "VLLM_ROUTER"


def _command_default(var: str, cmd: list[str]) -> str:
    """``VAR=${VAR:-cmd}``: the script expands ``$VAR`` unquoted, so its words are split at spaces."""
    if any(not w or any(c.isspace() for c in w) for w in cmd):
        raise ValueError(f"${var}: the command {cmd} has an empty word or one with a space; ${var} splits at spaces")
    return f"{var}=${{{var}:-{shell_word(' '.join(cmd))}}}"


def launch_script(topology: Topology, *, model: str, platform: Platform, node_hosts: list[str] | None = None,
                  header: str = "", **plan_options: Any) -> str:
    """A bash script run once on each node, ``launch.sh N`` on node N: that node's ``vllm serve`` lines, then
    on node 0 the router once every API server answers; other nodes wait on their servers. Stopping the
    script stops what it started.

    ``$VLLM`` and ``$VLLM_ROUTER`` are the engine and router commands (the platform's by default), expanded
    as words so a command of several words (``python -m …``) can replace them. Node addresses and the
    environment's ``${NAME}`` values are expanded by the operator's shell, never written here.
    ``plan_options``: ``launch_plan``'s (``base_port``, ``served_model_name``, ``max_model_len``).
    """
    plan = launch_plan(topology, model=model, platform=platform, node_hosts=node_hosts, **plan_options)
    hosts = node_hosts or node_placeholders(topology)
    nodes = topology.cluster.nodes
    n_engine, n_router = len(platform.engine_cmd), len(platform.router_cmd)
    lines = ["#!/usr/bin/env bash",
             f"# shellcheck disable=SC2086  # ${ENGINE_VAR} and ${ROUTER_VAR} are commands of several words"]
    if header:
        lines += [f"# {h}" if h else "#" for h in header.splitlines()]
    usage = "bash launch.sh" if nodes == 1 else f"bash launch.sh NODE  (0..{nodes - 1}, on that node; NODEn_IP set)"
    lines += [f"# usage: {usage}",
              f"# {ENGINE_VAR}, {ROUTER_VAR}: replace the engine and router commands (default: the ones below)",
              "set -euo pipefail",
              _command_default(ENGINE_VAR, platform.engine_cmd),
              _command_default(ROUTER_VAR, platform.router_cmd)]
    if nodes == 1:
        lines.append("NODE=${1:-0}")
    else:
        lines.append(f'NODE=${{1:?"usage: {usage}"}}')
    lines.append(f'case "$NODE" in {"|".join(map(str, range(nodes)))}) ;; '
                 f'*) echo "NODE: $NODE is not a node of this deployment (0..{nodes - 1})" >&2; exit 2 ;; esac')
    lines += [f': "{h[:-1]}:?set it to the address of node {n}}}"' for n, h in enumerate(hosts) if h.startswith("${")]
    refs = sorted({m.group(1) for v in platform.env.values() for m in ENV_REF.finditer(v)})
    lines += [f': "${{{r}?executor.env reads it from the environment}}"' for r in refs]
    if platform.env:
        lines.append(f"export {shell_env(platform.env)}")
    lines.append("trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # the servers end with this script")
    by_node: dict[int, list[str]] = {}
    for c in plan.commands:
        words = [shell_env({**c.slot_env, **c.node_env}), f"${ENGINE_VAR}", shell_line(c.argv[n_engine:])]
        line = f"{' '.join(w for w in words if w)} > {c.instance.name}-node{c.shard.node}.log 2>&1 &"
        ranks = f"{c.shard.start_rank}..{c.shard.start_rank + c.shard.local_ranks - 1}"
        by_node.setdefault(c.shard.node, []).append(f"# {c.instance.name}, DP ranks {ranks}\n{line}")
    for node in sorted(by_node):
        lines.append(f"\n# ---- node {node} ({hosts[node]}) ----")
        lines += [f'if [ "$NODE" = {node} ]; then', *by_node[node], "fi"]
    if nodes > 1:
        lines.append('\nif [ "$NODE" != 0 ]; then wait; exit 0; fi  # not node 0: keep the servers, no router')
    lines.append("\n# ---- router (node 0), once every /health answers ----")
    lines += [f"until curl -sf {shell_word(e.url + '/health')} >/dev/null; do sleep 2; done"
              for e in plan.endpoints.values()]
    lines.append(f"${ROUTER_VAR} {shell_line(plan.router_argv[n_router:])}")
    return "\n".join(lines) + "\n"
