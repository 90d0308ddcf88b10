"""The Ray executor: the deployment's processes started by Ray actors inside placement groups.

Without an address a private local cluster is started (``ray start --head`` as a session of its own, so a
signal to the tuner's process group never reaches Ray mid-teardown; on a machine without GPUs it declares the
cluster's GPU slots as logical GPUs, one CPU core each), else it connects to ``ray_address``; the
connection is kept across trials and ``close()`` disconnects and stops the private cluster.

Per deployment:

* one placement group per instance, one bundle ``{"GPU": n, "CPU": 0.01}`` per node shard
  (``STRICT_PACK`` for a single-node instance, ``STRICT_SPREAD`` across nodes otherwise: one shard a node);
* one ``NodeAgent`` actor (``executors.ray.agent``) per shard, scheduled into its bundle and holding the
  bundle's GPUs, so Ray's accounting hands each instance distinct GPU slots. The agent starts ``vllm serve`` (command lines from
  ``executors.vllm.render``; multi-node data parallelism as head + ``--headless`` ranks addressed at the head
  node's IP) as a process group it owns, reports pgid and port, and stops it. On GPUs the server
  inherits the ``CUDA_VISIBLE_DEVICES`` Ray gave the agent; on the CPU build the slot ids Ray assigned
  become ``VLLM_CPU_OMP_THREADS_BIND`` (one core per slot) and ``CUDA_VISIBLE_DEVICES`` is dropped;
* a service agent (no GPUs) that runs ``vllm-router``; ``vllm bench serve`` runs as a Ray task pinned
  to that agent's node, and registers its process group with the agent so teardown can stop it too.

Across nodes (docs/multinode.md) every server binds and is addressed by its own node's IP, with that node's
``VLLM_HOST_IP`` and, for NixlConnector, ``VLLM_NIXL_SIDE_CHANNEL_HOST`` and a side-channel port range checked
free on that node; ``port_base`` fixes the ports as the launch script does, checked where they are bound.
What the cluster did wrong — a placement timeout, a taken port, a lost node or agent — is
``FailureKind.ENVIRONMENT``; ``preflight`` compares the job's cluster with Ray's before the first trial
(``executors.ray.cluster``: connecting, checking, waiting on Ray).

Teardown (always; also for a half-started deployment): stop every group through its agent, kill the
agents, remove the placement groups. Placement-group ids, pgids (with each process's node and log), ports,
nodes and logs go into ``Deployment.resources`` as they appear.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors.measuring import bench
from executors.processes import procs
from executors.base import Deployment, DeploymentFailed, FailureKind
from executors.measuring.loop import LevelRunner, ServerView
from executors.vllm.platform import Platform
from executors.ray.agent import NodeAgent
from executors.ray.cluster import (
    check_cluster, environment_failure, has_gpus, init_ray, ray_get, release, stop_head,
)
from executors.vllm.render import DEFAULT_DP_RPC_PORT, Endpoint, fixed_ports, fixed_router_ports, router_args
from executors.vllm.serving import compile_cache_env, server_unhealthy, start_failure
from executors.topology import Instance, Topology
from executors.vllm.executor import VllmExecutor
from search_spaces import ClusterSpec, Mode, Workload
from search_spaces.workload import routing_env

BUNDLE_CPU = 0.01  # agents do no work themselves; the servers' cores are the GPU slots


@dataclass
class _Shard:
    instance: str
    role: str
    shard: int
    agent: Any
    info: dict[str, Any]
    proc_name: str


@dataclass
class _RayHandle:
    dir: Path
    kv_dir: Path
    platform: Platform
    pgs: list[Any] = field(default_factory=list)
    agents: list[Any] = field(default_factory=list)
    shards: list[_Shard] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)  # instance → API URL
    service: Any = None  # the router/bench agent
    bench_refs: list[Any] = field(default_factory=list)


class RayExecutor(VllmExecutor):
    """Places each instance with a placement group and starts its processes through Ray actors."""

    kind = "ray"

    def __init__(self, model_path: str | Path, *, ray_address: str | None = None, placement_timeout_s: float = 60,
                 port_base: int | None = None, **settings: Any) -> None:
        """``settings``: ``VllmExecutor``'s (platform, run dir, timeouts, host, …). ``ray_address``: the cluster to
        connect to (else ``RAY_ADDRESS``, else a private local cluster); ``port_base``: the launch script's fixed
        ports instead of free ones."""
        super().__init__(model_path, **settings)
        self.ray_address = ray_address
        self.placement_timeout_s = placement_timeout_s
        self.port_base = port_base
        self._head: procs.ManagedProcess | None = None  # the private local cluster we started, if any
        self._agent_cls: Any = None

    # ---------------------------------------------------------------- Ray connection
    def _address(self) -> str | None:
        return self.ray_address or os.environ.get("RAY_ADDRESS")

    def _ray(self, topology: Topology | None) -> Any:
        import ray

        if not ray.is_initialized():
            address, gpus = self._address(), None
            if not address:
                # no GPUs here (or the CPU build): the cluster's GPU slots become logical GPUs, one core each
                assert topology is not None, "a private local cluster is sized by the first topology"
                gpus = topology.cluster.total_gpus if self.platform.cpu_per_gpu_slot or not has_gpus() else None
            self._head = init_ray(address, logical_gpus=gpus, run_dir=self.run_dir)
        if self._agent_cls is None:
            self._agent_cls = ray.remote(max_concurrency=16)(NodeAgent)
        return ray

    def preflight(self, cluster: ClusterSpec) -> list[str]:
        """Before the first trial: the Ray cluster we connect to holds the job's cluster (``nodes`` alive nodes
        with ``gpus_per_node`` GPUs each) and every such node sees the model folder. Raises ``PreflightFailed``
        with one line; returns what it checked. A private local cluster is built from the job: nothing to check."""
        address = self._address()
        if not address:
            return []
        return check_cluster(self._ray(None), address, cluster, self.model_path)

    def close(self) -> None:
        import ray

        if self._head is not None:  # ours: disconnect, then stop its processes (a session of their own)
            if ray.is_initialized():
                ray.shutdown()
            stop_head(self._head)
        self._head = None
        self._agent_cls = None

    # ---------------------------------------------------------------- helpers
    def _slot_env(self, platform: Platform, info: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
        """(env, names to unset) for a server on the slots Ray gave its agent."""
        if not platform.cpu_per_gpu_slot:
            return {}, []  # the agent's CUDA_VISIBLE_DEVICES (set by Ray) is inherited as is
        ids = info["gpu_ids"]
        return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(ids)}, ["CUDA_VISIBLE_DEVICES"]

    # ---------------------------------------------------------------- deploy
    def deploy(self, topology: Topology) -> Deployment:
        t0 = time.monotonic()
        ray = self._ray(topology)
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        dep_id, ddir, kv_dir, platform = self._deployment_dirs()
        h = _RayHandle(ddir, kv_dir, platform)
        dep = Deployment(topology, handle=h, resources={
            "executor": self.kind, "placement_groups": [], "pgids": [], "processes": [], "ports": [], "log_paths": {},
            "nodes": {}, "run_dir": str(ddir), "kv_dir": str(kv_dir), "expert_routing": str(self.expert_routing),
            # where the placement groups live, for cleanup after a crash (a private local cluster: none)
            "ray_address": None if self._head is not None else self._address(),
            # and that private cluster's head, which outlives a tuner killed with SIGKILL (a session of its own)
            "ray_head_log": str(self._head.log_path) if self._head is not None else None})
        pd = topology.config.mode is Mode.DISAGGREGATED
        # servers on several nodes, or a cluster we only connected to: each binds its own node's address
        multi_node_cluster = topology.cluster.nodes > 1 or self._head is None
        try:
            # 1. placement groups and one agent per node shard (a shard per node: STRICT_SPREAD, never two on one)
            for inst in topology.instances:
                bundles = [{"GPU": float(len(s.gpus)), "CPU": BUNDLE_CPU} for s in inst.shards]
                pg = placement_group(bundles, strategy="STRICT_SPREAD" if inst.multi_node else "STRICT_PACK",
                                     name=f"{dep_id}-{inst.name}")
                h.pgs.append(pg)
                dep.resources["placement_groups"].append(pg.id.hex())
                self._save(dep)
            for pg, inst in zip(h.pgs, topology.instances, strict=True):
                if not pg.wait(self.placement_timeout_s):
                    raise DeploymentFailed(FailureKind.ENVIRONMENT, f"{inst.name}: placement group of "
                                           f"{[len(s.gpus) for s in inst.shards]} GPUs per node not placed within "
                                           f"{self.placement_timeout_s:.0f} s (cluster: {ray.cluster_resources()})")
            for pg, inst in zip(h.pgs, topology.instances, strict=True):
                for k, s in enumerate(inst.shards):
                    agent = self._agent_cls.options(
                        num_cpus=BUNDLE_CPU, num_gpus=len(s.gpus),
                        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=k),
                    ).remote()
                    h.agents.append(agent)
                    h.shards.append(_Shard(inst.name, inst.role.value, k, agent, {}, f"{inst.name}-node{k}"))
            infos = ray_get([s.agent.info.remote() for s in h.shards])
            for s, info in zip(h.shards, infos, strict=True):
                s.info = info
                dep.resources["nodes"][s.proc_name] = {"ip": info["ip"], "gpu_ids": info["gpu_ids"]}
            if platform.cpu_per_gpu_slot:
                for s in h.shards:
                    bad = [g for g in s.info["gpu_ids"] if int(g) >= s.info["cpu_count"]]
                    if bad:
                        raise DeploymentFailed(FailureKind.PLATFORM, f"{s.proc_name}: GPU slots {bad} have no "
                                               f"CPU core on its node ({s.info['cpu_count']} cores)")
            # 2. servers: every shard of every instance, then wait for each head's /health
            by_inst = {inst.name: [s for s in h.shards if s.instance == inst.name] for inst in topology.instances}
            heads: dict[str, _Shard] = {}
            nixl_on = pd and (topology.config.kv_connector or platform.kv_connector) == "NixlConnector"
            for k, inst in enumerate(topology.instances):
                shards = by_inst[inst.name]
                head_sh = shards[0]
                bind = head_sh.info["ip"] if multi_node_cluster else self.host
                port, rpc = self._ports(head_sh, bind, k, inst)
                head = Endpoint(host=bind, port=port, dp_rpc_port=rpc, bind_host=bind)
                h.urls[inst.name] = head.url
                heads[inst.name] = head_sh
                dep.resources["ports"] += [port] + ([rpc] if inst.multi_node else [])
                for sh, node_shard in zip(shards, inst.shards, strict=True):
                    # NIXL listens on VLLM_NIXL_SIDE_CHANNEL_PORT + the DP rank of each local engine, on each
                    # node: a base whose range is free *on that node* (checked there), so instances sharing
                    # a node never collide and a rank on a worker node never finds its port taken
                    nixl = (ray_get(sh.agent.free_block.remote(node_shard.local_ranks, sh.info["ip"])) -
                            node_shard.start_rank) if nixl_on else None
                    self._start_server(dep, h, inst, node_shard, sh, head, platform, topology, pd, nixl)
            self._wait_servers(h, heads, t0)
            # 3. router on a service agent (no GPUs), which also runs the bench levels
            h.service = self._agent_cls.options(num_cpus=0).remote()
            h.agents.append(h.service)
            sinfo = ray_get(h.service.info.remote())
            rhost = sinfo["ip"] if multi_node_cluster else self.host
            if self.port_base is None:
                rport, prom = ray_get(h.service.free_ports.remote(2, rhost))
            else:
                rport, prom = fixed_router_ports(self.port_base)  # the launch script's
                self._check_ports(h.service, rhost, [rport, prom], "router")
            argv = [*platform.router_cmd, *router_args(topology, h.urls, host=rhost, port=rport,
                                                       prometheus_port=prom)]
            dep.resources["ports"] += [rport, prom]
            dep.resources["nodes"]["router"] = {"ip": sinfo["ip"], "node_id": sinfo["node_id"]}
            self._start_recorded(dep, h.service, "router", sinfo, argv, dict(platform.env), str(ddir / "router.log"),
                                 str(ddir))
            router_url = f"http://{rhost}:{rport}"
            t_r = time.monotonic()
            for path in ("/health", "/v1/models"):
                res = ray_get(h.service.wait_healthy.remote(
                    "router", router_url, max(1.0, self.router_timeout_s - (time.monotonic() - t_r)), path))
                if not res["ok"]:
                    kind = FailureKind.START if res["kind"] == "exited" else FailureKind.HEALTH_TIMEOUT
                    raise DeploymentFailed(kind, f"router: {res['reason']}", res["tail"])
            dep.url = router_url
        except BaseException as e:
            self.teardown(dep)
            env_failure = environment_failure(e)
            if env_failure is not None:
                raise env_failure from None
            raise
        dep.timings.deploy_s = time.monotonic() - t0
        self._save(dep)
        return dep

    def _ports(self, head: _Shard, bind: str, k: int, inst: Instance) -> tuple[int, int]:
        """(API port, DP RPC port) of the k-th instance: free ports picked on its head's node, or with
        ``port_base`` the launch script's fixed ones (``port_base + k``, ``29550 + k``) checked there."""
        if self.port_base is None:
            port, rpc = ray_get(head.agent.free_ports.remote(2, bind))
            return port, rpc if inst.multi_node else DEFAULT_DP_RPC_PORT
        port, rpc = fixed_ports(self.port_base, k)
        self._check_ports(head.agent, bind, [port] + ([rpc] if inst.multi_node else []), head.proc_name)
        return port, rpc if inst.multi_node else DEFAULT_DP_RPC_PORT

    def _check_ports(self, agent: Any, bind: str, ports: list[int], who: str) -> None:
        taken = ray_get(agent.taken_ports.remote(ports, bind))
        if taken:
            raise DeploymentFailed(FailureKind.ENVIRONMENT, f"{who}: port {', '.join(map(str, taken))} is taken on "
                                   f"{bind} (executor.port_base fixes the ports; something else holds this one)")

    def _start_server(self, dep: Deployment, h: _RayHandle, inst: Instance, node_shard: Any, sh: _Shard,
                      head: Endpoint, platform: Platform, topology: Topology, pd: bool,
                      nixl_port: int | None = None) -> None:
        env, unset = self._slot_env(platform, sh.info)
        env = {**platform.env, **routing_env(self.expert_routing), **env, **compile_cache_env(self.run_dir, sh.proc_name, self._cache_key)}
        if nixl_port is not None:
            # vLLM's default side-channel host is localhost, which the prefill side advertises to decode
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = sh.info["ip"]
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(nixl_port)
        if head.bind_host not in ("127.0.0.1", "localhost"):
            env["VLLM_HOST_IP"] = sh.info["ip"]  # this node's address for vLLM's own connections
        log_path = str(h.dir / f"{sh.proc_name}.log")
        self._start_recorded(dep, sh.agent, sh.proc_name, sh.info,
                             self._serve_command(inst, node_shard, head, platform, topology), env, log_path,
                             str(h.dir), unset)
        if "shared_storage_path" in platform.kv_connector_extra and pd:
            ray_get(sh.agent.own_dir.remote(str(h.kv_dir)))

    def _start_recorded(self, dep: Deployment, agent: Any, name: str, info: dict[str, Any], argv: list[str],
                        env: dict[str, str], log_path: str, cwd: str, unset: Sequence[str] = ()) -> None:
        """Start a process through the agent on its node. Its node and log are recorded first: a tuner killed
        while the agent starts it leaves a record whose cleanup, on that node, finds the process by the launch
        record it writes beside its log before exec. Its group id is recorded once known."""
        entry: dict[str, Any] = {"name": name, "node": info["ip"], "node_id": info["node_id"], "log_path": log_path}
        dep.resources["processes"].append(entry)
        dep.resources["log_paths"][name] = log_path
        self._save(dep)
        r = ray_get(agent.start.remote(name, argv, env, log_path, cwd, list(unset)))
        entry |= {"pgid": r["pgid"], "log_path": r["log_path"]}
        dep.resources["pgids"].append(r["pgid"])
        dep.resources["log_paths"][name] = r["log_path"]
        self._save(dep)

    def _wait_servers(self, h: _RayHandle, heads: dict[str, _Shard], t0: float) -> None:
        deadline = t0 + self.health_timeout_s
        for name, sh in heads.items():
            res = ray_get(sh.agent.wait_healthy.remote(sh.proc_name, h.urls[name], max(1.0, deadline - time.monotonic())))
            if not res["ok"]:
                # the cause is often on another node (a headless rank that died first): every shard's error
                # line and log tail, read by the agent on its node, come back with the failure
                reason, tail = self._shard_report(h, name, res["reason"], res["tail"])
                if res["kind"] == "exited":
                    raise start_failure(sh.proc_name, res.get("returncode"), reason, tail)
                raise DeploymentFailed(FailureKind.HEALTH_TIMEOUT, f"{sh.proc_name}: {reason}", tail)
            self._check_shards(h, FailureKind.START)

    def _shard_report(self, h: _RayHandle, instance: str, reason: str, tail: str) -> tuple[str, str]:
        """``reason`` and ``tail`` of an instance's head, with the error lines and log tails of its other
        shards (their nodes' logs, fetched by their agents) when the instance spans nodes."""
        others = [s for s in h.shards if s.instance == instance][1:]
        if not others:
            return reason, tail
        parts, tails = [reason], [tail]
        for s in others:
            try:
                d = ray_get(s.agent.diagnose.remote(s.proc_name, 40), timeout=30)
            except Exception as e:  # noqa: BLE001 — an agent on a lost node: say so, keep the head's report
                parts.append(f"{s.proc_name} on {s.info.get('ip')}: no report ({str(e).splitlines()[0][:120]})")
                continue
            if d["error"]:
                parts.append(f"{s.proc_name} on {s.info.get('ip')}: {d['error']}")
            tails.append(f"===== {s.proc_name} on {s.info.get('ip')} =====\n{d['tail']}")
        return "; ".join(parts), "\n".join(tails)

    def _check_shards(self, h: _RayHandle, kind: FailureKind) -> None:
        """Raise ``kind`` when any server process of the deployment has exited."""

        agents = {id(s.agent): s.agent for s in h.shards}
        statuses = dict(zip(agents, ray_get([a.status.remote() for a in agents.values()]), strict=True))
        for s in h.shards:
            rc = statuses[id(s.agent)].get(s.proc_name)
            if rc is not None:
                d = ray_get(s.agent.diagnose.remote(s.proc_name))
                reason = f"{d['error'] or f'exited with code {rc}'} (on {s.info.get('ip')})"
                if kind is FailureKind.START:
                    raise start_failure(s.proc_name, rc, reason, d["tail"])
                raise DeploymentFailed(kind, f"{s.proc_name} died while serving: {reason}", d["tail"])

    # ---------------------------------------------------------------- measure
    def _check_alive(self, h: _RayHandle) -> None:
        self._check_shards(h, FailureKind.CRASH)
        for name, url in h.urls.items():
            what = server_unhealthy(url)
            if what is not None:
                sh = next(s for s in h.shards if s.instance == name)
                d = ray_get(sh.agent.diagnose.remote(sh.proc_name))
                raise DeploymentFailed(FailureKind.CRASH, f"{sh.proc_name} died while serving: {d['error'] or what}",
                                       d["tail"])
        if h.service is not None and ray_get(h.service.status.remote()).get("router") is not None:
            d = ray_get(h.service.diagnose.remote("router"))
            raise DeploymentFailed(FailureKind.CRASH, f"router died: {d['error'] or d['returncode']}", d["tail"])

    @contextmanager
    def _levels(self, deployment: Deployment, workload: Workload, bdir: Path) -> Iterator[LevelRunner]:
        """Levels run as tasks on the service agent's node; a lost node or agent is an environment failure."""
        import ray

        h: _RayHandle = deployment.handle
        url = deployment.url or ""
        heads = {inst.name: next(s for s in h.shards if s.instance == inst.name)
                 for inst in deployment.topology.instances}

        def run_level(spec: bench.LevelSpec) -> tuple[dict[str, Any], float]:
            ref = h.service.bench.remote(h.platform.model_dump_json(), workload.model_dump_json(), spec, url,
                                         self.served_model_name, str(self.model_path), str(bdir), self.bench_timeout_s)
            h.bench_refs.append(ref)
            try:
                out = ray_get(ref, timeout=self.bench_timeout_s + 120)
            except ray.exceptions.GetTimeoutError:
                raise bench.BenchFailed(
                    f"the bench task did not return within {self.bench_timeout_s + 120:.0f} s") from None
            except ray.exceptions.RayError as e:  # a lost agent or node is the environment's (the client is dead)
                raise bench.BenchFailed(f"the bench task failed: {str(e).splitlines()[0][:300]}",
                                        environment=environment_failure(e) is not None) from None
            finally:
                h.bench_refs.remove(ref)
            if not out["ok"]:
                raise bench.BenchFailed(out["reason"], out["tail"], environment=out.get("environment", False))
            # the driver's copy (the task may run on another node), under the name the task chose (``free_stem``):
            # on the driver's node it is the task's own file, written again, not a second level
            bdir.mkdir(parents=True, exist_ok=True)
            (bdir / f"{out['stem']}.json").write_text(json.dumps(out["result"]))
            return out["result"], out["wall_s"]

        def marks() -> dict[str, int]:
            return dict(zip(heads, ray_get([s.agent.log_size.remote(s.proc_name) for s in heads.values()]),
                            strict=True))

        def eplb(m: dict[str, int]) -> float | None:
            vals = ray_get([s.agent.eplb.remote(s.proc_name, m.get(n, 0)) for n, s in heads.items()])
            vals = [v for v in vals if v is not None]
            return min(vals) if vals else None

        servers = [ServerView(n, s.role, h.urls[n]) for n, s in heads.items()]
        try:
            yield LevelRunner(run_level, lambda: self._check_alive(h), servers, marks, eplb, str(self.model_path))
        except Exception as e:
            env_failure = environment_failure(e)
            if env_failure is not None:
                raise env_failure from None
            raise

    # ---------------------------------------------------------------- teardown
    def teardown(self, deployment: Deployment) -> None:
        h: _RayHandle | None = deployment.handle
        if h is None:
            return
        # a level interrupted mid-run (Ctrl-C) is cancelled; its group is stopped with its agent's others
        report = release(h.agents, h.pgs, h.bench_refs, self.teardown_timeout_s)
        shutil.rmtree(h.kv_dir, ignore_errors=True)  # single node: the driver sees it too
        deployment.resources.update(report)
        self._save_after_teardown(deployment)
