"""``python -m executors.measuring.bench_zygote``: vLLM's own ``vllm bench serve``, imported once and forked per level.

Why: on the CPU build the benchmark client spends about 7 s of a 2-core machine importing vLLM (torch, the
tokenizers) before it sends its first request, while a CI level measures for under a second; a knee search of
six levels paid that import seven times (warm-up included). This process imports vLLM's CLI once; each level
is a ``fork()`` that becomes its own session (its own process group, stopped by id like any other), sends its
output to the level's log and runs what ``vllm bench serve ARGS`` runs — vLLM's ``BenchmarkServingSubcommand``
with its own parser — in a fresh process per level (the ``vllm`` command also builds every other
subcommand's parser first, about 2 s here).

Protocol (one JSON object per line): the parent writes ``{"args": [...], "log": path, "env": {...}, "cwd":
path}``; this process answers ``{"pid": N}`` at once (N is also the level's process group) and ``{"rc": R}``
when it exits. End of input ends this process. ``Zygote`` is the parent's side.

Only where the client does not distort the measurement and ``vllm bench serve`` is this Python's vLLM
(``usable``): a GPU platform whose engine command runs vLLM's CLI (the ``vllm`` script included) with a Python
that imports this interpreter's vLLM. Not on the CPU build:
there, on 2 cores, levels forked from the zygote read a c=1 median TTFT of 47-80 ms where a fresh command read
8.8-12.9 ms on the same deployments (``benchmarks/bench_client_bursts.py``); a fresh command per level stays
the CPU build's guard. On a GPU host the client has cores of its own, and a fresh command costs ~30 s of
import per level (15-26 s levels whose client takes longer to start than to measure).
``DEPLOY_ADVISOR_BENCH_ZYGOTE=0`` (or ``1``) turns it off (or on) whatever the platform, to compare the two.
"""

from __future__ import annotations

import functools
import json
import os
import select
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from executors.processes import procs
from executors.vllm.platform import Platform

#: The engine command whose ``bench serve`` this module reproduces (``executors.vllm.platform.cpu_platform``).
LAUNCHER = [sys.executable, "-m", "executors.vllm.cli"]


#: vLLM's own CLI module, as a GPU platform runs it (``python3 -m vllm.entrypoints.cli.main``).
_VLLM_CLI = ["-m", "vllm.entrypoints.cli.main"]


def usable(platform: Platform) -> bool:
    """Whether levels on ``platform`` fork from a zygote (see the module's doc)."""
    forced = os.environ.get("DEPLOY_ADVISOR_BENCH_ZYGOTE")
    if forced in ("0", "1"):
        return forced == "1" and _same_python(platform)
    return not platform.cpu_per_gpu_slot and _same_python(platform)


def _same_python(platform: Platform) -> bool:
    """The platform's ``vllm`` is this interpreter's (the zygote imports vLLM here and forks): its engine command
    runs vLLM's CLI, directly (``python -m vllm.entrypoints.cli.main``) or through the ``vllm`` console script a
    GPU platform names by default, with a Python that imports the very vLLM package this one imports. A script
    of another environment (its own venv's vLLM, a Python without vLLM) keeps a fresh command per level."""
    cmd = list(platform.engine_cmd)
    if cmd == LAUNCHER:
        return True
    python = _cli_python(cmd)
    if python is None:
        return False
    here = _vllm_package(sys.executable)
    return here is not None and _vllm_package(python) == here


def _cli_python(cmd: Sequence[str]) -> str | None:
    """The interpreter an engine command runs vLLM's CLI with, or None when it is not vLLM's CLI."""
    import shutil

    if len(cmd) == 3 and list(cmd[1:]) == _VLLM_CLI:
        return shutil.which(cmd[0])
    if len(cmd) != 1 or os.path.basename(cmd[0]) != "vllm":
        return None
    script = shutil.which(cmd[0])
    if script is None:
        return None
    try:
        with open(script, "rb") as f:
            first = f.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    # pip's console scripts start "#!/path/to/python"; a long path's "#!/bin/sh" exec trick is not followed.
    if not first.startswith("#!"):
        return None
    interpreter = first[2:].strip().split()
    return shutil.which(interpreter[0]) if len(interpreter) == 1 else None


@functools.lru_cache(maxsize=8)
def _vllm_package(python: str) -> str | None:
    """Where ``python`` finds the ``vllm`` package (its spec's origin, found without importing it), or None."""
    probe = "import importlib.util as u; s = u.find_spec('vllm'); print(s.origin if s and s.origin else '')"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    origin = out.stdout.strip() if out.returncode == 0 else ""
    return os.path.realpath(origin) if origin else None


