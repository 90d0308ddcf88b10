"""Processes we own: start one as its own process group, wait for it to answer, stop it by group id.

Nothing here looks a process up by name. Every command starts a new session (``start_new_session``), so
its pid is its process-group id and everything it forks stays in that group: ``stop_group`` sends TERM
to the group, waits, then KILL. Shared-memory segments a vLLM instance maps are recorded by name while it
runs (``shm_segments``) and only those names are removed after it stopped (``remove_shm``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
#: Segment names a vLLM server (or the Python multiprocessing it uses) creates; others are never removed.
SHM_PREFIXES = ("vllm", "psm_", "sem.mp-", "torch_")


OWNER_ENV = "DEPLOY_ADVISOR_LOG"


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
    with open(log, "ab") as fh:
        fh.write(f"# {name}: {' '.join(argv)}\n".encode())
        fh.flush()
        popen = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE if talk else subprocess.DEVNULL,
            stdout=subprocess.PIPE if talk else fh, stderr=fh if talk else subprocess.STDOUT, env=full_env,
            cwd=str(cwd) if cwd else None, start_new_session=True, close_fds=True,
        )
    return ManagedProcess(name, list(argv), popen, log)


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


def read_tail(path: str | Path, lines: int = 60, max_bytes: int = 256_000) -> str:
    """The last ``lines`` lines of a log file ("" when it does not exist)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


_LOG_LEVEL = re.compile(r"\b(INFO|WARNING|DEBUG)\b\s+\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
_ERR_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?:ERROR|CRITICAL)\s+\d{2}-\d{2} \d{2}:\d{2}:\d{2}\s+\[[^\]]*\]\s*")
_EXC = re.compile(r"^\s*(?:\([^)]*\)\s*)?([\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?$")
_ARGPARSE = re.compile(r"^\S+: error: .+")
_VALUE_ERR = re.compile(r"^\s*(Value error|Assertion failed), (.+)")
_GENERIC = ("Engine core initialization failed", "See root cause above", "Failed core proc", "died unexpectedly",
            "See stack trace (above)", "EngineDeadError")


def error_line(text: str) -> str | None:
    """The most informative error line of a vLLM log: an argparse error, a pydantic validation message,
    else the last exception line that is not vLLM's generic "see root cause above" wrapper."""
    lines = text.splitlines()
    candidates: list[str] = []
    for i, raw in enumerate(lines):
        line = _ERR_PREFIX.sub("", raw.strip())  # "(EngineCore pid=1) ERROR 12-01 02:45:08 [core.py:1] " → ""
        if not line or _LOG_LEVEL.search(line):
            continue
        if _ARGPARSE.match(line) or _VALUE_ERR.match(line):
            candidates.append(line)
            continue
        m = _EXC.match(line)
        if m and m.group(2):
            msg = line
            if "validation error" in (m.group(2) or ""):  # pydantic: the reason is on the next lines
                for nxt in lines[i + 1:i + 4]:
                    v = _VALUE_ERR.match(nxt)
                    if v:
                        msg = f"{m.group(1)}: {v.group(2)}"
                        break
            candidates.append(msg)
    informative = [c for c in candidates if not any(g in c for g in _GENERIC)]
    pick = (informative or candidates or [None])[-1]
    if pick is not None:
        pick = re.sub(r"\s*\[type=\w+, input_value=.*$", "", pick)  # pydantic's echo of the whole input
    if pick is None:
        errs = [ln.strip() for ln in lines if " ERROR " in ln or "error:" in ln]
        pick = errs[-1] if errs else None
    return pick[:1000] if pick else None


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
            reason = error_line(proc.tail(400)) or f"{proc.name} exited with code {proc.poll()} while starting"
            raise ProcessExited(proc.poll(), reason, tail)
        status, _ = http_get(target, timeout=min(5.0, max(0.5, interval * 4)))
        if status == 200:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            tail = proc.tail(tail_lines) if proc is not None else ""
            raise HealthTimeout(f"{target} did not answer 200 within {timeout:.0f} s", tail)
        time.sleep(interval)


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


def group_pids(pgid: int) -> list[int]:
    """Every live process of a process group (read from /proc)."""
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


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
