"""Where vLLM runs: the GPU build, or the CPU build standing in for it in CI and on laptops.

A platform holds what differs between the two and nothing else: the launch command, environment,
extra serve flags, and the KV connector for P/D. Everything else about a command line is the same.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from search_spaces import Role


class Platform(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    engine_cmd: list[str] = Field(description="What runs `serve` and `bench serve`.")
    router_cmd: list[str] = Field(default_factory=lambda: ["vllm-router"])
    env: dict[str, str] = Field(default_factory=dict)
    serve_flags: dict[str, str | int | bool] = Field(default_factory=dict,
                                                    description="`vllm serve` flags of the platform ({flag: value}).")
    kv_connector: str = "NixlConnector"
    kv_connector_extra: dict[str, Any] = Field(default_factory=dict)
    cpu_per_gpu_slot: bool = Field(False, description="Each GPU slot is one CPU core (VLLM_CPU_OMP_THREADS_BIND).")

    def kv_transfer_config(self, role: Role, connector: str | None = None) -> dict[str, Any]:
        """The ``--kv-transfer-config`` value of a P/D role (a JSON object)."""
        kv_role = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}.get(role, "kv_both")
        conn = connector or self.kv_connector
        cfg: dict[str, Any] = {"kv_connector": conn, "kv_role": "kv_both" if conn == "NixlConnector" else kv_role}
        if self.kv_connector_extra:
            cfg["kv_connector_extra_config"] = self.kv_connector_extra
        return cfg

    def engine_line(self) -> str:
        return shlex.join(self.engine_cmd)


def gpu_platform(engine_cmd: list[str] | None = None) -> Platform:
    return Platform(name="gpu", engine_cmd=engine_cmd or ["vllm"])


def cpu_platform(kv_storage_path: str = "/tmp/deploy-advisor-kv", engine_cmd: list[str] | None = None) -> Platform:
    """vllm-cpu 0.32: the distribution is ``vllm-cpu``, so the ``vllm`` script and ``python -m
    vllm.entrypoints.cli.main`` both fail (``PackageNotFoundError: vllm``); ``executors.vllm.cli`` runs
    vLLM's own CLI around that."""
    return Platform(
        name="cpu",
        engine_cmd=engine_cmd or [sys.executable, "-m", "executors.vllm.cli"],
        router_cmd=[sys.executable, "-m", "vllm_router.launch_router"],
        env={
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        },
        serve_flags={"--load-format": "dummy", "--enforce-eager": True, "--dtype": "bfloat16"},
        kv_connector="ExampleConnector",
        kv_connector_extra={"shared_storage_path": kv_storage_path},
        cpu_per_gpu_slot=True,
    )
