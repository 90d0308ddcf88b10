"""``executors.vllm.render`` against the real parsers of the installed vLLM and vllm-router.

(a) Every ``vllm serve`` argument list rendered for the presets' candidates — on the GPU and the CPU
    platform, for every instance and node shard — parses with vLLM's own ``vllm serve`` parser (built the
    way ``vllm.entrypoints.cli.main`` builds it, plus the post-parse validation ``vllm serve`` runs) into
    the values the candidate meant. Parsing only: no engine, no model download.
(b) Multi-node data-parallel instances get the rank layout the cluster's arithmetic asks for, computed
    here from ``gpus_per_node`` and the instance's TP/DP sizes, not by the topology code.
(c) The launch script has one ``serve`` line per instance × node, under its node's block, and a router line
    that vllm-router's own parser reads back as P/D (``--prefill``/``--decode``) or plain balancing
    (``--worker-urls``) over exactly the servers the script starts; every router flag we render is one
    that ``vllm-router --help`` lists. NIXL P/D servers advertise their own node's address, on port ranges
    that never overlap on a node; the scripts are ``bash -n`` and shellcheck clean.
(d) The script run by bash, once per node (``launch.sh N``), with stand-ins for ``$VLLM``, ``$VLLM_ROUTER``
    and ``curl`` that record what they get: the router receives the nodes' addresses expanded, each server
    its node's side-channel host, and no process of another node starts.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the CPU build of vLLM (CI) needs it before import

import argparse
import enum
import functools
import json
import random
import re
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from executors import (
    Endpoint,
    Instance,
    NodeShard,
    Platform,
    Topology,
    cpu_platform,
    gpu_platform,
    launch_script,
    place,
    router_args,
    serve_args,
)
from executors.vllm.render import DEFAULT_NIXL_PORT, role_mapping, uses_nixl
from search_spaces import (
    KNOBS,
    ClusterSpec,
    DeploymentConfig,
    Knob,
    Mode,
    ModelProfile,
    Role,
    RoleConfig,
    SearchSpace,
    Workload,
    check,
    load_preset,
    model_preset,
    preset_names,
)

MODEL = "deepseek-ai/DeepSeek-V3"  # only a name: nothing is loaded or downloaded
SERVED_NAME = "advisor-under-test"
SAMPLE = 50  # valid candidates per preset (plus any needed to cover every feature of its space)
PLATFORMS = ["gpu", "cpu"]


def platform_of(name: str) -> Platform:
    return gpu_platform() if name == "gpu" else cpu_platform(kv_storage_path="/tmp/deploy-advisor-kv-test")


# ------------------------------------------------------------------------------------------- presets
@dataclass(frozen=True)
class Preset:
    name: str
    space: SearchSpace
    model: ModelProfile
    cluster: ClusterSpec
    max_model_len: int


@functools.cache
def preset(name: str) -> Preset:
    doc = load_preset(name)
    spec = dict(doc["model"])
    assert "preset" in spec, f"{name}: test knows only model presets, got model {spec}"
    model = ModelProfile.model_validate({**model_preset(spec.pop("preset")).model_dump(), **spec})
    return Preset(
        name=name,
        space=SearchSpace.model_validate(doc["space"]),
        model=model,
        cluster=ClusterSpec.model_validate(doc["cluster"]),
        max_model_len=Workload.model_validate(doc.get("workload", {})).max_model_len,
    )


def _tags(cfg: DeploymentConfig, cluster: ClusterSpec) -> set[str]:
    """The features of a candidate a sample should cover (read off the config, so no check is needed)."""
    tags = {f"mode:{cfg.mode.value}"}
    for r in cfg.roles:
        p = r.role.value
        tags |= {f"{p}:x{r.instances}", f"{p}:tp{r.tensor_parallel_size}", f"{p}:dp{r.data_parallel_size}"}
        if r.enable_expert_parallel:
            tags.add(f"{p}:ep:{r.all2all_backend.value}")
        if r.eplb.enabled:
            tags.add(f"{p}:eplb:{r.eplb.num_redundant_experts}")
        if r.enable_dbo:
            tags.add(f"{p}:dbo")
        if r.gpus_per_instance > cluster.gpus_per_node:
            tags.add(f"{p}:multi-node")
    return tags


@functools.cache
def sample(name: str) -> tuple[DeploymentConfig, ...]:
    """~SAMPLE valid candidates in a seeded random order, plus the first valid one of each feature not yet seen."""
    p = preset(name)
    candidates = [cfg for _, cfg in p.space.enumerate()]
    random.Random(f"test_render:{name}").shuffle(candidates)
    chosen: list[DeploymentConfig] = []
    covered: set[str] = set()
    misses: Counter[str] = Counter()  # bounds the checks spent looking for a feature no valid candidate has
    for cfg in candidates:
        tags = _tags(cfg, p.cluster)
        new = {t for t in tags - covered if misses[t] < 200}
        if len(chosen) >= SAMPLE and not new:
            continue
        if check(cfg, p.model, p.cluster, p.max_model_len):
            misses.update(new)
            continue
        chosen.append(cfg)
        covered |= tags
    assert chosen, f"{name}: no valid candidate in the preset's space"
    return tuple(chosen)


def hosts_of(cluster: ClusterSpec) -> list[str]:
    return [f"10.0.{n // 200}.{n % 200 + 1}" for n in range(cluster.nodes)]


# --------------------------------------------------------------------------------- vLLM's own parser
@functools.cache
def _vllm_serve() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, Any]:
    """``vllm serve``'s parser, built as ``vllm.entrypoints.cli.main.main`` builds it (vLLM 0.32)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    subparsers = root.add_subparsers(required=False, dest="subparser")
    cmd = ServeSubcommand()
    serve = cmd.subparser_init(subparsers)
    serve.set_defaults(dispatch_function=cmd.cmd)
    return root, serve, cmd


