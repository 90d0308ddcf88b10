"""Turning a DeploymentConfig into numbers: placement, command lines, and the executors.

The public names below are loaded on first use (PEP 562): ``import executors`` imports nothing else, so a caller
that needs ``place`` does not pay for the Ray executor, the benchmark driver or the performance model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name → the module that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["Deployment", "DeploymentFailed", "Executor", "FailureKind", "PreflightFailed", "RunResult",
                     "Timings"], "executors.base"),
    **dict.fromkeys(["Platform", "cpu_platform", "gpu_platform"], "executors.vllm.platform"),
    **dict.fromkeys(["Endpoint", "launch_script", "role_flags", "router_args", "serve_args", "serve_command"],
                    "executors.vllm.render"),
    **dict.fromkeys(["Instance", "NodeShard", "Topology", "place"], "executors.topology"),
    "LocalExecutor": "executors.local",
    "RayExecutor": "executors.ray.executor",
    "SimulatedExecutor": "executors.simulated.executor",
    "make_tiny_moe": "executors.vllm.tiny_model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'executors' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # what type checkers and IDEs see
    from executors.base import (  # noqa: F401
        Deployment,
        DeploymentFailed,
        Executor,
        FailureKind,
        PreflightFailed,
        RunResult,
        Timings,
    )
    from executors.local import LocalExecutor  # noqa: F401
    from executors.ray.executor import RayExecutor  # noqa: F401
    from executors.simulated.executor import SimulatedExecutor  # noqa: F401
    from executors.topology import Instance, NodeShard, Topology, place  # noqa: F401
    from executors.vllm.platform import Platform, cpu_platform, gpu_platform  # noqa: F401
    from executors.vllm.render import (  # noqa: F401
        Endpoint,
        launch_script,
        role_flags,
        router_args,
        serve_args,
        serve_command,
    )
    from executors.vllm.tiny_model import make_tiny_moe  # noqa: F401
