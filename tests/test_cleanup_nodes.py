"""Crash cleanup on every recorded node: what a dead tuner left is stopped where it runs, by our mark only.

Real processes (``sleep`` under ``bash``, started as the executors start servers) stand in for vLLM; a
server whose leader was KILLed keeps its child alive in the group, as vLLM's engine cores outlive a killed API
server. The Ray tests use a one-node local cluster: the record names that node, so the stop runs as a Ray task
pinned there, and a node id the cluster does not know gives the line saying so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from executors.processes import procs
from executors.processes.cleanup import GONE, cleanup_resources

SERVER = ["bash", "-c", "sleep 300 & echo up; wait"]
ESCAPED = ["bash", "-c", "setsid sleep 300 & echo up; wait"]  # a child in a session of its own
#: As vllm-router and vLLM's engine cores do: ``setproctitle`` erases /proc/PID/environ, our mark with it.
_RENAME = "import setproctitle, time; setproctitle.setproctitle({title!r}); print('up', flush=True); time.sleep(300)"
RENAMED = [sys.executable, "-c", _RENAME.format(title="vllm::router")]
RENAMED_CHILD = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                 f"{_RENAME.format(title='VLLM::EngineCore')!r}], stdout=subprocess.DEVNULL); "
                 "print('up', flush=True); time.sleep(300)"]


def _start(run: Path, name: str, argv: list[str] = SERVER) -> procs.ManagedProcess:
    p = procs.start(argv, name=name, log_path=run / f"{name}.log")
    for _ in range(200):
        if "up" in p.tail(5).splitlines()[1:]:
            return p
        time.sleep(0.05)
    raise AssertionError(f"{name} did not start")


def _kill_leader(p: procs.ManagedProcess) -> int:
    """KILL the leader alone; its child lives on in the group. The child's pid."""
    (child,) = [q for q in procs.group_pids(p.pgid) if q != p.pid]
    os.kill(p.pid, signal.SIGKILL)
    p.popen.wait()
    return child


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[procs.ManagedProcess]]:
    """Every process a test starts; whatever cleanup missed is stopped here (by group id and by mark)."""
    ps: list[procs.ManagedProcess] = []
    yield ps
    for p in ps:
        for m in procs.marked_processes([str(p.log_path.resolve())]):
            os.kill(m.pid, signal.SIGKILL)
    procs.stop_all(ps, term_timeout=1.0)


def test_local_record_stops_led_headless_and_escaped_processes_and_leaves_strangers(tmp_path, started) -> None:
    run, other = tmp_path / "runs" / "dep-1", tmp_path / "runs" / "dep-10"
    led, headless, escaped = _start(run, "mixed-0"), _start(run, "decode-0"), _start(run, "prefill-0", ESCAPED)
    stranger = _start(other, "mixed-0")  # another deployment: its run folder only shares a string prefix
    started += [led, headless, escaped, stranger]
    child = _kill_leader(headless)
    (loose,) = [m.pid for m in procs.marked_processes([str(escaped.log_path.resolve())]) if m.pgid != escaped.pgid]
    res = {"executor": "local", "pgids": [led.pgid, headless.pgid, escaped.pgid, stranger.pgid],
           "log_paths": {p.name: str(p.log_path) for p in (led, headless, escaped)}, "run_dir": str(run),
           "kv_dir": str(tmp_path / "kv" / "dep-1")}
    (tmp_path / "kv" / "dep-1").mkdir(parents=True)

    lines = cleanup_resources(res, term_timeout_s=2.0)

    assert lines == [
        f"stopped process group {led.pgid} (mixed-0)",
        f"stopped process group {escaped.pgid} (prefill-0)",
        f"stopped 1 process of group {headless.pgid} whose leader had died (decode-0)",
        f"stopped process {loose} (prefill-0), marked by this study outside its recorded groups",
        f"left process group {stranger.pgid} alone: its leader is not a process this study started",
        f"removed KV folder {tmp_path / 'kv' / 'dep-1'}",
    ], lines
    assert not procs.pid_alive(child) and not procs.pid_alive(loose)
    for p in (led, headless, escaped):
        assert not procs.live_group_pids(p.pgid)
    assert procs.live_group_pids(stranger.pgid)