def parse_serve(args: list[str], context: str) -> argparse.Namespace:
    root, _, cmd = _vllm_serve()
    try:
        ns = root.parse_args(["serve", *args])
    except SystemExit as e:  # argparse's error, printed on stderr (shown with the failure)
        pytest.fail(f"vLLM's `vllm serve` parser rejects (exit {e.code}) the arguments of {context}:\n"
                    f"{shlex.join(args)}")
    except (argparse.ArgumentError, argparse.ArgumentTypeError, ValueError) as e:  # e.g. a bad --eplb-config JSON
        pytest.fail(f"vLLM's `vllm serve` parser rejects the arguments of {context}: {e}\n{shlex.join(args)}")
    cmd.validate(ns)  # what `vllm serve` checks after parsing, before any engine starts
    assert ns.subparser == "serve" and ns.dispatch_function == cmd.cmd
    return ns


def vllm_default(dest: str) -> Any:
    return _vllm_serve()[1].get_default(dest)


def knobs_mean(ns: argparse.Namespace, role: RoleConfig, args: list[str], context: str) -> None:
    """Every knob of the table reaches vLLM's engine argument of its own name: the role's value where it is
    rendered, vLLM's default where it is not."""
    rendered = role_mapping(role)
    for k in KNOBS:
        value = getattr(role, k.name)
        shown = k.flag in rendered or (k.negated_flag is not None and k.negated_flag in rendered)
        want = k.encode(value) if shown else vllm_default(k.name)
        assert getattr(ns, k.name) == want, f"{context}: {k.flag} of {k.name}={value!r}:\n{shlex.join(args)}"


def knob_domain(k: Knob) -> list[Any]:
    """The values a test renders of a knob: every value of a finite domain, two of an integer one."""
    import typing

    if isinstance(k.kind, type) and issubclass(k.kind, enum.Enum):
        return list(k.kind)
    args = typing.get_args(k.kind)
    if k.kind is bool or args == (bool, type(None)):
        return [v for v in (None, False, True) if v is not None or args]
    if args:
        return list(args)
    return [k.default, max(k.ge or 0, 1) * 512]


# ------------------------------------------------------------------------ expected, computed here
@dataclass(frozen=True)
class NodeLayout:
    start_rank: int
    size_local: int
    headless: bool


def expected_layout(role: RoleConfig, cluster: ClusterSpec) -> list[NodeLayout] | None:
    """vLLM's multi-node DP: whole nodes, the same number of DP ranks on each, ranks numbered node by node;
    the first node runs the API server, the others are ``--headless``. None: the instance fits in a node."""
    gpus = role.tensor_parallel_size * role.data_parallel_size
    per_node = cluster.gpus_per_node
    if gpus <= per_node:
        return None
    assert gpus % per_node == 0 and per_node % role.tensor_parallel_size == 0
    nodes, local = gpus // per_node, per_node // role.tensor_parallel_size
    assert nodes * local == role.data_parallel_size
    return [NodeLayout(start_rank=i * local, size_local=local, headless=i > 0) for i in range(nodes)]


def expected_kv(role: Role, platform: Platform, cfg: DeploymentConfig) -> dict[str, Any]:
    connector = cfg.kv_connector or platform.kv_connector
    kv_role = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}[role]
    if connector == "NixlConnector":
        kv_role = "kv_both"  # Nixl pulls: both sides run the same role
    return {"kv_connector": connector, "kv_role": kv_role, "kv_connector_extra_config": platform.kv_connector_extra}


