"""Stopping what a trial left running when its tuner died: from the resources record alone.

The record (``Deployment.resources``, stored with the trial as each process starts) names process groups,
log paths, a KV folder, shared-memory segments and Ray placement groups. A group is stopped only when its
leader still carries the log path recorded with it (``procs.OWNER_ENV``): a process id reused by someone
else after a reboot is left alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from executors import procs


def _recorded_groups(res: dict[str, Any]) -> set[int]:
    groups = set(res.get("pgids") or []) | set(res.get("bench_pgids") or [])
    groups |= {p["pgid"] for p in res.get("processes") or [] if p.get("pgid")}
    return {int(g) for g in groups if int(g) > 1}


def _ours(pgid: int, res: dict[str, Any]) -> bool:
    mark = procs.owner_mark(pgid)
    if mark is None:
        return False
    run_dir = res.get("run_dir")
    logs = {str(Path(p).resolve()) for p in (res.get("log_paths") or {}).values()}
    return mark in logs or bool(run_dir and mark.startswith(str(Path(run_dir).resolve())))


def cleanup_resources(res: dict[str, Any], *, term_timeout_s: float = 15.0, ray_address: str | None = None) -> list[str]:
    """Stop and remove what ``res`` records; returns one line per action, for the user and the database."""
    done: list[str] = []
    for g in sorted(_recorded_groups(res)):
        if not procs.group_alive(g):
            continue
        if not _ours(g, res):
            done.append(f"left process group {g} alone: its leader is not a process this study started")
            continue
        ok = procs.stop_group(g, term_timeout_s)
        done.append(f"stopped process group {g}" + ("" if ok else " (still alive after KILL)"))
    kv = res.get("kv_dir")
    if kv and Path(kv).exists():
        shutil.rmtree(kv, ignore_errors=True)
        done.append(f"removed KV folder {kv}")
    removed = procs.remove_shm(res.get("shm") or [])
    if removed:
        done.append(f"removed shared memory {', '.join(removed)}")
    pgs = res.get("placement_groups") or []
    if pgs:
        done += _remove_placement_groups(pgs, ray_address or res.get("ray_address"))
    return done


def _remove_placement_groups(ids: list[str], address: str | None) -> list[str]:
    """Placement groups live in the Ray cluster; reachable only when its address is known and answers."""
    if not address:
        return [f"placement groups {', '.join(ids)}: no Ray address recorded; a local cluster dies with its tuner"]
    try:
        import ray
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        started = not ray.is_initialized()
        if started:
            ray.init(address=address, log_to_driver=False)
        try:
            out = []
            table = ray.util.placement_group_table()
            for pid in ids:
                if table.get(pid, {}).get("state") not in (None, "REMOVED"):
                    remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pid))))
                    out.append(f"removed placement group {pid}")
            return out
        finally:
            if started:
                ray.shutdown()
    except Exception as e:  # noqa: BLE001 — cleanup reports what it could not do and goes on
        return [f"placement groups {', '.join(ids)}: Ray at {address} not reachable ({str(e).splitlines()[0]})"]
