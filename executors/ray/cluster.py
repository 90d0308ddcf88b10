"""The Ray executor's side of the cluster: connecting (or starting a private local cluster), checking that the
cluster holds the job before the first trial, waiting on Ray without deafening Ctrl-C, telling a cluster
failure from a configuration's, and giving back a deployment's agents and placement groups.

Kept apart from ``executors.ray.executor`` (placing and running one deployment) because none of this depends on
a deployment: it is what any driver talking to this Ray cluster needs.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from executors.base import DeploymentFailed, FailureKind, PreflightFailed
from executors.processes import procs
from search_spaces import ClusterSpec

log = logging.getLogger(__name__)


#: Seconds a private local Ray head may take to start (seen: ~10 s on 2 busy cores).
HEAD_START_TIMEOUT_S = 120.0

#: The environment of a private head: no drain on SIGTERM. `ray start` drains its node for up to 30 s on SIGTERM
#: (for an autoscaler's preemption); ``stop_head`` signals the whole group, so the GCS the drain asks is already
#: gone and the head sat out the whole 30 s (34 s to stop, 4 s without). Our trials are torn down before the head
#: is stopped: there is nothing to drain.
NO_DRAIN = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def init_ray(address: str | None, *, logical_gpus: int | None, run_dir: Path) -> procs.ManagedProcess | None:
    """Connect Ray to ``address``, or without one start a private local cluster of this machine's cores with
    ``logical_gpus`` GPU slots (``None``: Ray detects the GPUs) and connect to it. Returns that cluster's head
    (``stop_head`` ends it), None when we only connected."""
    import ray

    # Ray's own INFO lines ("Connecting to existing Ray cluster…") would break the CLI's one-line answers
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    head = None
    if not address:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster: `ray status` works
        head, address = start_head(run_dir, logical_gpus=logical_gpus)
    try:
        with _signal_handlers_kept():
            ray.init(address=address, **kw)
    except BaseException:
        if head is not None:
            procs.stop(head, term_timeout=10)
        raise
    return head


@contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Ray's core worker installs its own SIGTERM handler in the driver (it logs the signal and dies on the spot);
    the tuner's — SIGTERM as Ctrl-C, so teardown runs — is put back after connecting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


def start_head(run_dir: Path, *, logical_gpus: int | None) -> tuple[procs.ManagedProcess, str]:
    """A private Ray head (GCS, raylet and every worker they fork) as a session of its own, so a signal to the
    tuner's process group — ``timeout``, a scheduler's SIGTERM, Ctrl-C in a terminal — never reaches Ray
    while the tuner tears its trial down through it (``ray.init(address="local")`` would fork them into the
    tuner's group and session, tied to its life). Returns the head process and its address."""
    ray_bin = Path(sys.executable).with_name("ray")
    port = procs.free_port()
    argv = [str(ray_bin) if ray_bin.exists() else shutil.which("ray") or "ray", "start", "--head", "--block",
            f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-cpus={os.cpu_count() or 1}",
            "--include-dashboard=false", "--disable-usage-stats"]
    if logical_gpus is not None:
        argv.append(f"--num-gpus={logical_gpus}")
    head = procs.start(argv, name="ray-head", log_path=run_dir / f"ray-head-{os.getpid()}.log",
                       env={"RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"), **NO_DRAIN})
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    while "Ray runtime started" not in head.tail(200):
        if head.poll() is not None or time.monotonic() > deadline:
            tail = head.tail(20)
            procs.stop(head, term_timeout=10)
            raise DeploymentFailed(FailureKind.ENVIRONMENT, f"the local Ray head did not start: "
                                   f"{procs.error_line(tail) or tail[-300:]}", tail)
        time.sleep(0.5)
    return head, f"127.0.0.1:{port}"


def stop_head(head: procs.ManagedProcess, term_timeout_s: float = 30.0) -> None:
    """Stop a head ``start_head`` started: its group (GCS, raylet, …), TERM then KILL; then Ray's workers, which
    run in process groups of their own inside the head's session and carry its mark (they exit by themselves
    once the raylet is gone, seconds later)."""
    procs.stop(head, term_timeout=term_timeout_s)
    workers = procs.marked_processes([str(Path(head.log_path).resolve())])
    if workers:
        procs.stop_strays(pids=[m.pid for m in workers], term_timeout=5.0)


