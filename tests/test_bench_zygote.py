"""Where a deployment's levels fork from one imported vLLM (``executors.measuring.bench_zygote.usable``): GPU platforms
whose engine is this interpreter's vLLM, never the CPU build (its measured guard against bursty delivery), and the
environment override either way. The fork itself ran on the H200 (docs/benchmarks.md: 0.9-4.4 s per level)."""

from __future__ import annotations

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


def test_another_interpreters_vllm_is_never_forked_from_here():
    assert not bench_zygote.usable(gpu_platform(engine_cmd=["vllm"]))  # a script: maybe another environment
    assert not bench_zygote.usable(gpu_platform(engine_cmd=["/nonexistent/python3", "-m", "vllm.entrypoints.cli.main"]))


def test_the_environment_overrides_the_platform(monkeypatch):
    here = gpu_platform(engine_cmd=[sys.executable, "-m", "vllm.entrypoints.cli.main"])
    monkeypatch.setenv("DEPLOY_ADVISOR_BENCH_ZYGOTE", "0")
    assert not bench_zygote.usable(here)
    monkeypatch.setenv("DEPLOY_ADVISOR_BENCH_ZYGOTE", "1")
    assert bench_zygote.usable(cpu_platform(kv_storage_path="/tmp/kv"))
    assert not bench_zygote.usable(gpu_platform(engine_cmd=["vllm"]))  # forced on, still only this interpreter's
