"""Turning a DeploymentConfig into numbers: placement, command lines, and the executors."""

from executors.base import (
    Deployment,
    DeploymentFailed,
    Executor,
    FailureKind,
    PreflightFailed,
    RunResult,
    Timings,
)
from executors.platform import Platform, cpu_platform, gpu_platform
from executors.render import Endpoint, launch_script, role_flags, router_args, serve_args, serve_command
from executors.topology import Instance, NodeShard, Topology, place

# The real executors load vLLM/Ray only when they deploy, so importing them here costs nothing.
from executors.local import LocalExecutor  # noqa: E402
from executors.ray_executor import RayExecutor  # noqa: E402
from executors.simulated import SimulatedExecutor  # noqa: E402
from executors.test_model import make_tiny_moe  # noqa: E402

__all__ = [
    "PreflightFailed",
    "Deployment", "DeploymentFailed", "LocalExecutor", "RayExecutor", "SimulatedExecutor", "make_tiny_moe", "Endpoint", "Executor", "FailureKind", "Instance", "NodeShard", "Platform",
    "RunResult", "Timings", "Topology", "cpu_platform", "gpu_platform", "launch_script", "place", "role_flags",
    "router_args", "serve_args", "serve_command",
]