def assert_means(
    ns: argparse.Namespace,
    args: list[str],
    *,
    cfg: DeploymentConfig,
    inst: Instance,
    shard_index: int,
    head: Endpoint,
    platform: Platform,
    pre: Preset,
    context: str,
) -> None:
    """The parsed namespace holds what the candidate, the placement and the platform meant."""
    r = inst.config
    got = {
        "model_tag": ns.model_tag,
        "served_model_name": ns.served_model_name,
        "max_model_len": ns.max_model_len,
        "tensor_parallel_size": ns.tensor_parallel_size,
        "data_parallel_size": ns.data_parallel_size,
        "enable_expert_parallel": ns.enable_expert_parallel,
        "max_num_seqs": ns.max_num_seqs,
        "max_num_batched_tokens": ns.max_num_batched_tokens,
        "all2all_backend": ns.all2all_backend,
        "enable_dbo": ns.enable_dbo,
        "enable_eplb": ns.enable_eplb,
        "eplb": (ns.eplb_config.num_redundant_experts, ns.eplb_config.window_size, ns.eplb_config.step_interval),
    }
    default_eplb = vllm_default("eplb_config")
    want = {
        "model_tag": MODEL,
        "served_model_name": [SERVED_NAME],
        "max_model_len": pre.max_model_len,
        "tensor_parallel_size": r.tensor_parallel_size,
        "data_parallel_size": r.data_parallel_size,
        "enable_expert_parallel": r.enable_expert_parallel,
        "max_num_seqs": r.max_num_seqs,
        "max_num_batched_tokens": r.max_num_batched_tokens,
        # the backend is only rendered with expert parallelism; otherwise vLLM's default stands
        "all2all_backend": r.all2all_backend.value if r.enable_expert_parallel else vllm_default("all2all_backend"),
        "enable_dbo": r.enable_dbo,
        "enable_eplb": r.eplb.enabled,
        "eplb": (
            (r.eplb.num_redundant_experts, r.eplb.window_size, r.eplb.step_interval)
            if r.eplb.enabled
            else (default_eplb.num_redundant_experts, default_eplb.window_size, default_eplb.step_interval)
        ),
    }
    assert got == want, f"{context}:\n{shlex.join(args)}"
    knobs_mean(ns, r, args, context)

    # P/D: vLLM turns --kv-transfer-config's JSON into a KVTransferConfig
    if cfg.mode is Mode.DISAGGREGATED:
        kv = ns.kv_transfer_config
        assert kv is not None, f"{context}: P/D instance without --kv-transfer-config"
        got_kv = {"kv_connector": kv.kv_connector, "kv_role": kv.kv_role,
                  "kv_connector_extra_config": kv.kv_connector_extra_config}
        assert got_kv == expected_kv(inst.role, platform, cfg), context
    else:
        assert ns.kv_transfer_config is None, f"{context}: aggregated instance with a KV connector"

    # the data-parallel layout of this node
    layout = expected_layout(r, pre.cluster)
    dp = (ns.data_parallel_size_local, ns.data_parallel_start_rank, ns.data_parallel_address,
          ns.data_parallel_rpc_port, ns.headless)
    if layout is None:
        assert dp == (None, None, None, None, False), f"{context}: single-node instance with multi-node flags"
    else:
        node = layout[shard_index]
        # the head gives no start rank: an explicit one switches `vllm serve` to hybrid load balancing
        want_dp = (node.size_local, node.start_rank if node.headless else None, head.host, head.dp_rpc_port,
                   node.headless)
        assert dp == want_dp, f"{context}, node {shard_index} of {len(layout)}:\n{shlex.join(args)}"

    # the API: on the head only (headless nodes serve no HTTP)
    if shard_index == 0:
        assert (ns.host, ns.port) == (head.bind_host, head.port), context
    else:
        assert "--port" not in args and "--host" not in args, context

    if platform.name == "cpu":  # the CPU build serves dummy weights, eagerly
        assert (ns.load_format, ns.enforce_eager) == ("dummy", True), context


# --------------------------------------------------------------------------------------------- (a)
@pytest.mark.parametrize("platform_name", PLATFORMS)
@pytest.mark.parametrize("name", preset_names())
def test_serve_args_parse_with_vllms_own_parser(name: str, platform_name: str) -> None:
    pre, platform = preset(name), platform_of(platform_name)
    hosts = hosts_of(pre.cluster)
    parsed = 0
    for cfg in sample(name):
        topo = place(cfg, pre.cluster)
        for k, inst in enumerate(topo.instances):
            head = Endpoint(host=hosts[inst.head.node], port=8100 + k, dp_rpc_port=29600 + k, bind_host="0.0.0.0")
            for i, shard in enumerate(inst.shards):
                args = serve_args(inst, shard, cfg=cfg, model=MODEL, platform=platform, head=head,
                                  served_model_name=SERVED_NAME, max_model_len=pre.max_model_len)
                context = f"{name}/{platform_name}: {inst.name} of [{cfg.describe()}] on node {shard.node}"
                ns = parse_serve(args, context)
                assert_means(ns, args, cfg=cfg, inst=inst, shard_index=i, head=head, platform=platform,
                             pre=pre, context=context)
                parsed += 1
    assert parsed >= len(sample(name))


