"""Reading a process's log: its last lines, and the most informative error line of a vLLM log.

A failed start or a crash is reported to the user as one line (``error_line``) and a tail; both come from the
log file every process we start writes (``executors.processes.procs.start``), here, so the local executor, the Ray
agent, the benchmark driver and cleanup all word a failure alike.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path


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


#: Our launch header at a log's top (``procs.start``: ``# NAME: ARGV``), never what the process said.
_HEADER = re.compile(r"^# [\w.-]+: ")


def last_lines(text: str, lines: int = 3, width: int = 400) -> str:
    """The last ``lines`` non-empty lines of a log on one line (`` | `` between them), at most ``width``
    characters: what a process said last when none of it reads as an error."""
    said = [ln.strip() for ln in text.splitlines() if ln.strip() and not _HEADER.match(ln)]
    joined = " | ".join(said[-lines:])
    return joined if len(joined) <= width else "…" + joined[-(width - 1):]


def exit_reason(what: str, returncode: int | None, text: str, when: str = "") -> str:
    """One line for a process that ended: how (its exit code, the signal that killed it, or that it stopped
    answering) and why — its log's error line, else its last lines — so a helper's failure never reads as
    "exited" with nothing after it. ``when`` follows the how (" while starting")."""
    if returncode is None:
        how = "stopped answering"
    elif returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"was killed by signal {-returncode}"
    else:
        how = f"exited with code {returncode}"
    said = error_line(text) or last_lines(text)
    return f"{what} {how}{when}: {said}" if said else f"{what} {how}{when} and wrote nothing to its log"