def test_renamed_and_unrecorded_processes_are_found_by_their_launch_record(tmp_path, started) -> None:
    """A router that renamed itself (no environment left to carry the mark), an engine core that renamed itself
    and outlived its killed leader, and a server started just before its tuner died (not yet in the record): all
    stopped by the launch records they wrote before exec. A stranger that reused the pid of an old launch record
    is left alone, without a word."""
    run = tmp_path / "runs" / "dep-1"
    router, engine = _start(run, "router", RENAMED), _start(run, "decode-0", RENAMED_CHILD)
    late = _start(run, "mixed-1")
    started += [router, engine, late]
    core = _kill_leader(engine)
    for pid in (router.pid, core):
        for _ in range(200):
            if procs.owner_mark(pid) is None:
                break
            time.sleep(0.05)
        assert procs.owner_mark(pid) is None and procs.pid_alive(pid)  # renamed: the environment mark is gone
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    start = int(Path(f"/proc/{stranger.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (run / "old.log.pid").write_text(  # an earlier process of this run, whose pid the stranger got
        f'{{"pid": {stranger.pid}, "start": {start - 1}, "boot": "{boot}"}}\n')
    res = {"executor": "local", "pgids": [router.pgid, engine.pgid], "run_dir": str(run),
           "log_paths": {p.name: str(p.log_path) for p in (router, engine)}}
    try:
        lines = cleanup_resources(res, term_timeout_s=2.0)
        assert sorted(lines) == sorted([
            f"stopped process group {router.pgid} (router)",
            f"stopped process group {late.pgid} (mixed-1)",
            f"stopped 1 process of group {engine.pgid} whose leader had died (decode-0)",
        ]), lines
        assert not procs.pid_alive(core)
        for p in (router, engine, late):
            assert not procs.live_group_pids(p.pgid)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_private_cluster_record_is_cleaned_here_without_ray(tmp_path, started) -> None:
    """A private Ray cluster died with its tuner (no address recorded): its node was this machine."""
    import ray

    assert not ray.is_initialized()
    run = tmp_path / "dep"
    p = _start(run, "decode-0-node0")
    started.append(p)
    _kill_leader(p)
    res = {"executor": "ray", "ray_address": None, "run_dir": str(run), "pgids": [p.pgid],
           "processes": [{"name": p.name, "node": "127.0.0.1", "node_id": "ab" * 28, "pgid": p.pgid,
                          "log_path": str(p.log_path)}], "log_paths": {p.name: str(p.log_path)},
           "placement_groups": ["cd" * 14]}

    lines = cleanup_resources(res, term_timeout_s=2.0)

    assert lines == [f"node 127.0.0.1: stopped 1 process of group {p.pgid} whose leader had died (decode-0-node0)",
                     f"placement groups {'cd' * 14}: no Ray address recorded; a local cluster dies with its tuner"]
    assert not procs.live_group_pids(p.pgid)


@pytest.fixture(scope="module")
def ray_node() -> Iterator[dict[str, str]]:
    """A one-node local Ray cluster: its node id and IP as Ray reports them."""
    import ray

    ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
               "address": ray.get_runtime_context().gcs_address}
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_recorded_node_is_cleaned_by_a_ray_task_there(tmp_path, started, ray_node) -> None:
    run = tmp_path / "dep"
    led, headless = _start(run, "prefill-0-node0"), _start(run, "decode-0-node0")
    started += [led, headless]
    child = _kill_leader(headless)
    recorded_ip = "192.0.2.1"  # not Ray's name for the node: a line naming Ray's IP was written by the task there
    res = {"executor": "ray", "ray_address": ray_node["address"], "run_dir": str(run), "kv_dir": str(run / "kv"),
           "pgids": [led.pgid, headless.pgid], "placement_groups": [],
           "processes": [{"name": p.name, "node": recorded_ip, "node_id": ray_node["node_id"], "pgid": p.pgid,
                          "log_path": str(p.log_path)} for p in (led, headless)],
           "log_paths": {p.name: str(p.log_path) for p in (led, headless)}}

    lines = cleanup_resources(res, term_timeout_s=2.0)

    node = f"node {ray_node['ip']}"
    assert lines == [f"{node}: stopped process group {led.pgid} (prefill-0-node0)",
                     f"{node}: stopped 1 process of group {headless.pgid} whose leader had died (decode-0-node0)"]
    led.popen.wait(timeout=10)
    assert not procs.live_group_pids(led.pgid) and not procs.live_group_pids(headless.pgid)
    assert not procs.pid_alive(child)


@pytest.mark.ray
def test_node_gone_from_the_cluster_is_named(tmp_path, started, ray_node) -> None:
    run = tmp_path / "dep"
    here = _start(run, "prefill-0-node0")
    started.append(here)
    res = {"executor": "ray", "ray_address": ray_node["address"], "run_dir": str(run), "pgids": [here.pgid, 99999],
           "processes": [
               {"name": here.name, "node": "192.0.2.1", "node_id": ray_node["node_id"], "pgid": here.pgid,
                "log_path": str(here.log_path)},
               {"name": "decode-0-node0", "node": "192.0.2.7", "node_id": "ee" * 28, "pgid": 99999,
                "log_path": str(run / "decode-0-node0.log")}]}

    lines = cleanup_resources(res, term_timeout_s=2.0)

    assert lines == [f"node {ray_node['ip']}: stopped process group {here.pgid} (prefill-0-node0)",
                     f"node 192.0.2.7: {GONE}"]
    assert GONE.startswith("not in the Ray cluster any more")
