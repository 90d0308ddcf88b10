"""Processes we own: start one as its own process group, wait for it to answer, stop it by group id.

Nothing here looks a process up by name. Every command starts a new session (``start_new_session``), so
its pid is its process-group id and everything it forks stays in that group: ``stop_group`` sends TERM
to the group, waits, then KILL. Shared-memory segments a vLLM instance maps are recorded by name while it
runs (``shm_segments``) and only those names are removed after it stopped (``remove_shm``).

Before it runs its command each process writes its launch record beside its log (``<log>.pid``: pid, start
time, boot; ``_LAUNCH``): the child writes it itself, between ``setsid`` and ``exec``, so a tuner killed at any
instant after the fork cannot leave a process without one, and a process that renames itself later (erasing the
environment mark) is still found by it.

Here: starting, waiting and stopping. Reading ``/proc`` (owner marks, a group's members, shared memory) is
``executors.processes.scan``, reading logs (tail, error line) ``executors.processes.logs``; both are re-exported, so
``procs.NAME`` is the one way callers reach them.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from executors.processes.logs import error_line, exit_reason, last_lines, read_tail
from executors.processes.scan import (
    OWNER_ENV,
    SHM_DIR,
    SHM_PREFIXES,
    Launch,
    Marked,
    group_pids,
    launch_file,
    launched_mark,
    launched_members,
    launches,
    live_group_pids,
    marked_processes,
    owner_mark,
    pid_alive,
    read_launch,
    remove_shm,
    shm_segments,
)

#: ``sh -c _LAUNCH sh RECORD ARGV…``: the new session's leader writes its launch record (``proc_scan.Launch``:
#: its pid, its start time — field 22 of /proc/self/stat, the shell's own and, after ``exec``, the command's —
#: and the boot id), then becomes the command. Builtins only: nothing forks, so the pid is the command's.
_LAUNCH = (
    'f=$1; shift; pick() { s=${22}; }; read -r st < /proc/self/stat; pick $st; '
    'read -r boot < /proc/sys/kernel/random/boot_id; '
    'printf \'{"pid": %s, "start": %s, "boot": "%s"}\\n\' "$$" "$s" "$boot" > "$f"; exec "$@"'
)


class ProcessExited(RuntimeError):
    """The process died before it became healthy."""

    def __init__(self, returncode: int | None, reason: str, tail: str) -> None:
        super().__init__(reason)
        self.returncode = returncode
        self.reason = reason
        self.tail = tail


class HealthTimeout(TimeoutError):
    def __init__(self, reason: str, tail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.tail = tail


@dataclass
class ManagedProcess:
    """A command started as the leader of its own process group, with its output in ``log_path``."""

    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def pgid(self) -> int:
        return self.popen.pid  # start_new_session: the leader's pid is the group id

    def poll(self) -> int | None:
        return self.popen.poll()

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 60) -> str:
        return read_tail(self.log_path, lines)


def start(
    argv: Sequence[str],
    *,
    name: str,
    log_path: str | Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    inherit_env: bool = True,
    talk: bool = False,
) -> ManagedProcess:
    """Start ``argv`` as a new session (own process group); stdout and stderr go to ``log_path``.

    ``env`` is added to this process's environment (``inherit_env``) or replaces it. ``talk``: stdin and
    stdout are pipes to this process (a line protocol; ``popen.stdin`` / ``popen.stdout``), stderr the log.
    """
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ) if inherit_env else {}
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    # Our mark on the process: cleanup after a crashed tuner stops a recorded group only if its leader carries
    # the log path that was recorded with it — never a stranger that reused the id.
    full_env[OWNER_ENV] = str(log.resolve())
    _check_executable(argv[0], full_env.get("PATH"), cwd)
    with open(log, "ab") as fh:
        fh.write(f"# {name}: {' '.join(argv)}\n".encode())
        fh.flush()
        popen = subprocess.Popen(
            ["/bin/sh", "-c", _LAUNCH, "sh", str(launch_file(log)), *argv],
            stdin=subprocess.PIPE if talk else subprocess.DEVNULL,
            stdout=subprocess.PIPE if talk else fh, stderr=fh if talk else subprocess.STDOUT, env=full_env,
            cwd=str(cwd) if cwd else None, start_new_session=True, close_fds=True,
        )
    return ManagedProcess(name, list(argv), popen, log)


def _check_executable(program: str, path: str | None, cwd: str | Path | None) -> None:
    """``FileNotFoundError`` for a command that cannot run, as ``Popen`` raised it before the launch record's
    shell came between (a missing ``vllm`` is the platform's failure, said at once, not a log line)."""
    found = (Path(cwd or ".") / program).is_file() if "/" in program else shutil.which(program, path=path)
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies included: reap your children first)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(pgid: int, popen: subprocess.Popen[bytes] | None) -> None:
    if popen is not None:
        popen.poll()
        return
    try:  # the leader may be our child: collect it so its zombie does not keep the group "alive"
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass


