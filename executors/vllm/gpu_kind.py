"""Which GPU kind this machine holds, so that what is measured here is stored under the kind it ran on.

Why: a lent machine is not always the kind asked for. Jobs that say ``cluster.gpu: H200`` run on an H100 would
hold its measurements to an H200 profile's predictions, and store its profile — found by every later H200 study —
as an H200's, with the HBM bandwidth of the wrong card in its fitted ``hbm_eff``. ``nvidia-smi`` names
the cards; each name is matched to a kind of ``search_spaces.GPU_TABLE``. Where there is no ``nvidia-smi`` (vLLM's
CPU build, a Ray head without GPUs) nothing is checked: the kinds a Ray cluster's nodes hold are its own
preflight's business.
"""

from __future__ import annotations

import shutil
import subprocess

from search_spaces import GPU_TABLE

#: ``nvidia-smi`` answers in well under a second; a hung driver must not hang the tuner.
QUERY_TIMEOUT_S = 20.0


class GPUKindMismatch(Exception):
    """The job's ``cluster.gpu`` is not the kind of GPU this machine holds (one line: what each says, what to set)."""


def kind_of(name: str) -> str | None:
    """The ``GPU_TABLE`` kind a card's name says ("NVIDIA H100 80GB HBM3" → "H100"; the longest kind named wins, so
    "NVIDIA GB200" is a GB200, not a B200), or None for a card the table does not know."""
    upper = name.upper()
    named = [k for k in GPU_TABLE if k != "CPU" and k in upper]
    return max(named, key=len) if named else None


def local_gpu_names() -> list[str] | None:
    """The name of each GPU ``nvidia-smi`` lists, or None where it cannot answer (not installed, no driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return names if out.returncode == 0 and names else None


def check_local_kind(expected: str) -> None:
    """Raise ``GPUKindMismatch`` when this machine's GPUs are not all of kind ``expected`` (a name the table does
    not know counts as a mismatch: its numbers would be stored under ``expected``'s)."""
    names = local_gpu_names()
    if not names:
        return
    kinds = {kind_of(n) for n in names}
    if kinds == {expected}:
        return
    found = ", ".join(sorted(set(names)))
    known = sorted(k for k in kinds if k is not None)
    fix = f"set cluster.gpu to {known[0]}" if len(known) == 1 and None not in kinds else \
        f"run it where the GPUs are {expected}s"
    raise GPUKindMismatch(f"cluster.gpu: the job says {expected}, but this machine's GPUs are {found}; what is "
                          f"measured here would be stored as {expected}'s: {fix}")
