"""The local executor: the deployment's processes as plain subprocesses of this machine (one node).

``deploy`` starts one ``vllm serve`` per instance (command lines from ``executors.vllm.render``, each in its own
process group, logging to a file under the run dir), waits for every ``/health``, then starts
``vllm-router`` in front of them and waits for it to answer. ``measure`` runs ``vllm bench serve`` once
per load level against the router (``executors.measuring.bench``) with a ``/metrics`` scrape of every instance
before and after (``executors.measuring.metrics``). ``teardown`` stops every process group (TERM, wait, KILL),
removes the shared-memory segments its servers mapped and the deployment's KV shared-storage folder;
it copes with a deployment that only half started.

Resources (pgids, ports, log paths, run dir) are written into ``Deployment.resources`` — and to
``resources.json`` in the deployment's folder — the moment each process starts, so a tuner that dies
can still find and stop them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from executors.base import Deployment, DeploymentFailed, FailureKind
from executors.measuring import bench, bench_zygote, metrics
from executors.measuring.loop import LevelRunner, ServerView
from executors.processes import procs
from executors.topology import Instance, NodeShard, Topology
from executors.vllm import server_standby
from executors.vllm.executor import VllmExecutor
from executors.vllm.platform import Platform
from executors.vllm.render import Endpoint, router_args, slot_env
from executors.vllm.serving import (
    compile_cache_env,
    engine_start_env,
    server_unhealthy,
    start_failure,
    wait_router,
)
from search_spaces import Workload
from search_spaces.workload import routing_env

__all__ = ["LocalExecutor"]


# ------------------------------------------------------------------------------------------ local executor
@dataclass
class _Running:
    name: str
    role: str
    proc: procs.ManagedProcess
    url: str | None = None


@dataclass
class _LocalHandle:
    dir: Path
    kv_dir: Path
    platform: Platform
    servers: list[_Running] = field(default_factory=list)
    router: _Running | None = None
    shm: set[str] = field(default_factory=set)
    zygote: bench_zygote.Zygote | None = None  # the levels' client, importing while the servers start


class LocalExecutor(VllmExecutor):
    """Runs a topology's instances and router as subprocesses of this machine (single node only)."""

    kind = "local"

    # ---------------------------------------------------------------- helpers
    @cached_property
    def _used_ports(self) -> set[int]:
        """Ports this executor handed out, never handed out again (a stopped server's may linger)."""
        return set()

    def _port(self) -> int:
        p = procs.free_port(self.host, self._used_ports)
        self._used_ports.add(p)
        return p

    def _record(self, dep: Deployment, name: str, proc: procs.ManagedProcess, port: int) -> None:
        r = dep.resources
        r["pgids"].append(proc.pgid)
        r["ports"].append(port)
        r["log_paths"][name] = str(proc.log_path)
        self._save(dep)

    def _check_node(self, topology: Topology) -> None:
        nodes = {s.node for inst in topology.instances for s in inst.shards}
        if nodes - {0}:
            raise DeploymentFailed(FailureKind.PLATFORM, "the local executor runs on one node; this topology "
                                   f"places instances on nodes {sorted(nodes)} (use the ray executor)")
        if self.platform.cpu_per_gpu_slot:
            cores = os.cpu_count() or 1
            need = max(g for inst in topology.instances for s in inst.shards for g in s.gpus) + 1
            if need > cores:
                raise DeploymentFailed(FailureKind.PLATFORM, f"the topology needs {need} CPU slots (one core "
                                       f"per GPU slot) and this machine has {cores} cores")

    def instance_command(self, inst: Instance, shard: NodeShard, port: int, platform: Platform,
                         topology: Topology) -> list[str]:
        return self._serve_command(inst, shard, Endpoint(host=self.host, port=port, bind_host=self.host), platform,
                                   topology)

    # ---------------------------------------------------------------- deploy
    @cached_property
    def _next(self) -> list[tuple[tuple[str, Path, Path, Platform], server_standby.Standby]]:
        """The next deployment's folders and its first server, started early (executors/vllm/server_standby.py)."""
        return []

    def deploy(self, topology: Topology) -> Deployment:
        t0 = time.monotonic()
        self._check_node(topology)
        standby = None
        if self._next:
            dirs, standby = self._next.pop()
            first = topology.instances[0]
            if not standby.matches(first.name, dirs[1], self._server_env(first, first.head, dirs[3])):
                standby.close(self.teardown_timeout_s)  # another shape of deployment: started as before
                standby = None
        _, ddir, kv_dir, platform = dirs if standby is not None else self._deployment_dirs()
        handle = _LocalHandle(ddir, kv_dir, platform)
        dep = Deployment(topology, resources={"executor": self.kind, "pgids": [], "ports": [], "log_paths": {},
                                              "run_dir": str(ddir), "kv_dir": str(kv_dir), "shm": [],
                                              "expert_routing": str(self.expert_routing)},
                         handle=handle)
        self._save(dep)  # the run folder first: the launch records of whatever starts next are under it
        try:
            self._start_servers(dep, handle, topology, platform, standby)
            standby = None
            self._start_zygote(dep, handle)
            self._wait_servers(handle, t0)
            handle.shm |= procs.shm_segments(itertools.chain.from_iterable(
                procs.group_pids(s.proc.pgid) for s in handle.servers))
            dep.resources["shm"] = sorted(handle.shm)
            self._start_router(dep, handle, topology)
        except BaseException:
            if standby is not None:  # never adopted (the deploy failed before its servers started)
                standby.close(self.teardown_timeout_s)
            self.teardown(dep)  # evaluate() only tears down what deploy returned: clean up here
            raise
        dep.url = handle.router.url if handle.router else None
        dep.timings.deploy_s = time.monotonic() - t0
        self._save(dep)
        self._start_standby(topology)
        return dep

    def _server_env(self, inst: Instance, shard: NodeShard, platform: Platform) -> dict[str, str]:
        return {**engine_start_env(platform), **platform.env, **routing_env(self.expert_routing),
                **slot_env(platform, shard.gpus), **compile_cache_env(self.run_dir, inst.name, self._cache_key)}

    def _start_servers(self, dep: Deployment, h: _LocalHandle, topology: Topology, platform: Platform,
                       standby: server_standby.Standby | None) -> None:
        """One ``vllm serve`` per instance; the first is the standby where ``deploy`` found a matching one."""
        for inst in topology.instances:
            shard = inst.head  # single node: one shard per instance
            port = self._port()
            argv = self.instance_command(inst, shard, port, platform, topology)
            if standby is not None:
                proc, standby = standby.adopt(argv), None
            else:
                proc = procs.start(argv, name=inst.name, log_path=h.dir / f"{inst.name}.log",
                                   env=self._server_env(inst, shard, platform), cwd=h.dir)
            h.servers.append(_Running(inst.name, inst.role.value, proc, f"http://{self.host}:{port}"))
            self._record(dep, inst.name, proc, port)

    def _start_standby(self, topology: Topology) -> None:
        """The next deployment's first server starts importing vLLM now, while this one is measured (a study's
        next deployment is most often of the same shape: executors/vllm/server_standby.py says why and when)."""
        if not server_standby.usable(self.platform):
            return
        dirs = self._deployment_dirs()
        first = topology.instances[0]
        try:
            self._next.append((dirs, server_standby.Standby(dirs[3], first.name, dirs[1],
                                                            self._server_env(first, first.head, dirs[3]))))
        except OSError:  # an optimisation only: the next deploy starts its servers as before
            pass

    def close(self) -> None:
        while self._next:
            self._next.pop()[1].close(self.teardown_timeout_s)

    def _start_zygote(self, dep: Deployment, h: _LocalHandle) -> None:
        """The bench zygote (executors/measuring/bench_zygote.py) starts with the servers: its ~20 s import of vLLM on a
        GPU host overlaps their start-up instead of the first level's (without it the H200's warm-ups read 28-34 s for a
        10 s bench run, the difference being this import)."""
        if not bench_zygote.usable(h.platform):
            return
        bdir = h.dir / "bench"
        bdir.mkdir(exist_ok=True)

        def started(pgid: int) -> None:
            dep.resources.setdefault("bench_pgids", []).append(pgid)
            self._save(dep)

        h.zygote = bench_zygote.Zygote(h.platform, bdir, started)
        h.zygote.start()

    def _wait_servers(self, h: _LocalHandle, t0: float) -> None:
        deadline = t0 + self.health_timeout_s
        for s in h.servers:
            assert s.url
            try:
                procs.wait_healthy(s.url, max(1.0, deadline - time.monotonic()), s.proc)
            except procs.ProcessExited as e:
                raise start_failure(s.name, e.returncode, e.reason, e.tail) from None
            except procs.HealthTimeout as e:
                raise DeploymentFailed(FailureKind.HEALTH_TIMEOUT, f"{s.name}: {e.reason}", e.tail) from None
            # a sibling that died while we waited for this one is a start failure too
            for other in h.servers:
                if other.proc.poll() is not None:
                    text = other.proc.tail(400)
                    raise start_failure(other.name, other.proc.poll(), procs.error_line(text)
                                        or procs.exit_reason("it", other.proc.poll(), text), other.proc.tail(80))

    def _start_router(self, dep: Deployment, h: _LocalHandle, topology: Topology) -> None:
        port, prom = self._port(), self._port()
        urls = {s.name: s.url for s in h.servers if s.url}
        argv = [*h.platform.router_cmd, *router_args(topology, urls, host=self.host, port=port,
                                                      prometheus_port=prom)]
        proc = procs.start(argv, name="router", log_path=h.dir / "router.log", env=h.platform.env, cwd=h.dir)
        h.router = _Running("router", "router", proc, f"http://{self.host}:{port}")
        self._record(dep, "router", proc, port)
        dep.resources["ports"].append(prom)
        wait_router(h.router.url, self.router_timeout_s, proc)

    # ---------------------------------------------------------------- measure
    def _check_alive(self, h: _LocalHandle) -> None:
        for s in [*h.servers, *([h.router] if h.router else [])]:
            rc = s.proc.poll()
            what = None if rc is None else f"exited with code {rc}"
            if rc is None and s.role != "router" and s.url:
                what = server_unhealthy(s.url)  # vLLM's API server outlives a dead engine core: ask /health
            if what is not None:
                text = s.proc.tail(400)
                said = procs.last_lines(text)
                reason = procs.error_line(text) or (f"{what}; it said last: {said}" if said else what)
                raise DeploymentFailed(FailureKind.CRASH, f"{s.name} died while serving: {reason}",
                                       s.proc.tail(80))

    @contextmanager
    def _levels(self, deployment: Deployment, workload: Workload, bdir: Path) -> Iterator[LevelRunner]:
        """Levels run here, forked from one zygote per deployment where the platform allows (closed after)."""
        h: _LocalHandle = deployment.handle
        bdir.mkdir(exist_ok=True)
        url = deployment.url or ""

        def run_level(spec: bench.LevelSpec) -> tuple[dict[str, Any], float]:
            run = bench.run_level(h.platform, workload, spec, url=url, model=self.served_model_name,
                                  tokenizer=str(self.model_path), out_dir=bdir, timeout_s=self.bench_timeout_s,
                                  on_start=started, zygote=zygote)
            return run.result, run.wall_s

        def started(pgid: int) -> None:  # recorded for crash cleanup, like the servers
            deployment.resources.setdefault("bench_pgids", []).append(pgid)
            self._save(deployment)

        # vLLM imported once per deployment, each level forked from it (executors/measuring/bench_zygote.py); started
        # with the servers where deploy could (``_start_zygote``)
        zygote = h.zygote
        if zygote is None and bench_zygote.usable(h.platform):
            zygote = h.zygote = bench_zygote.Zygote(h.platform, bdir, started)

        def marks() -> dict[str, int]:
            return {s.name: metrics.log_size(s.proc.log_path) for s in h.servers}

        def eplb(m: dict[str, int]) -> float | None:
            vals = [v for s in h.servers
                    if (v := metrics.eplb_balancedness(s.proc.log_path, m.get(s.name, 0))) is not None]
            return min(vals) if vals else None

        try:
            yield LevelRunner(run_level, lambda: self._check_alive(h),
                              [ServerView(s.name, s.role, s.url or "", str(s.proc.log_path)) for s in h.servers],
                              marks, eplb, str(self.model_path))
        finally:
            if zygote is not None:
                zygote.close()
                h.zygote = None

    # ---------------------------------------------------------------- teardown
    def teardown(self, deployment: Deployment) -> None:
        h: _LocalHandle | None = deployment.handle
        if h is None:
            return
        if h.zygote is not None:  # deployed, never measured (a failed start, an interrupt before the first level)
            h.zygote.close()
            h.zygote = None
        procs_all = ([h.router] if h.router else []) + list(reversed(h.servers))
        for s in h.servers:  # segments mapped right now (vLLM creates some per request batch)
            if s.proc.alive:
                h.shm |= procs.shm_segments(procs.group_pids(s.proc.pgid))
        stopped = procs.stop_all([s.proc for s in procs_all], self.teardown_timeout_s)
        removed = procs.remove_shm(h.shm)
        shutil.rmtree(h.kv_dir, ignore_errors=True)
        deployment.resources["stopped"] = stopped
        deployment.resources["shm_removed"] = removed
        self._save_after_teardown(deployment)


