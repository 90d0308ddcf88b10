"""Which processes a crashed trial left, and which of them still run: what the crash tests assert on.

Test scaffolding, not product code. Processes are identified by what the product's cleanup does not rely on —
membership of the recorded groups at the moment of the kill, then (pid, start time) — so a test can tell that a
process outlived the cleanup (and which: the router shows itself as ``vllm::router``) without trusting the marks
the cleanup reads.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from typing import Any

from executors.processes import procs

#: (pid, start time in clock ticks after boot) → the command line the process shows.
Seen = dict[tuple[int, int], str]


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot), read here rather than through the product's own reader."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def snapshot(pids: Iterable[int]) -> Seen:
    """The identity and command line of each of ``pids`` that runs now."""
    out: Seen = {}
    for pid in pids:
        start = start_ticks(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                shown = fh.read().replace(b"\0", b" ").strip().decode(errors="replace")[:120]
        except OSError:
            continue
        if start is not None and procs.pid_alive(pid):
            out[(pid, start)] = shown
    return out


def trial_processes(res: dict[str, Any]) -> Seen:
    """Every live process of the groups ``res`` (a trial's resources) names: servers, router, load generator."""
    groups = {*(res.get("pgids") or []), *(res.get("bench_pgids") or []),
              *(p["pgid"] for p in res.get("processes") or [] if p.get("pgid"))}
    return snapshot(pid for g in groups for pid in procs.live_group_pids(int(g)))


def still_running(seen: Seen) -> Seen:
    """Those of ``seen`` that run now: the same pid with the same start time."""
    return {(pid, start): shown for (pid, start), shown in seen.items()
            if start_ticks(pid) == start and procs.pid_alive(pid)}


def kill(seen: Seen) -> None:
    """KILL those of ``seen`` still running (after a failed cleanup: the next test must not inherit them)."""
    for pid, _ in still_running(seen):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