def _signal(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def stop_group(
    pgid: int, term_timeout: float = 30.0, *, popen: subprocess.Popen[bytes] | None = None, kill_timeout: float = 10.0
) -> bool:
    """TERM the process group, wait up to ``term_timeout``, then KILL it. True when it is gone.

    ``popen`` (the leader's ``Popen``) lets us reap the leader; without it we try ``waitpid`` ourselves.
    Raises ``ValueError`` for a group that is not ours to signal (ids ≤ 1, our own group).
    """
    if _refused(pgid):
        raise ValueError(f"refusing to signal process group {pgid}")
    return stop_groups([(pgid, popen)], term_timeout, kill_timeout=kill_timeout)[pgid]


def _refused(pgid: int) -> bool:
    return pgid <= 1 or pgid == os.getpgrp()


def stop_groups(
    groups: Sequence[tuple[int, subprocess.Popen[bytes] | None]], term_timeout: float = 30.0, *,
    kill_timeout: float = 10.0,
) -> dict[int, bool]:
    """``stop_group`` for several groups at once: TERM every one, then wait for all of them together, so a
    deployment's teardown takes the slowest server's exit time, not the sum of them. pgid → gone.

    A group that is not ours to signal (ids ≤ 1, our own group) or that we may not signal is left alone and
    reported False; the others are stopped all the same.
    """
    pending: dict[int, subprocess.Popen[bytes] | None] = {}
    refused: set[int] = set()
    for pgid, popen in groups:
        if _refused(pgid):
            refused.add(pgid)
            continue
        _reap(pgid, popen)
        try:
            if _signal(pgid, signal.SIGTERM):
                pending[pgid] = popen
        except PermissionError:
            refused.add(pgid)
    for timeout, sig in ((term_timeout, signal.SIGKILL), (kill_timeout, None)):
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for pgid, popen in list(pending.items()):
                _reap(pgid, popen)
                if not group_alive(pgid):
                    del pending[pgid]
            if pending:
                time.sleep(0.05)
        if sig is not None:
            for pgid in pending:
                _signal(pgid, sig)
    for pgid, popen in pending.items():
        _reap(pgid, popen)
    return {pgid: pgid not in refused and not (pgid in pending and group_alive(pgid)) for pgid, _ in groups}


def stop(proc: ManagedProcess, term_timeout: float = 30.0) -> bool:
    return stop_group(proc.pgid, term_timeout, popen=proc.popen)


def stop_all(processes: Sequence[ManagedProcess], term_timeout: float = 30.0) -> dict[str, bool]:
    """Stop several managed processes together (``stop_groups``); name → gone."""
    gone = stop_groups([(p.pgid, p.popen) for p in processes], term_timeout)
    return {p.name: gone[p.pgid] for p in processes}


def free_port(host: str = "127.0.0.1", avoid: Iterable[int] = ()) -> int:
    """A TCP port nobody listens on now (the kernel's pick), not in ``avoid``."""
    taken = set(avoid)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port
    raise RuntimeError("no free port found")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered."""
    req = urllib.request.Request(url, headers={"User-Agent": "deploy-advisor"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() if e.fp else b""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, b""


def wait_healthy(
    url: str,
    timeout: float,
    proc: ManagedProcess | None = None,
    *,
    path: str = "/health",
    interval: float = 0.5,
    tail_lines: int = 80,
) -> float:
    """Poll ``url + path`` until it answers 200; seconds waited.

    Fails fast with ``ProcessExited`` (vLLM's own error line as reason) when ``proc`` dies first, and with
    ``HealthTimeout`` after ``timeout`` seconds.
    """
    t0 = time.monotonic()
    target = url.rstrip("/") + path
    while True:
        if proc is not None and proc.poll() is not None:
            tail = proc.tail(tail_lines)
            reason = error_line(proc.tail(400)) or exit_reason(proc.name, proc.poll(), proc.tail(400),
                                                                " while starting")
            raise ProcessExited(proc.poll(), reason, tail)
        status, _ = http_get(target, timeout=min(5.0, max(0.5, interval * 4)))
        if status == 200:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            tail = proc.tail(tail_lines) if proc is not None else ""
            raise HealthTimeout(f"{target} did not answer 200 within {timeout:.0f} s", tail)
        time.sleep(interval)


def stop_strays(groups: Iterable[int] = (), pids: Iterable[int] = (), term_timeout: float = 30.0, *,
                kill_timeout: float = 10.0) -> set[int]:
    """TERM process groups and single processes that are not children of ours (what a dead tuner left),
    wait up to ``term_timeout``, KILL what is left, wait ``kill_timeout``. Returns the group ids and pids
    still running.

    Unlike ``stop_groups`` a zombie counts as gone (``pid_alive``): nobody here can reap an orphan.
    Ids ≤ 1, our own group and our own pid are never signalled (``ValueError``).
    """
    groups, pids = sorted(set(groups)), sorted(set(pids))
    bad = [g for g in groups if _refused(g)] + [p for p in pids if p <= 1 or p == os.getpid()]
    if bad:
        raise ValueError(f"refusing to signal {bad}")

    def alive() -> set[int]:
        return {g for g in groups if live_group_pids(g)} | {p for p in pids if pid_alive(p)}

    def send(sig: int, which: set[int]) -> None:
        for kill, ids in ((os.killpg, groups), (os.kill, pids)):
            for i in ids:
                if i in which:
                    try:
                        kill(i, sig)
                    except (ProcessLookupError, PermissionError):  # gone, or not ours: reported as left
                        pass

    left = alive()
    for sig, timeout in ((signal.SIGTERM, term_timeout), (signal.SIGKILL, kill_timeout)):
        send(sig, left)
        deadline = time.monotonic() + timeout
        while (left := alive()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not left:
            break
    return left


#: What callers reach as ``MODULE.NAME``, the re-exported parts included.
__all__ = [
    "OWNER_ENV", "SHM_DIR", "SHM_PREFIXES", "HealthTimeout", "Launch", "ManagedProcess", "Marked", "ProcessExited",
    "error_line", "exit_reason", "free_port", "group_alive", "group_pids", "http_get", "interrupt_of", "launch_file",
    "launched_mark", "launched_members", "last_lines", "launches", "live_group_pids", "marked_processes",
    "owner_mark", "pid_alive", "read_launch", "read_tail", "remove_shm", "shm_segments", "start", "stop", "stop_all",
    "stop_group", "stop_groups", "stop_strays", "wait_healthy",
]


def interrupt_of(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM inside ``e``, if any. A signal's handler runs in whatever Python frame is current,
    and pydantic wraps an exception raised in a Python serializer (a configuration's dump) in a
    ``PydanticSerializationError`` that keeps it as the cause: a stop landing there must still stop the
    command, not become one trial's error."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__
    return None


def terminate_as_interrupt() -> None:
    """SIGTERM (a wall-clock limit, ``timeout``, a scheduler) stops a command the way Ctrl-C does: Python's default
    would end the process on the spot, skipping every ``finally`` — the teardown that stops a trial's vLLM
    servers (sessions of their own, which outlive the process that started them, holding the GPUs) and records
    what was measured. The CLI and the GPU benchmark scripts install it first thing."""

    def on_term(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: teardown is not interrupted by a second one
        raise KeyboardInterrupt("terminated (SIGTERM)")

    signal.signal(signal.SIGTERM, on_term)
