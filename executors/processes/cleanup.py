"""Stopping what a trial left running when its tuner died: from the resources record alone, on every node.

The record (``Deployment.resources``, stored with the trial as each process starts) names process groups (with
the Ray node each runs on), log paths, a run folder, a KV folder, shared-memory segments, Ray placement groups
and the private Ray cluster the tuner started, if it did (``ray_head_log``: stopped once the trial's processes
are). A process id means something only on its own node, so each recorded node's groups are stopped by a Ray
task pinned to that node. A record without nodes (the local executor) is this machine's; so is a node that is
not in a reachable cluster but whose address is one of this machine's (a private cluster that died with its
tuner).

Nothing is stopped by name or by id alone. A group is stopped when its leader is ours: it is the process of a
launch record (``<log>.pid``, written by the process itself before it ran its command: same pid, boot and start
time) whose log is recorded or under the recorded run folder — which finds too a process started just before its
tuner died, before the record named it, and one that renamed itself (``vllm::router``), erasing its environment
— or it carries our environment mark (``procs.OWNER_ENV``: such a log path). An id reused by a stranger is left
alone. When the leader died but its engine processes live on, the group has no leader to ask: its members are
those that started after the recorded leader, in its boot, or that carry the mark (inherited by every child).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import Any

from executors.processes import procs

GONE = "not in the Ray cluster any more — its processes died with it or must be stopped by hand"


def cleanup_resources(res: dict[str, Any], *, term_timeout_s: float = 15.0, ray_address: str | None = None) -> list[str]:
    """Stop and remove what ``res`` records; one line per action, for the user and the database.

    Lines about a recorded node start with ``node <IP>: `` (the IP as Ray reports it where a task ran there);
    a record without nodes is this machine's and its lines have no prefix. ``ray_address`` overrides the
    recorded one; an existing Ray connection is used as is and left open, one made here is closed.
    """
    here, remote = _plan(res)
    done: list[str] = []
    if here is not None:
        done += _stop_here(here, term_timeout_s)
    pgs = res.get("placement_groups") or []
    if remote or pgs:
        done += _on_cluster(remote, pgs, ray_address or res.get("ray_address"), term_timeout_s)
    head = res.get("ray_head_log")
    if head and not res.get("ray_address"):  # the private cluster its dead tuner started here: last, once unused
        done += _stop_here({"node": None, "groups": {}, "logs": {str(head): "private Ray cluster"}, "run_dir": None,
                            "kv_dir": None}, term_timeout_s)
    kv = res.get("kv_dir")
    if kv and Path(kv).exists():
        shutil.rmtree(kv, ignore_errors=True)
        done.append(f"removed KV folder {kv}")
    removed = procs.remove_shm(res.get("shm") or [])
    if removed:
        done.append(f"removed shared memory {', '.join(removed)}")
    return done


def _plan(res: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """(this machine's share, {Ray node id: that node's share}); a share is what ``_stop_here`` needs.

    Groups and logs the record names without a node are this machine's. This machine is searched by mark
    only when the record has no noded process at all: otherwise the run folder's processes are the nodes'.
    """
    def share(node: str | None) -> dict[str, Any]:
        return {"node": node, "groups": {}, "logs": {}, "run_dir": res.get("run_dir"), "kv_dir": None}

    here, remote = share(None), {}
    noded_groups: set[int] = set()
    noded_logs: set[str] = set()
    for p in res.get("processes") or []:
        nid = p.get("node_id")
        s = remote.setdefault(nid, share(p.get("node")) | {"kv_dir": res.get("kv_dir")}) if nid else here
        if p.get("pgid") and int(p["pgid"]) > 1:
            s["groups"][int(p["pgid"])] = p.get("name") or ""
            noded_groups |= {int(p["pgid"])} if nid else set()
        if p.get("log_path"):
            s["logs"][str(p["log_path"])] = p.get("name") or Path(p["log_path"]).stem
            noded_logs |= {str(p["log_path"])} if nid else set()
    for g in [*(res.get("pgids") or []), *(res.get("bench_pgids") or [])]:
        if int(g) > 1 and int(g) not in noded_groups:
            here["groups"].setdefault(int(g), "")
    for name, path in (res.get("log_paths") or {}).items():
        if str(path) not in noded_logs:
            here["logs"].setdefault(str(path), str(name))
    wanted = here["groups"] or (not remote and (here["logs"] or here["run_dir"]))
    return (here if wanted else None), remote


def _resolved(path: str) -> str:
    return str(Path(path).resolve())


def _stop_here(share: dict[str, Any], term_timeout_s: float) -> list[str]:
    """Stop one node's share of the record on the machine this runs on (the node itself)."""
    tag = f"node {share['node']}: " if share.get("node") else ""
    logs = {_resolved(p): n for p, n in share["logs"].items()}
    run_dir = _resolved(share["run_dir"]) if share.get("run_dir") else None
    groups = {int(g): n for g, n in share["groups"].items()}
    mine = os.getpgrp()

    def ours(mark: str) -> bool:
        return mark in logs or bool(run_dir and (mark + "/").startswith(run_dir.rstrip("/") + "/"))

    def name(g: int, mark: str) -> str:
        return groups.get(g) or logs.get(mark) or Path(mark).stem

    launched = {g: r for g, r in procs.launches(logs, run_dir).items() if ours(r.log)}
    lines: list[str] = []
    alone: list[str] = []
    led: dict[int, str] = {}
    for g in sorted(groups.keys() | launched.keys()):
        if g <= 1 or g == mine or g not in procs.live_group_pids(g):
            continue  # nothing left, or a leader that died: its members are found below
        # a group known by its launch record alone may be another node's (nodes that are network namespaces of
        # one machine share its files and pids): only the record, which checks the namespace, vouches for it
        mark = procs.launched_mark(g, launched) or (procs.owner_mark(g) if g in groups else None)
        if mark is None or not ours(mark):
            if g in groups:  # a launch record alone whose pid now runs a stranger says nothing
                alone.append(f"{tag}left process group {g} alone: its leader is not a process this study started")
            continue
        led[g] = name(g, mark)
    headless: dict[int, tuple[str, int]] = {}
    loose: dict[int, str] = {}
    for m in [*procs.launched_members(launched), *procs.marked_processes(logs, run_dir)]:
        if m.pgid in led or m.pgid in headless or m.pgid == mine:
            continue
        if (m.pgid in groups or m.pgid in launched) and not procs.pid_alive(m.pgid):
            headless[m.pgid] = (name(m.pgid, m.mark), len(procs.live_group_pids(m.pgid)))
        else:
            loose[m.pid] = name(-1, m.mark)
    if led or headless or loose:
        left = procs.stop_strays([*led, *headless], loose, term_timeout_s)
        for g, n in led.items():
            lines.append(f"{tag}stopped process group {g} ({n})" + _still(g in left))
        for g, (n, count) in headless.items():
            lines.append(f"{tag}stopped {count} process{'es' if count != 1 else ''} of group {g} whose leader had "
                         f"died ({n})" + _still(g in left))
        for pid, n in loose.items():
            lines.append(f"{tag}stopped process {pid} ({n}), marked by this study outside its recorded groups"
                         + _still(pid in left))
    lines += alone
    kv = share.get("kv_dir")
    if kv and Path(kv).exists():
        shutil.rmtree(kv, ignore_errors=True)
        lines.append(f"{tag}removed KV folder {kv}")
    return lines