class ZygoteGone(RuntimeError):
    """The zygote exited, stopped answering or could not start: ``reason`` says how and its last words (its log's
    error line, else its last lines), ``tail`` is its log. Always the environment's failure
    (``executors.measuring.bench``): levels are forked children, so no level's load ends the zygote."""

    def __init__(self, reason: str, tail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.tail = reason, tail


class Zygote:
    """The parent's side: one zygote per measured deployment (``start``ed while the deployment starts, so its
    import overlaps the server's; else at the first level; ``close``d after the last). ``on_start(pgid)`` hears
    of every process group it makes — its own and each level's — so that crash cleanup finds them; both carry the
    zygote's log (under the trial's folder) as their owner mark."""

    def __init__(self, platform: Platform, log_dir: str | Path, on_start: Callable[[int], None] | None = None):
        self.platform = platform
        self.log_dir = Path(log_dir)
        self.on_start = on_start
        self.proc: procs.ManagedProcess | None = None
        self._buf = b""

    def start(self) -> None:
        """Start the zygote now, without waiting for its import (the first level's request waits for it)."""
        self._ensure()

    def _ensure(self) -> procs.ManagedProcess:
        if self.proc is None or not self.proc.alive:
            self._buf = b""
            try:
                self.proc = procs.start([sys.executable, "-m", "executors.measuring.bench_zygote"], name="bench-zygote",
                                        log_path=self.log_dir / "bench-zygote.log", env=self.platform.env,
                                        cwd=self.log_dir, talk=True)
            except OSError as e:  # this interpreter or the level's folder is gone
                raise ZygoteGone(f"the bench zygote could not start: {e}") from None
            if self.on_start is not None:
                self.on_start(self.proc.pgid)
        return self.proc

    def run(self, args: Sequence[str], *, log_path: str | Path, env: Mapping[str, str], cwd: str | Path | None,
            timeout_s: float, term_timeout_s: float, on_start: Callable[[int], None] | None) -> int:
        """``vllm bench serve ARGS`` in a forked level; its exit code. Past ``timeout_s`` (the first level's
        includes the zygote's import, as a command's did) the level's group is stopped and TimeoutError raised."""
        proc = self._ensure()
        req = {"args": list(args), "log": str(log_path), "env": dict(env), "cwd": str(cwd) if cwd else None}
        assert proc.popen.stdin is not None
        try:
            proc.popen.stdin.write((json.dumps(req) + "\n").encode())
            proc.popen.stdin.flush()
        except OSError:
            raise self._gone() from None
        deadline = time.monotonic() + timeout_s
        try:
            pid = int(self._reply("pid", deadline))
        except BaseException:  # no answer (its import outlasted the level's time): a late one must not be read
            self.close()  # as the next level's
            raise
        if on_start is not None:
            on_start(pid)
        try:
            return int(self._reply("rc", deadline))
        except BaseException:  # TimeoutError or KeyboardInterrupt: the level never outlives its wait
            procs.stop_group(pid, term_timeout_s)
            self.close()
            raise

    def _reply(self, key: str, deadline: float) -> int:
        assert self.proc is not None and self.proc.popen.stdout is not None
        fd = self.proc.popen.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(key)
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise self._gone()
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return int(json.loads(line)[key])

    def _gone(self) -> ZygoteGone:
        """The zygote closed its end: how it ended and what it said last."""
        assert self.proc is not None
        try:
            rc: int | None = self.proc.popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            rc = None
        return ZygoteGone(procs.exit_reason("the bench zygote", rc, self.proc.tail(400)), self.proc.tail(60))

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.popen.stdin is not None:
                self.proc.popen.stdin.close()  # end of input: the zygote exits
        except OSError:
            pass
        procs.stop(self.proc, 10.0)
        self.proc = None


def _preload() -> None:
    """What ``vllm bench serve`` imports, imported once here (fork shares it with every level)."""
    import importlib

    from executors.vllm import cli as vllm_cli

    vllm_cli.install_version_shim()
    importlib.import_module("vllm.entrypoints.cli.benchmark.serve")  # torch, transformers, the datasets
    vllm_cli.install_stream_fix()


def _child(req: dict[str, object]) -> int:
    os.setsid()
    fd = os.open(str(req["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.update({str(k): str(v) for k, v in dict(req.get("env") or {}).items()})  # type: ignore[call-overload]
    if req.get("cwd"):
        os.chdir(str(req["cwd"]))
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand as Serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # what `vllm bench serve` runs: its subcommand's own parser and ``cmd``
        parser = FlexibleArgumentParser(prog="vllm bench serve", description=Serve.help)
        Serve.add_cli_args(parser)
        Serve.cmd(parser.parse_args([str(a) for a in req["args"]]))  # type: ignore[union-attr]
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 — a level's failure is its exit code and its log, as with the command
        traceback.print_exc()
        return 1


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed here goes to the log, never into the protocol
    _preload()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(req)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
