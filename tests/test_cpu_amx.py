"""The CPU plugin that asks Linux for AMX permission in vLLM's processes (executors/vllm/cpu_amx.py): which
CPUs it acts on. That every real server of a study ran it (or, without AMX, did not) is checked on the real
servers' logs in tests/test_tune_real.py."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from executors.vllm.cpu_amx import cpu_has_amx

X86 = platform.machine() in ("x86_64", "AMD64")


@pytest.mark.skipif(not X86, reason="the flag is read on x86 only")
def test_amx_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    amx, avx = tmp_path / "amx", tmp_path / "avx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n")
    avx.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_tilex\n")
    assert cpu_has_amx(str(amx))
    assert not cpu_has_amx(str(avx))  # a flag is a whole word
    assert not cpu_has_amx(str(tmp_path / "missing"))
    assert not cpu_has_amx(str(tmp_path))  # unreadable: no AMX, never an exception
