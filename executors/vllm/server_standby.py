"""``python -m executors.vllm.server_standby MODULE``: the next deployment's ``vllm serve``, started before its
flags exist.

Why: on the H200 every deploy spends 22-26 s between the launch and vLLM's first log line (``deploy_phases``:
the API server importing vLLM — torch, transformers, every CLI subcommand), about a quarter of a
new-configuration deploy (75-90 s). A study's next deployment on a one-node machine runs the same interpreter,
the same engine module and the same environment as the one now measured; only its ``serve`` flags (the
trial's configuration) are unknown until the sampler asks. So while a deployment is measured, the executor starts
the next one's first server as this process: it imports what ``vllm serve`` imports and waits. When the next
deploy comes, it is sent its arguments (``{"argv": [...]}`` on one line of standard input; its log is already
the server's) and becomes that server — it runs ``MODULE`` as ``python -m MODULE ARGV`` would, in this same
process (same pid, process group, environment and owner mark; no fork), so it is recorded, watched and stopped like
any server.

End of input before a request (the tuner exited, or the executor closed) ends it, so a standby never outlives
its tuner by more than its import. It is used only where one is ``usable`` (GPU platforms with cores to spare:
on the CPU build's 2 cores its import would land inside the measured deployment's levels) and only when the
next deploy's first server has the standby's name, folder and environment (``Standby.matches``); otherwise it is
stopped and the server starts as before. ``DEPLOY_ADVISOR_SERVER_STANDBY=0`` (or ``1``) turns it off (or on)
whatever the platform, to compare the two.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from executors.processes import procs
from executors.vllm.executor import DEPLOYMENT_TIME
from executors.vllm.platform import Platform

_ENV = "DEPLOY_ADVISOR_SERVER_STANDBY"

#: The launch record's words for a server that was a standby (``benchmarks/deploy_phases.py`` times it from there).
ADOPTED = "(the standby started with the last deployment) at"

#: What ``vllm serve`` imports before it logs its first line: vLLM's CLI and the OpenAI API server.
_PRELOAD = ("vllm.entrypoints.cli.main", "vllm.entrypoints.openai.api_server")


def usable(platform: Platform) -> bool:
    """Whether the next deployment's server is started while this one is measured (see the module's doc):
    the platform's engine command must be ``python -m MODULE`` (the standby runs the module itself)."""
    if _module(platform.engine_cmd) is None:
        return False
    forced = os.environ.get(_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return not platform.cpu_per_gpu_slot


def _module(engine_cmd: Sequence[str]) -> str | None:
    cmd = list(engine_cmd)
    return cmd[2] if len(cmd) == 3 and cmd[1] == "-m" else None


class Standby:
    """The parent's side: one waiting server, ``adopt``ed by the next deploy whose first server ``matches``."""

    def __init__(self, platform: Platform, name: str, ddir: Path, env: Mapping[str, str]) -> None:
        module = _module(platform.engine_cmd)
        assert module is not None, "usable() first"
        self.name, self.ddir, self.env, self.cmd = name, ddir, dict(env), list(platform.engine_cmd)
        self.proc = procs.start([self.cmd[0], "-m", "executors.vllm.server_standby", module],
                                name=name, log_path=ddir / f"{name}.log", env=self.env, cwd=ddir, talk=True)

    def matches(self, name: str, ddir: Path, env: Mapping[str, str]) -> bool:
        return self.proc.alive and (name, ddir, dict(env)) == (self.name, self.ddir, self.env)

    def adopt(self, argv: Sequence[str]) -> procs.ManagedProcess:
        """Send the server its arguments: from now on it is that server (``argv`` is the full command line, the
        engine command first, as ``procs.start`` would have run it)."""
        assert self.proc.popen.stdin is not None and list(argv[:len(self.cmd)]) == self.cmd
        with open(self.proc.log_path, "ab") as fh:  # the launch record, as procs.start writes it, and when
            now = time.strftime(DEPLOYMENT_TIME)
            fh.write(f"# {self.name} {ADOPTED} {now}: {' '.join(argv)}\n".encode())
        self.proc.popen.stdin.write((json.dumps({"argv": list(argv[len(self.cmd):])}) + "\n").encode())
        self.proc.popen.stdin.close()  # the server reads nothing more from it
        return procs.ManagedProcess(self.name, list(argv), self.proc.popen, self.proc.log_path)

    def close(self, term_timeout_s: float = 10.0) -> None:
        """Stop a standby nobody adopted (its folder, with only its log, stays like any run folder)."""
        try:
            if self.proc.popen.stdin is not None and not self.proc.popen.stdin.closed:
                self.proc.popen.stdin.close()
        except OSError:
            pass
        procs.stop(self.proc, term_timeout_s)


def main() -> None:
    module = sys.argv[1]
    os.dup2(2, 1)  # the server's output goes to its log (stderr), never into the pipe
    if module == "executors.vllm.cli":
        from executors.vllm import cli as vllm_cli

        vllm_cli.install_version_shim()
    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as e:  # a vLLM laid out otherwise: the server imports it itself, later
            print(f"server_standby: not preloaded: {name}: {e}", file=sys.stderr)
    line = sys.stdin.readline()
    if not line.strip():
        sys.exit(0)  # end of input: nobody will adopt this server
    req = json.loads(line)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.argv = [module, *[str(a) for a in req["argv"]]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