@pytest.mark.parametrize("platform_name", PLATFORMS)
@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_knob_value_parses_with_vllms_own_parser(knob: Knob, platform_name: str) -> None:
    """Each value of each knob (the presets' samples hold only the values their spaces search), rendered on a
    role it applies to, is accepted by vLLM's parser and means that value. The parser is the CPU build's (vLLM
    0.32); the knobs added for one GPU were also read in the GPU build's (0.26) ``EngineArgs`` (docs/jobs.md)."""
    platform = platform_of(platform_name)
    role = next(r for r in (Role.MIXED, Role.PREFILL, Role.DECODE) if r.value in knob.roles)
    layout = {"enable_expert_parallel": True, "data_parallel_size": 2} if knob.requires else {}
    if knob.name == "enable_dbo":
        layout["all2all_backend"] = "deepep_low_latency"
    cluster = ClusterSpec(gpu="H200", gpus_per_node=8)
    for value in knob_domain(knob):
        rc = RoleConfig(role=role, **layout, **{knob.name: value})
        cfg = (DeploymentConfig(mode=Mode.AGGREGATED, decode=rc) if role is Role.MIXED else
               DeploymentConfig(mode=Mode.DISAGGREGATED, prefill=rc if role is Role.PREFILL else
                                RoleConfig(role=Role.PREFILL), decode=rc if role is Role.DECODE else
                                RoleConfig(role=Role.DECODE)))
        inst = next(i for i in place(cfg, cluster).instances if i.role is role)
        head = Endpoint(host="10.0.0.1", port=8100, bind_host="0.0.0.0")
        args = serve_args(inst, inst.shards[0], cfg=cfg, model=MODEL, platform=platform, head=head)
        context = f"{knob.name}={value!r} on {platform_name}"
        ns = parse_serve(args, context)
        knobs_mean(ns, rc, args, context)


def test_knob_names_are_vllms_engine_arguments() -> None:
    """A knob's name is the engine argument its flag sets (what ``knobs_mean`` and the Ray Serve export read)."""
    _, serve, _ = _vllm_serve()
    dests = {s: a.dest for a in serve._actions for s in a.option_strings}
    for k in KNOBS:
        assert dests[k.flag] == k.name, k
        if k.negated_flag:
            assert dests[k.negated_flag] == k.name, k


def _features(cfg: DeploymentConfig, cluster: ClusterSpec) -> set[str]:
    out = {f"mode:{cfg.mode.value}"}
    for r in cfg.roles:
        out |= {f for f, on in (("ep", r.enable_expert_parallel), ("eplb", r.eplb.enabled), ("dbo", r.enable_dbo),
                                ("tp>1", r.tensor_parallel_size > 1), ("dp>1", r.data_parallel_size > 1),
                                ("multi-node", r.gpus_per_instance > cluster.gpus_per_node)) if on}
    return out


def test_sample_exercises_every_feature() -> None:
    """The candidates above are not a lucky few: together they hold every kind of instance we render."""
    seen = {f for name in preset_names() for cfg in sample(name) for f in _features(cfg, preset(name).cluster)}
    for feature in ("mode:aggregated", "mode:disaggregated", "ep", "eplb", "dbo", "tp>1", "dp>1", "multi-node"):
        assert feature in seen, f"no sampled candidate has {feature}; seen {sorted(seen)}"


