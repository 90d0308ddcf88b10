"""What /proc says about processes: our marks, a group's members, which are alive, the shared memory they map.

Everything here reads ``/proc`` and never signals: finding is kept apart from stopping (``executors.processes.procs``),
so the rules that decide which processes are ours read in one place. Two marks, because one does not survive
everything: the ``OWNER_ENV`` variable every process we start carries (inherited by its children, but erased from
``/proc/PID/environ`` by a process that renames itself — ``vllm-router`` becomes ``vllm::router``, vLLM's engines
``VLLM::EngineCore`` — through ``setproctitle``), and the launch record (``<log>.pid``) each process writes before
it execs: its pid, start time and boot, which identify it exactly, whatever it later does to its name or
environment, and never match a stranger that reused the pid. This network namespace only; a zombie counts as
gone. Nothing here looks a process up by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
#: Segment names a vLLM server (or the Python multiprocessing it uses) creates; others are never removed.
SHM_PREFIXES = ("vllm", "psm_", "sem.mp-", "torch_")

#: Every process we start carries this variable (its log path): the mark cleanup checks before it stops one.
OWNER_ENV = "DEPLOY_ADVISOR_LOG"
#: Appended to a log's name for its process's launch record (``router.log`` → ``router.log.pid``).
LAUNCH_SUFFIX = ".pid"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Launch:
    """A launch record: the process ``pid`` (leader of group ``pid``) that started at ``start`` (clock ticks after
    boot ``boot``) with its output in ``log`` (resolved; the same string ``OWNER_ENV`` carries)."""

    pid: int
    start: int
    boot: str
    log: str


def launch_file(log_path: str | Path) -> Path:
    """Where the process logging to ``log_path`` records its launch."""
    log = Path(log_path)
    return log.with_name(log.name + LAUNCH_SUFFIX)


def read_launch(path: Path) -> Launch | None:
    """The launch record at ``path`` (None: missing or not one)."""
    try:
        d = json.loads(path.read_text())
        return Launch(int(d["pid"]), int(d["start"]), str(d["boot"]),
                      str(path.with_name(path.name.removesuffix(LAUNCH_SUFFIX)).resolve()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def launches(logs: Iterable[str], under: str | Path | None = None) -> dict[int, Launch]:
    """The launch records of the processes logging to ``logs`` and of every process whose log is under ``under``
    (one started but not yet recorded when its tuner died has its record there all the same); by pid."""
    files = {launch_file(p) for p in logs}
    if under and Path(under).is_dir():
        files |= set(Path(under).rglob(f"*.log{LAUNCH_SUFFIX}"))
    found = (read_launch(f) for f in sorted(files))
    return {r.pid: r for r in found if r is not None}


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (field 22 of /proc/PID/stat); None: no such process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def launched_mark(pid: int, records: Mapping[int, Launch]) -> str | None:
    """The log of the launch record that ``pid`` is — same pid, boot and start time, this network namespace —
    or None (no record, or a process that reused the id)."""
    r = records.get(pid)
    if r is None or r.boot != boot_id() or start_ticks(pid) != r.start or not pid_alive(pid):
        return None
    return r.log if _netns(pid) == _netns("self") else None


def owner_mark(pid: int) -> str | None:
    """The ``DEPLOY_ADVISOR_LOG`` a live process was started with (None: gone, not ours, or unreadable)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{OWNER_ENV}=".encode()
    for item in env:
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def shm_segments(pids: Iterable[int]) -> set[str]:
    """Names of ``/dev/shm`` segments that these processes map now (vLLM's ``vllm_*`` and friends)."""
    found: set[str] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            idx = line.find(str(SHM_DIR) + "/")
            if idx < 0:
                continue
            name = line[idx + len(str(SHM_DIR)) + 1:].split(" (deleted)")[0].strip()
            if name and "/" not in name and name.startswith(SHM_PREFIXES):
                found.add(name)
    return found


def _every_stat() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name: state, ppid, pgrp, …) of every process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 19:
            yield int(entry.name), fields


def group_pids(pgid: int) -> list[int]:
    """Every live process of a process group (read from /proc)."""
    return [pid for pid, fields in _every_stat() if int(fields[2]) == pgid]


def remove_shm(names: Iterable[str]) -> list[str]:
    """Unlink the recorded segments that still exist; the names removed."""
    removed: list[str] = []
    for name in names:
        if "/" in name or not name.startswith(SHM_PREFIXES):
            continue
        p = SHM_DIR / name
        try:
            p.unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
        except OSError:
            pass
    return removed


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (None: no such process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie counts as gone: an orphan's zombie is collected by pid 1 only, and
    some container inits never do, so waiting for it to vanish would wait forever."""
    return _state(pid) not in (None, "Z")


def live_group_pids(pgid: int) -> list[int]:
    """``group_pids`` without zombies: what is left to stop of a group whose leader may have died."""
    return [p for p in group_pids(pgid) if pid_alive(p)]


@dataclass(frozen=True)
class Marked:
    """A live process carrying our owner mark (``OWNER_ENV``)."""

    pid: int
    pgid: int
    mark: str


def _netns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def marked_processes(marks: Iterable[str], prefix: str | Path | None = None) -> list[Marked]:
    """Live processes whose ``OWNER_ENV`` is one of ``marks`` or a path under ``prefix``, found by reading
    every /proc/PID/environ — the way to find the engine processes of a group whose leader died, since
    only the mark (inherited by every child) ties them to us; a name would also match strangers.

    Only processes of this network namespace count: nodes that are namespaces of one machine share the pid
    space, and each node's cleanup must stop its own processes only. Marks compare as given, so pass the
    resolved paths ``start`` wrote (it resolves the log path).
    """
    wanted = set(marks)
    under = str(prefix).rstrip("/") + "/" if prefix else None
    here = _netns("self")
    me = os.getpid()
    out: list[Marked] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        mark = owner_mark(pid)
        if mark is None or not (mark in wanted or (under and (mark + "/").startswith(under))):
            continue
        if here is not None and _netns(pid) != here:
            continue
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if pid_alive(pid):
            out.append(Marked(pid, pgid, mark))
    return out


def launched_members(records: Mapping[int, Launch]) -> list[Marked]:
    """Live members of recorded groups whose leader died (vLLM's engine cores outlive a killed API server, and
    rename themselves, erasing ``OWNER_ENV``). A group id is not handed out again while any member of the group
    lives, so a member that started after the recorded leader, in its boot, is of that leader's group."""
    boot, here = boot_id(), _netns("self")
    headless = {g: r for g, r in records.items() if r.boot == boot and not pid_alive(g)}
    if not headless:
        return []
    out: list[Marked] = []
    for pid, fields in _every_stat():
        r = headless.get(pgid := int(fields[2]))
        if r is not None and int(fields[19]) >= r.start and fields[0] != "Z" and _netns(pid) == here:
            out.append(Marked(pid, pgid, r.log))
    return out
