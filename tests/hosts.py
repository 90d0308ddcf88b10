"""Two hosts on one machine: network namespaces joined by a bridge, a Ray head in one and a Ray worker in the
other — a real two-node Ray cluster (distinct IPs, real TCP between them) for the multi-node tests.

Test scaffolding, not product code. Needs root and iproute2 (``.ci/run`` runs as root; ``scripts/setup.sh``
installs iproute2). Each host sees the other through its ``eth0`` (the same interface name on both, as on a
real cluster, so one ``GLOO_SOCKET_IFNAME`` fits every node) on a private /24 used only among them; nothing
is routed to or from the machine's own network. Each host declares one "GPU" slot: Ray's GPU id on host k is
``k`` (``CUDA_VISIBLE_DEVICES`` at ``ray start``), so the CPU build binds host k's server to core k.

Everything is removed by ``TwoHosts.close`` — on success, failure and Ctrl-C — by what we own: every process
inside our namespaces (``ip netns pids``), then the namespaces and the bridge. Nothing is stopped by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY_PORT = 6390  # outside Ray's worker port range (10002-19999)


def available() -> str | None:
    """``None`` when namespaces can be made here, else why not (the test is skipped, or fails under CI)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


@dataclass
class Host:
    name: str  # the network namespace
    ip: str
    gpu: int

    def cmd(self, *argv: str) -> list[str]:
        """``argv`` run inside this host."""
        return ["ip", "netns", "exec", self.name, *argv]

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]

    def processes(self) -> list[str]:
        """``pid command line`` of every process alive inside this host."""
        rows = []
        for pid in self.pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            rows.append(f"{pid} {cmd.strip()[:200]}")
        return rows


@dataclass
class TwoHosts:
    """Host A runs the Ray head (and the tuner, which must run on a Ray node); host B a Ray worker."""

    root: Path
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    subnet: str = "10.77.77"
    hosts: list[Host] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    bridge: str = ""

    @property
    def a(self) -> Host:
        return self.hosts[0]

    @property
    def b(self) -> Host:
        return self.hosts[1]

    @property
    def ray_address(self) -> str:
        return f"{self.a.ip}:{RAY_PORT}"

    def start(self, python: str = sys.executable, ray_timeout_s: float = 90) -> TwoHosts:
        self.bridge = f"dabr{self.tag}"
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for k, letter in enumerate("ab"):
                host = Host(f"da{self.tag}{letter}", f"{self.subnet}.{k + 1}", k)
                _ip("netns", "add", host.name)
                self.hosts.append(host)
                veth = f"da{self.tag}{letter}h"
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.name)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                for args in (("addr", "add", f"{host.ip}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                             ("link", "set", "lo", "up")):
                    _ip("netns", "exec", host.name, "ip", *args)
            self._ray(python, ray_timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def _ray(self, python: str, timeout_s: float) -> None:
        ray = str(Path(python).with_name("ray"))
        # Ray kills a dead worker's child processes itself by default; clusters that turn this off (and agents
        # whose raylet died) leave the servers running when the tuner dies. Off here, so that what stops
        # them after a crash is the tuner's own per-node cleanup — the case the tests are about.
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_kill_child_processes_on_worker_exit": "0"}
        for host in self.hosts:
            role = (["--head", "--port", str(RAY_PORT), "--include-dashboard", "false"] if host is self.a
                    else ["--address", self.ray_address])
            logf = open(self.root / f"ray-{host.name}.log", "w")  # noqa: SIM115 — handed to the child
            argv = host.cmd(ray, "start", "--block", *role, "--node-ip-address", host.ip, "--num-cpus", "1",
                            "--num-gpus", "1", "--object-store-memory", str(200 * 1024 * 1024),
                            "--temp-dir", f"/tmp/ray-{host.name}", "--disable-usage-stats")
            p = subprocess.Popen(argv, env={**env, "CUDA_VISIBLE_DEVICES": str(host.gpu)}, stdout=logf,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            self.groups.append(p.pid)
            if host is self.a:
                self._wait_nodes(1, python, timeout_s)
        self._wait_nodes(2, python, timeout_s)

    def _wait_nodes(self, n: int, python: str, timeout_s: float) -> None:
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                 "print(sum(1 for x in ray.nodes() if x['Alive']))")
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            r = subprocess.run(self.a.cmd(python, "-c", probe, self.ray_address), capture_output=True, text=True,
                               env={**os.environ, "RAY_AUTH_MODE": "disabled"}, timeout=60)
            last = (r.stdout + r.stderr).strip()
            if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(n)]:
                return
            time.sleep(2)
        raise RuntimeError(f"the Ray cluster did not reach {n} nodes in {timeout_s:.0f} s: {last[-2000:]}")

    def close(self) -> list[str]:
        """Stop every process in our namespaces (TERM, then KILL), remove namespaces and bridge; returns
        what was still running when it was asked to stop (for the test's report). Ray's own processes take
        10-15 s to leave after a TERM (a raylet whose GCS went first keeps reconnecting): they are scaffolding
        with nothing to save, so they get 5 s before the KILL."""
        left: list[str] = []
        for host in self.hosts:
            left += [f"{host.name}: {p}" for p in host.processes()]
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            pids = [p for h in self.hosts for p in h.pids()] + [g for g in self.groups if _alive(g)]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(h.pids() for h in self.hosts):
                time.sleep(0.5)
        for g in self.groups:  # the `ip netns exec` leaders and anything they left in their groups
            try:
                os.killpg(g, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for host in self.hosts:
            _ip("netns", "del", host.name, check=False)
            shutil.rmtree(f"/tmp/ray-{host.name}", ignore_errors=True)
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()
        return left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