# --------------------------------------------------------------------------------------------- (b)
@pytest.mark.parametrize("name", preset_names())
def test_multi_node_dp_layout(name: str) -> None:
    pre = preset(name)
    if pre.cluster.nodes == 1:
        pytest.skip(f"{name}: a single-node cluster has no multi-node instances")
    per_node = pre.cluster.gpus_per_node
    hosts = hosts_of(pre.cluster)
    checked = 0
    for cfg in sample(name):
        topo: Topology = place(cfg, pre.cluster)
        for k, inst in enumerate(topo.instances):
            layout = expected_layout(inst.config, pre.cluster)
            if layout is None:
                assert len(inst.shards) == 1, f"{inst.name}: fits one node but spans {len(inst.shards)}"
                continue
            context = f"{name}: {inst.name} of [{cfg.describe()}]"
            shards: tuple[NodeShard, ...] = inst.shards
            assert len(shards) == len(layout), context
            assert len({s.node for s in shards}) == len(shards), f"{context}: two shards on one node"
            assert all(s.gpus == tuple(range(per_node)) for s in shards), f"{context}: not whole nodes"
            head = Endpoint(host=hosts[shards[0].node], port=8100 + k, dp_rpc_port=29600 + k, bind_host="0.0.0.0")
            for i, (shard, want) in enumerate(zip(shards, layout, strict=True)):
                args = serve_args(inst, shard, cfg=cfg, model=MODEL, platform=gpu_platform(), head=head)
                ns = parse_serve(args, context)
                got = (ns.data_parallel_size, ns.data_parallel_size_local, ns.data_parallel_start_rank or 0,
                       ns.headless, ns.data_parallel_address, ns.data_parallel_rpc_port)
                assert got == (inst.config.data_parallel_size, want.size_local, want.start_rank, want.headless,
                               hosts[shards[0].node], 29600 + k), f"{context}, node {i}:\n{shlex.join(args)}"
                assert ("--headless" in args) == (i > 0), context
                checked += 1
    assert checked, f"{name}: the sample holds no multi-node instance on a {pre.cluster.nodes}-node cluster"


# --------------------------------------------------------------------------------------------- (c)
_NODE_HEADER = re.compile(r"^# ---- node (\d+) \((.*)\) ----$")
_LOG = re.compile(r"^(?P<inst>.+)-node(?P<node>\d+)\.log$")


def _serve_line(tokens: list[str]) -> tuple[dict[str, str], list[str], str] | None:
    """``NAME=value… $VLLM serve ARGS… > inst-nodeN.log 2>&1 &`` → (environment, ARGS, log name)."""
    env: dict[str, str] = {}
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        k, v = tokens.pop(0).split("=", 1)
        env[k] = v
    if len(tokens) < 6 or tokens[:2] != ["$VLLM", "serve"] or tokens[-4] != ">" or tokens[-2:] != ["2>&1", "&"]:
        return None
    return env, tokens[2:-4], tokens[-3]


def shellcheck(script: str, context: str) -> None:
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("shellcheck is not installed (scripts/setup.sh --with-netns installs it; CI must check)")
        return  # not installed here: bash -n still checks the syntax
    out = subprocess.run(["shellcheck", "-s", "bash", "-"], input=script, text=True, capture_output=True, check=False)
    assert out.returncode == 0, f"{context}: shellcheck:\n{out.stdout}\n{script}"