def check_cluster(ray: Any, address: str, cluster: ClusterSpec, model_path: Path) -> list[str]:
    """The Ray cluster at ``address`` holds ``cluster`` (``nodes`` alive nodes with ``gpus_per_node`` GPUs each)
    and every such node sees the model folder; ``PreflightFailed`` (one line) when not."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    gpu_nodes = sorted(((n["NodeManagerAddress"], int(n.get("Resources", {}).get("GPU", 0)), n["NodeID"])
                        for n in nodes if n.get("Resources", {}).get("GPU", 0) >= 1), key=lambda t: t[0])
    fit = [g for g in gpu_nodes if g[1] >= cluster.gpus_per_node]
    seen = ", ".join(f"{ip}: {g} GPU{'s' if g != 1 else ''}" for ip, g, _ in gpu_nodes) or "no node with GPUs"
    if len(fit) < cluster.nodes:
        raise PreflightFailed(f"cluster: the job asks for {cluster.nodes} node(s) × {cluster.gpus_per_node} "
                              f"GPUs; the Ray cluster at {address} has {seen}")
    check = ray.remote(num_cpus=0, max_retries=0)(model_on_node)
    found = ray_get([check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False))
                     .remote(str(model_path)) for _, _, nid in fit], timeout=120)
    missing = [ip for (ip, _, _), ok in zip(fit, found, strict=True) if not ok]
    if missing:
        raise PreflightFailed(f"model: {model_path} (a folder with config.json) is not on node(s) "
                              f"{', '.join(missing)}; every node that may run a server must see it")
    return [f"Ray cluster at {address}: {seen}; model found on {len(fit)} node(s)"]


def ray_get(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get`` in one-second slices, so Ctrl-C reaches the driver at once (a plain ``ray.get`` blocks it)."""
    import ray

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        try:
            return ray.get(refs, timeout=step)
        except ray.exceptions.GetTimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise


def model_on_node(path: str) -> bool:
    """A Ray task on one node: does this node see the model folder?"""
    return (Path(path) / "config.json").is_file()


def environment_failure(e: BaseException) -> DeploymentFailed | None:
    """A Ray error that says the cluster failed (an agent's node or process died), not the configuration."""
    import ray

    lost = tuple(getattr(ray.exceptions, n) for n in ("RayActorError", "NodeDiedError", "ActorUnavailableError",
                                                      "ObjectLostError", "RaySystemError") if hasattr(ray.exceptions, n))
    if isinstance(e, lost):
        return DeploymentFailed(FailureKind.ENVIRONMENT, f"the Ray cluster lost a node or agent: "
                                f"{str(e).splitlines()[0][:300]}")
    return None


def has_gpus() -> bool:
    """Whether this machine has NVIDIA GPUs (then Ray detects them itself)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def release(agents: Sequence[Any], pgs: Sequence[Any], bench_refs: Sequence[Any], term_timeout_s: float) -> dict[str, Any]:
    """Give back what one deployment holds on the cluster, whatever state it is in: cancel running tasks
    (``bench_refs``), have every agent stop its process groups (all at once), kill the agents, remove the
    placement groups. Returns what was stopped, the shared-memory segments removed, and any errors."""
    import ray
    from ray.util import remove_placement_group

    report: dict[str, Any] = {}
    for ref in list(bench_refs):
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001
            pass
    stops = []
    for agent in agents:
        try:
            stops.append(agent.stop_all.remote(term_timeout_s))
        except Exception as e:  # noqa: BLE001
            log.warning("stop_all could not be sent: %s", e)
    for ref in stops:
        try:
            r = ray.get(ref, timeout=2 * term_timeout_s + 30)
            report.setdefault("stopped", {}).update(r["stopped"])
            report.setdefault("shm_removed", []).extend(r["shm_removed"])
        except Exception as e:  # noqa: BLE001 — an agent that died took its own groups' parent with it
            log.warning("an agent did not stop its processes: %s", e)
            report.setdefault("errors", []).append(str(e).splitlines()[0][:300])
    for agent in agents:
        try:
            ray.kill(agent, no_restart=True)
        except Exception:  # noqa: BLE001
            pass
    for pg in pgs:
        try:
            remove_placement_group(pg)
        except Exception as e:  # noqa: BLE001
            report.setdefault("errors", []).append(f"placement group {pg.id.hex()}: {e}")
    return report
