"""The Ray executor's agent: an actor on one node that starts, watches and stops that node's processes.

``executors.ray.executor`` schedules one ``NodeAgent`` into each placement-group bundle (and one without GPUs
for the router and the load generator); the agent owns the process groups it starts there, so teardown — or the
agent's death — stops exactly them. Everything it answers is plain data (dicts, lists), as Ray carries it
between nodes. Kept apart from the executor, which runs on the driver, because this code runs on the nodes.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from executors.measuring import bench, bench_zygote, metrics
from executors.processes import procs
from executors.vllm.platform import Platform
from search_spaces import Workload


class NodeAgent:
    """Lives on one node (inside a placement-group bundle); owns the process groups it starts there."""

    def __init__(self) -> None:
        self.procs: dict[str, procs.ManagedProcess] = {}
        self.foreign: dict[str, int] = {}  # groups started for others on this node (the bench levels)
        self.zygote: bench_zygote.Zygote | None = None  # the service node's bench levels fork from it
        self.shm: set[str] = set()
        self.dirs: list[str] = []

    def info(self) -> dict[str, Any]:
        import ray

        return {"ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                "cpu_count": os.cpu_count() or 1}

    def free_ports(self, n: int, host: str = "127.0.0.1") -> list[int]:
        out: list[int] = []
        for _ in range(n):
            out.append(procs.free_port(host, out))
        return out

    def taken_ports(self, ports: list[int], host: str) -> list[int]:
        """Which of ``ports`` cannot be bound on this node now (checked where the server will bind them)."""
        return [p for p in ports if not bindable(host, p)]

    def free_block(self, n: int, host: str, first: int = 5600) -> int:
        """The first port ``p >= first`` with ``p .. p+n-1`` all bindable on this node (NIXL's per-rank range)."""
        p = first
        while p + n < 65536:
            bad = self.taken_ports(list(range(p, p + n)), host)
            if not bad:
                return p
            p = max(bad) + 1
        raise RuntimeError(f"no {n} consecutive free ports from {first}")

    def start(self, name: str, argv: list[str], env: dict[str, str], log_path: str, cwd: str,
              unset: Sequence[str] = ()) -> dict[str, Any]:
        Path(cwd).mkdir(parents=True, exist_ok=True)
        full = {k: v for k, v in os.environ.items() if k not in set(unset)}
        full.update(env)
        p = procs.start(argv, name=name, log_path=log_path, env=full, cwd=cwd, inherit_env=False)
        self.procs[name] = p
        return {"pgid": p.pgid, "pid": p.pid, "log_path": str(p.log_path)}

    def register(self, name: str, pgid: int) -> None:
        self.foreign[name] = pgid

    def forget(self, name: str) -> None:
        self.foreign.pop(name, None)

    def own_dir(self, path: str) -> None:
        self.dirs.append(path)

    def wait_healthy(self, name: str, url: str, timeout: float, path: str = "/health") -> dict[str, Any]:
        p = self.procs[name]
        try:
            waited = procs.wait_healthy(url, timeout, p, path=path)
        except procs.ProcessExited as e:
            return {"ok": False, "kind": "exited", "returncode": e.returncode, "reason": e.reason, "tail": e.tail}
        except procs.HealthTimeout as e:
            return {"ok": False, "kind": "timeout", "reason": e.reason, "tail": e.tail}
        self.shm |= procs.shm_segments(procs.group_pids(p.pgid))
        return {"ok": True, "waited_s": waited}

    def status(self) -> dict[str, int | None]:
        return {n: p.poll() for n, p in self.procs.items()}

    def diagnose(self, name: str, lines: int = 80) -> dict[str, Any]:
        p = self.procs[name]
        return {"returncode": p.poll(), "error": procs.error_line(p.tail(400)), "tail": p.tail(lines)}

    def log_size(self, name: str) -> int:
        return metrics.log_size(self.procs[name].log_path)

    def eplb(self, name: str, since: int) -> float | None:
        return metrics.eplb_balancedness(self.procs[name].log_path, since)

    def bench(self, platform_json: str, workload_json: str, spec: bench.LevelSpec, url: str, model: str,
              tokenizer: str, out_dir: str, timeout_s: float) -> dict[str, Any]:
        """One level of ``vllm bench serve`` on this node, forked from the node's zygote where the platform
        allows (executors/measuring/bench_zygote.py); its groups are registered here, so ``stop_all`` stops them."""
        platform = Platform.model_validate_json(platform_json)
        if self.zygote is None and bench_zygote.usable(platform):
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            self.zygote = bench_zygote.Zygote(platform, out_dir, lambda g: self.register("bench-zygote", g))
        return bench_level(platform, Workload.model_validate_json(workload_json), spec, url, model, tokenizer,
                           out_dir, timeout_s, self.register, self.forget, self.zygote)

    def stop_all(self, term_timeout: float) -> dict[str, Any]:
        foreign = dict(self.foreign)  # first: closing the zygote ends a running level's wait, which forgets it
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        for p in self.procs.values():
            if p.alive:
                self.shm |= procs.shm_segments(procs.group_pids(p.pgid))
        # every group of this node at once: teardown waits for the slowest, not the sum
        groups = [(pgid, None) for pgid in foreign.values()] + [(p.pgid, p.popen) for p in self.procs.values()]
        gone = procs.stop_groups(groups, term_timeout)
        stopped = {name: gone[pgid] for name, pgid in foreign.items()}
        stopped |= {name: gone[p.pgid] for name, p in self.procs.items()}
        removed = procs.remove_shm(self.shm)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        return {"stopped": stopped, "shm_removed": removed}


def bench_level(platform: Platform, workload: Workload, spec: bench.LevelSpec, url: str, model: str, tokenizer: str,
                out_dir: str, timeout_s: float, register: Callable[[str, int], None], forget: Callable[[str], None],
                zygote: bench_zygote.Zygote | None) -> dict[str, Any]:
    """One ``vllm bench serve`` run (``bench.run_level``), its group registered (``register(tag, pgid)``) while
    it runs; the outcome as plain data for the driver."""
    bdir = Path(out_dir)
    bdir.mkdir(parents=True, exist_ok=True)
    tag = f"bench-{spec.name}"
    try:
        run = bench.run_level(platform, workload, spec, url=url, model=model, tokenizer=tokenizer, out_dir=bdir,
                              timeout_s=timeout_s, on_start=lambda pgid: register(tag, pgid), zygote=zygote)
    except bench.BenchFailed as e:
        return {"ok": False, "reason": e.reason, "tail": e.tail, "environment": e.environment}
    finally:
        forget(tag)
    return {"ok": True, "result": run.result, "wall_s": run.wall_s, "stem": Path(run.log_path).stem}


def bindable(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` now, as a server binds it (``SO_REUSEADDR``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT does not count
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