@pytest.mark.parametrize("platform_name", PLATFORMS)
@pytest.mark.parametrize("name", preset_names())
def test_launch_script(name: str, platform_name: str) -> None:
    from vllm_router.launch_router import parse_router_args

    pre, platform = preset(name), platform_of(platform_name)
    for j, cfg in enumerate(sample(name)):
        topo = place(cfg, pre.cluster)
        node_hosts = hosts_of(pre.cluster) if j % 2 else None  # half with ${NODEn_IP} placeholders
        script = launch_script(topo, model=MODEL, platform=platform, node_hosts=node_hosts,
                               served_model_name=SERVED_NAME, max_model_len=pre.max_model_len)
        context = f"{name}/{platform_name}: [{cfg.describe()}]"
        syntax = subprocess.run(["bash", "-n"], check=False, input=script, text=True, capture_output=True)
        assert syntax.returncode == 0, f"{context}: bash -n: {syntax.stderr}\n{script}"
        if j < 4:
            shellcheck(script, context)

        node, node_host = None, {}
        placed: Counter[tuple[str, int]] = Counter()
        api_url: dict[str, str] = {}
        nixl_ports: dict[int, list[int]] = {}  # node → every side-channel port its servers listen on
        nixl = uses_nixl(cfg, platform)
        code = [line for line in script.splitlines() if line.strip()]
        for line in code:
            if m := _NODE_HEADER.match(line):
                node = int(m.group(1))
                node_host[node] = m.group(2)
                continue
            if line.startswith("#"):
                continue
            serve = _serve_line(shlex.split(line))
            if serve is None:
                continue
            env, args, log = serve
            m = _LOG.match(log)
            assert m, f"{context}: log file {log!r}"
            inst_name, inst_node = m.group("inst"), int(m.group("node"))
            assert inst_node == node, f"{context}: {inst_name}'s node-{inst_node} line is in node {node}'s block"
            placed[(inst_name, inst_node)] += 1
            inst = next(i for i in topo.instances if i.name == inst_name)
            shard = next(s for s in inst.shards if s.node == inst_node)
            want_var, sep = (("VLLM_CPU_OMP_THREADS_BIND", "|") if platform.cpu_per_gpu_slot
                             else ("CUDA_VISIBLE_DEVICES", ","))
            assert env.get(want_var) == sep.join(map(str, shard.gpus)), context
            if nixl:  # the prefill side advertises this host to decode: this node's, never localhost
                assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == node_host[inst_node], f"{context}: {line}"
                base = int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
                assert base >= DEFAULT_NIXL_PORT, context
                # vLLM: base + the rank's global DP index (vllm/distributed/kv_transfer/.../nixl)
                nixl_ports.setdefault(inst_node, []).extend(
                    base + r for r in range(shard.start_rank, shard.start_rank + shard.local_ranks))
            else:
                assert not {k for k in env if k.startswith("VLLM_NIXL")}, f"{context}: NIXL without NixlConnector"
            assert ("VLLM_HOST_IP" in env) == inst.multi_node, context
            if inst.multi_node:
                assert env["VLLM_HOST_IP"] == node_host[inst_node], context
            ns = parse_serve(args, f"{context} {inst_name} node {inst_node}")
            if not ns.headless:
                assert inst_name not in api_url, f"{context}: {inst_name} has two API servers"
                api_url[inst_name] = f"http://{node_host[inst_node]}:{ns.port}"

        # one `serve` line per instance × node, nothing more
        want = Counter((inst.name, s.node) for inst in topo.instances for s in inst.shards)
        assert placed == want, f"{context}:\n{script}"
        assert set(api_url) == {inst.name for inst in topo.instances}, context
        for n, ports in nixl_ports.items():
            assert len(ports) == len(set(ports)), f"{context}: NIXL side-channel ports collide on node {n}: {ports}"

        # the router: last line; P/D or plain balancing over the API servers the script starts
        router = shlex.split(code[-1])
        assert router[0] == "$VLLM_ROUTER", f"{context}: last line is not the router:\n{code[-1]}"
        rargs = router[1:]
        ra = parse_router_args(rargs)  # vllm-router's own parser
        names = {role: [i.name for i in topo.of_role(role)] for role in Role}
        if cfg.mode is Mode.DISAGGREGATED:
            assert "--vllm-pd-disaggregation" in rargs and "--worker-urls" not in rargs, context
            assert ra.vllm_pd_disaggregation
            assert [u for u, _ in ra.prefill_urls] == [api_url[x] for x in names[Role.PREFILL]], context
            assert ra.decode_urls == [api_url[x] for x in names[Role.DECODE]], context
            assert not ra.worker_urls
        else:
            assert "--worker-urls" in rargs and not {"--vllm-pd-disaggregation", "--prefill", "--decode"} & set(rargs)
            assert not ra.vllm_pd_disaggregation and not ra.prefill_urls and not ra.decode_urls
            assert ra.worker_urls == [api_url[i.name] for i in topo.instances], context
        assert ra.policy == cfg.router_policy, context
        # the health wait before the router polls the same servers
        waits = [shlex.split(line)[3] for line in code if line.startswith("until curl -sf ")]
        assert sorted(waits) == sorted(f"{u}/health" for u in api_url.values()), f"{context}: {waits}"
        # the default commands are the platform's; $VLLM and $VLLM_ROUTER replace them
        assert f"VLLM=${{VLLM:-{shlex.quote(' '.join(platform.engine_cmd))}}}" in code, context
        assert f"VLLM_ROUTER=${{VLLM_ROUTER:-{shlex.quote(' '.join(platform.router_cmd))}}}" in code, context


# --------------------------------------------------------------------------------------------- (d)
#: Stands in for ``vllm`` (``$VLLM``), ``vllm-router`` (``$VLLM_ROUTER``) and ``curl``: writes one JSON record
#: (its argv, environment and the node the test ran) per call. ``curl URL`` answers once a server with that
#: port has recorded; the router records only after every expected server has (no race with the script's
#: end, which stops what it started).
_STUB = """
import json, os, sys, time, uuid

rec, name, args = os.environ["STUB_RECORDS"], sys.argv[1], sys.argv[2:]
deadline = time.monotonic() + 30


def wait_for(done):
    while not done():
        if time.monotonic() > deadline:
            sys.exit(7)
        time.sleep(0.02)


if name == "curl":
    port = args[-1].rsplit(":", 1)[1].split("/")[0]
    wait_for(lambda: os.path.exists(os.path.join(rec, f"up-{port}")))
    sys.exit(0)
if name == "vllm-router":
    wait_for(lambda: sum(f.startswith("vllm-") for f in os.listdir(rec)) >= int(os.environ["STUB_SERVERS"]))
doc = {"name": name, "argv": args, "env": dict(os.environ), "node": os.environ["STUB_NODE"]}
tmp = os.path.join(rec, f".{uuid.uuid4().hex}")
with open(tmp, "w") as f:
    json.dump(doc, f)
os.rename(tmp, os.path.join(rec, f"{name}-{uuid.uuid4().hex}.json"))
if name == "vllm" and "--port" in args:
    open(os.path.join(rec, f"up-{args[args.index('--port') + 1]}"), "w").close()
"""


