"""Where a deployment's levels fork from one imported vLLM (``executors.measuring.bench_zygote.usable``): GPU platforms
whose engine is this interpreter's vLLM, never the CPU build (its measured guard against bursty delivery), and the
environment override either way. The fork itself ran on the H200 (docs/benchmarks.md: 0.9-4.4 s per level)."""

from __future__ import annotations

import os
import sys

import pytest

from executors import cpu_platform, gpu_platform
from executors.measuring import bench_zygote


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv("DEPLOY_ADVISOR_BENCH_ZYGOTE", raising=False)


def test_gpu_platform_running_this_python_forks_and_the_cpu_build_does_not():
    here = gpu_platform(engine_cmd=[sys.executable, "-m", "vllm.entrypoints.cli.main"])
    assert bench_zygote.usable(here)
    assert not bench_zygote.usable(cpu_platform(kv_storage_path="/tmp/kv"))  # a fresh command per level on CPU


def _vllm_script(folder, interpreter: str):
    folder.mkdir(exist_ok=True)
    script = folder / "vllm"
    script.write_text(f"#!{interpreter}\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return script


def test_the_vllm_script_of_this_environment_forks(tmp_path, monkeypatch):
    """A GPU platform names ``vllm`` by default; a pip console script whose Python imports this vLLM forks."""
    _vllm_script(tmp_path / "bin", sys.executable)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert bench_zygote.usable(gpu_platform())
    assert bench_zygote.usable(gpu_platform(engine_cmd=[str(tmp_path / "bin" / "vllm")]))


def test_another_interpreters_vllm_is_never_forked_from_here(tmp_path, monkeypatch):
    # A Python that cannot import vLLM (isolated, no site-packages): its script is another environment's.
    isolated = tmp_path / "py"
    isolated.mkdir()
    (isolated / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    (isolated / "python3").chmod(0o755)
    _vllm_script(tmp_path / "bin", str(isolated / "python3"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert not bench_zygote.usable(gpu_platform(engine_cmd=["vllm"]))
    assert not bench_zygote.usable(gpu_platform(engine_cmd=["/nonexistent/python3", "-m", "vllm.entrypoints.cli.main"]))
    assert not bench_zygote.usable(gpu_platform(engine_cmd=["vllm-nightly", "serve"]))  # not vLLM's CLI as known


def test_the_environment_overrides_the_platform(monkeypatch):
    here = gpu_platform(engine_cmd=[sys.executable, "-m", "vllm.entrypoints.cli.main"])
    monkeypatch.setenv("DEPLOY_ADVISOR_BENCH_ZYGOTE", "0")
    assert not bench_zygote.usable(here)
    monkeypatch.setenv("DEPLOY_ADVISOR_BENCH_ZYGOTE", "1")
    assert bench_zygote.usable(cpu_platform(kv_storage_path="/tmp/kv"))
    assert not bench_zygote.usable(gpu_platform(engine_cmd=["/nonexistent/vllm"]))  # forced on, still only this one's