def _still(alive: bool) -> str:
    return " (still alive after KILL)" if alive else ""


def _stop_on_node(share: dict[str, Any], term_timeout_s: float) -> list[str]:
    """The Ray task pinned to a recorded node: process ids and /proc mean something only there, and the lines
    name the node as Ray knows it."""
    import ray

    return _stop_here({**share, "node": ray.util.get_node_ip_address()}, term_timeout_s)


def _on_cluster(remote: dict[str, dict[str, Any]], pgs: list[str], address: str | None,
                term_timeout_s: float) -> list[str]:
    try:
        import ray

        started = False
        if not ray.is_initialized():
            if not address:
                return _unreachable(remote, pgs, "no Ray address recorded; a local cluster dies with its tuner",
                                    term_timeout_s)
            ray.init(address=address, log_to_driver=False)
            started = True
    except Exception as e:  # noqa: BLE001 — cleanup reports what it could not do and goes on
        return _unreachable(remote, pgs, f"Ray at {address} not reachable ({_first(e)})", term_timeout_s)
    try:
        return _on_nodes(ray, remote, term_timeout_s) + (_remove_placement_groups(ray, pgs) if pgs else [])
    finally:
        if started:
            ray.shutdown()


def _on_nodes(ray: Any, remote: dict[str, dict[str, Any]], term_timeout_s: float) -> list[str]:
    """A task on each recorded node that is alive, all at once; a line for each node that is gone."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not remote:
        return []
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    task = ray.remote(num_cpus=0, max_retries=0)(_stop_on_node)
    out: dict[str, list[str] | Any] = {}
    for nid, share in remote.items():
        if nid in alive:
            out[nid] = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote(
                share, term_timeout_s)
        elif _is_local_ip(share.get("node")):
            out[nid] = _stop_here(share, term_timeout_s)  # its Ray is gone, its processes may be here
        else:
            out[nid] = [f"node {_label(share, nid)}: {GONE}"]
    lines: list[str] = []
    for nid, got in out.items():
        if isinstance(got, list):
            lines += got
            continue
        try:
            lines += ray.get(got, timeout=2 * term_timeout_s + 120)
        except Exception as e:  # noqa: BLE001 — a node lost mid-cleanup: say so, finish the others
            lines.append(f"node {_label(remote[nid], nid)}: the cleanup task there failed ({_first(e)}) — "
                         "its processes must be stopped by hand")
    return lines


def _unreachable(remote: dict[str, dict[str, Any]], pgs: list[str], why: str, term_timeout_s: float) -> list[str]:
    """Without Ray only this machine's nodes can be cleaned (a private cluster ran here); the others are named."""
    lines: list[str] = []
    for nid, share in remote.items():
        if _is_local_ip(share.get("node")):
            lines += _stop_here(share, term_timeout_s)
        else:
            lines.append(f"node {_label(share, nid)}: {why} — its processes must be stopped by hand")
    if pgs:
        lines.append(f"placement groups {', '.join(pgs)}: {why}")
    return lines


def _remove_placement_groups(ray: Any, ids: list[str]) -> list[str]:
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    out = []
    try:
        table = ray.util.placement_group_table()
        for pid in ids:
            if table.get(pid, {}).get("state") not in (None, "REMOVED"):
                remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pid))))
                out.append(f"removed placement group {pid}")
    except Exception as e:  # noqa: BLE001
        out.append(f"placement groups {', '.join(ids)}: not removed ({_first(e)})")
    return out


def _is_local_ip(ip: str | None) -> bool:
    """An address this machine (this network namespace) owns: only those can be bound."""
    if not ip:
        return False
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def _label(share: dict[str, Any], nid: str) -> str:
    return share.get("node") or nid[:12]


def _first(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]