@dataclass(frozen=True)
class Started:
    """One process a launch script started, as its stand-in recorded it."""

    name: str  # vllm | vllm-router
    argv: list[str]
    env: dict[str, str]
    node: int  # the N of the `launch.sh N` that started it


def run_launch_script(script: str, tmp: Path, *, nodes: int, node_ips: list[str] | None = None,
                      env: dict[str, str] | None = None, servers: int) -> list[Started]:
    """Run ``script`` with bash as an operator would: ``launch.sh N`` on each node (the others first, node 0
    last: it starts the router once every server answers), ``NODEn_IP`` set to ``node_ips``, the engine,
    router and curl replaced by the recording stand-in. Returns what was started, per node."""
    tmp.mkdir(parents=True, exist_ok=True)
    stub, bin_dir, records = tmp / "stub.py", tmp / "bin", tmp / "records"
    stub.write_text(_STUB)
    bin_dir.mkdir(exist_ok=True)
    records.mkdir(exist_ok=True)
    (bin_dir / "curl").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(stub))} curl "$@"\n')
    (bin_dir / "curl").chmod(0o755)
    path = tmp / "launch.sh"
    path.write_text(script)
    base = {**(env or {}), "PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_RECORDS": str(records),
            "STUB_SERVERS": str(servers),
            "VLLM": f"{sys.executable} {stub} vllm", "VLLM_ROUTER": f"{sys.executable} {stub} vllm-router",
            **{f"NODE{n}_IP": ip for n, ip in enumerate(node_ips or [])}}
    for n in [*range(1, nodes), 0]:
        argv = ["bash", str(path)] + ([str(n)] if nodes > 1 else [])
        p = subprocess.run(argv, cwd=tmp, env={**base, "STUB_NODE": str(n)}, capture_output=True, text=True,
                           timeout=120, check=False, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, f"launch.sh {n}: exit {p.returncode}\n{p.stderr}\n{script}"
    out = []
    for f in sorted(records.glob("*.json")):
        doc = json.loads(f.read_text())
        out.append(Started(doc["name"], doc["argv"], doc["env"], int(doc["node"])))
    return out


NODE_IPS = ["10.77.0.1", "10.77.0.2"]


def _pd_across_two_nodes() -> Topology:
    cfg = DeploymentConfig(mode=Mode.DISAGGREGATED, prefill=RoleConfig(role=Role.PREFILL),
                           decode=RoleConfig(role=Role.DECODE))
    topo = place(cfg, ClusterSpec(gpu="H200", nodes=2, gpus_per_node=1))
    assert [(i.name, i.head.node) for i in topo.instances] == [("prefill-0", 0), ("decode-0", 1)]
    return topo


def test_router_and_servers_get_the_nodes_addresses_expanded(tmp_path: Path) -> None:
    """The router line once sent ``'http://${NODE1_IP}:8101'`` in single quotes: vllm-router got that text.
    Run by bash on each node, every ``${NODEn_IP}`` reaches the processes expanded."""
    from vllm_router.launch_router import parse_router_args

    topo = _pd_across_two_nodes()
    script = launch_script(topo, model=MODEL, platform=gpu_platform(), served_model_name=SERVED_NAME)
    assert "'http://${" not in script
    shellcheck(script, "P/D across two nodes")
    started = run_launch_script(script, tmp_path, nodes=2, node_ips=NODE_IPS, servers=2)
    (router,) = [p for p in started if p.name == "vllm-router"]
    assert router.node == 0
    ra = parse_router_args(router.argv)
    assert [u for u, _ in ra.prefill_urls] == [f"http://{NODE_IPS[0]}:8100"]
    assert ra.decode_urls == [f"http://{NODE_IPS[1]}:8101"]
    servers = {p.node: p for p in started if p.name == "vllm"}
    assert sorted(servers) == [0, 1] and len([p for p in started if p.name == "vllm"]) == 2  # one per node
    for n, p in servers.items():
        assert p.argv[0] == "serve"
        ns = parse_serve(p.argv[1:], f"node {n}")
        assert ns.port == 8100 + n and ns.kv_transfer_config.kv_connector == "NixlConnector"
        assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == NODE_IPS[n]
        assert p.env["CUDA_VISIBLE_DEVICES"] == "0"


def test_multi_node_dp_ranks_reach_the_head_by_its_expanded_address(tmp_path: Path) -> None:
    """A 16-GPU DEP instance over two nodes: the headless node gets the head's address and its own."""
    from vllm_router.launch_router import parse_router_args

    cfg = DeploymentConfig(mode=Mode.AGGREGATED, decode=RoleConfig(
        role=Role.MIXED, data_parallel_size=16, enable_expert_parallel=True))
    topo = place(cfg, ClusterSpec(gpu="H200", nodes=2, gpus_per_node=8))
    script = launch_script(topo, model=MODEL, platform=gpu_platform())
    shellcheck(script, "DEP16 over two nodes")
    started = run_launch_script(script, tmp_path, nodes=2, node_ips=NODE_IPS, servers=2)
    servers = {p.node: p for p in started if p.name == "vllm"}
    assert sorted(servers) == [0, 1]
    for n, p in servers.items():
        ns = parse_serve(p.argv[1:], f"node {n}")
        assert (ns.data_parallel_address, ns.headless, ns.data_parallel_start_rank or 0) == (NODE_IPS[0], n == 1,
                                                                                              8 * n)
        assert p.env["VLLM_HOST_IP"] == NODE_IPS[n]
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in p.env  # aggregated: no KV transfer
    (router,) = [p for p in started if p.name == "vllm-router"]
    assert parse_router_args(router.argv).worker_urls == [f"http://{NODE_IPS[0]}:8100"]


def test_one_node_script_needs_no_argument_and_refuses_another_node(tmp_path: Path) -> None:
    topo = place(DeploymentConfig(mode=Mode.AGGREGATED, decode=RoleConfig(role=Role.MIXED)),
                 ClusterSpec(gpu="H200", nodes=1, gpus_per_node=8))
    script = launch_script(topo, model=MODEL, platform=gpu_platform())
    started = run_launch_script(script, tmp_path, nodes=1, servers=1)
    assert sorted(p.name for p in started) == ["vllm", "vllm-router"]
    p = subprocess.run(["bash", str(tmp_path / "launch.sh"), "1"], capture_output=True, text=True, check=False,
                       cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and "NODE: 1 is not a node" in p.stderr, p.stderr


def test_two_node_script_needs_the_node_and_its_addresses(tmp_path: Path) -> None:
    script = launch_script(_pd_across_two_nodes(), model=MODEL, platform=gpu_platform())
    path = tmp_path / "launch.sh"
    path.write_text(script)
    for argv, env, words in ((["bash", str(path)], {}, "usage: bash launch.sh NODE"),
                             (["bash", str(path), "1"], {"NODE0_IP": "10.0.0.1"}, "NODE1_IP"),
                             (["bash", str(path), "2"], {}, "NODE: 2 is not a node")):
        p = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path,
                           env={"PATH": "/usr/bin:/bin", **env})
        assert p.returncode != 0 and words in p.stderr, (argv, p.stderr)
        assert not list(tmp_path.glob("*.log")), "a server started before the script's checks"


def _router_help_flags(cmd: list[str]) -> set[str]:
    out = subprocess.run([*cmd, "--help"], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{shlex.join(cmd)} --help failed: {out.stderr[-2000:]}"
    return set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", out.stdout))


def _resolve(cmd: list[str]) -> list[str]:
    """``vllm-router`` (the GPU platform's router) from this interpreter's environment, which CI never activates."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    exe = shutil.which(cmd[0], path=path)
    assert exe, f"{cmd[0]!r} is neither next to {sys.executable} nor on PATH (pip install vllm-router)"
    return [exe, *cmd[1:]]


@pytest.mark.parametrize("platform_name", PLATFORMS)
def test_router_flags_are_vllm_routers(platform_name: str) -> None:
    """Every flag ``router_args`` renders is one the installed vllm-router lists in ``--help``."""
    platform = platform_of(platform_name)
    known = _router_help_flags(_resolve(platform.router_cmd))
    assert {"--worker-urls", "--vllm-pd-disaggregation", "--prefill", "--decode"} <= known, sorted(known)
    rendered: set[str] = set()
    for name in preset_names():
        pre = preset(name)
        for cfg in sample(name):
            topo = place(cfg, pre.cluster)
            urls = {inst.name: f"http://10.0.0.1:{8100 + k}" for k, inst in enumerate(topo.instances)}
            rendered |= {a for a in router_args(topo, urls, host="0.0.0.0", port=8000, prometheus_port=9000)
                         if a.startswith("--")}
    unknown = rendered - known
    assert not unknown, f"router_args renders flags vllm-router does not have: {sorted(unknown)}"
    assert {"--vllm-pd-disaggregation", "--worker-urls"} <= rendered  # both modes were rendered
