"""Turning a DeploymentConfig into numbers: placement, command lines, and the executors."""

from executors.base import Deployment, DeploymentFailed, Executor, FailureKind, RunResult, Timings
from executors.platform import Platform, cpu_platform, gpu_platform
from executors.render import Endpoint, launch_script, role_flags, router_args, serve_args, serve_command
from executors.topology import Instance, NodeShard, Topology, place

__all__ = [
    "Deployment", "DeploymentFailed", "Endpoint", "Executor", "FailureKind", "Instance", "NodeShard", "Platform",
    "RunResult", "Timings", "Topology", "cpu_platform", "gpu_platform", "launch_script", "place", "role_flags",
    "router_args", "serve_args", "serve_command",
]
