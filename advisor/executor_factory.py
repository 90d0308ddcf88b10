"""The executor a job asks for, built from the job's ``executor`` section."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.errors import BadInput
from advisor.job import ExecutorKind, ExecutorSpec, TuningJob
from executors import Executor, Platform, cpu_platform, gpu_platform

if TYPE_CHECKING:
    from executors.perf import PerfParams


def platform_for(job: TuningJob, *, resolve_env: bool = False) -> Platform:
    """The job's platform with ``executor.env`` on top of the platform's own environment: resolved (``${NAME}``
    read from this process) for the processes a tuner starts, as written for the exports."""
    spec = job.executor
    kind = spec.platform
    if kind == "auto":
        kind = "cpu" if job.cluster.gpu == "CPU" else "gpu"
    run_dir = job.resolve_path(spec.run_dir)
    if kind == "cpu":
        platform = cpu_platform(kv_storage_path=str((run_dir / "kv").resolve()), engine_cmd=spec.engine_cmd)
    else:
        platform = gpu_platform(engine_cmd=spec.engine_cmd)
    env = resolved_env(job) if resolve_env else dict(spec.env)
    update: dict[str, object] = {"env": {**platform.env, **env}}
    if spec.router_cmd:
        update["router_cmd"] = spec.router_cmd
    return platform.model_copy(update=update)


def model_path_for(job: TuningJob) -> Path:
    """What real executors serve: the job's model folder, or the generated tiny test model."""
    if job.model.path:
        p = job.resolve_path(job.model.path)
        folder = p.parent if p.name == "config.json" else p
        if not (folder / "config.json").is_file():
            raise BadInput(f"model.path: {folder} holds no config.json")
        return folder
    if job.model.preset == "tiny-moe":
        from executors.vllm.tiny_model import make_tiny_moe

        return make_tiny_moe(job.resolve_path(job.executor.run_dir) / "models" / "tiny-moe")
    raise BadInput(
        f"model.preset: {job.model.preset!r} has no weights here; real executors need model.path "
        "(a folder with config.json and a tokenizer), or the 'tiny-moe' preset"
    )


def health_timeout_for(job: TuningJob) -> float:
    """``executor.timeouts.health_s``, else 300 s plus 60 s per 100 GB of weights: a full-size model reads
    its weights and compiles for minutes, a tiny one answers in seconds (the default is only a ceiling)."""
    t = job.executor.timeouts
    if t.health_s is not None:
        return t.health_s
    try:
        profile = job.model_profile()
        weights_gb = profile.total_weight_bytes / 1e9
    except Exception:  # noqa: BLE001 — a model the profile cannot size gets the base timeout
        weights_gb = 0.0
    return 300.0 + 60.0 * weights_gb / 100.0


def resolved_env(job: TuningJob) -> dict[str, str]:
    """``executor.env`` with every ``${NAME}`` read from this process's environment (a missing one is bad input).

    Only the tuner's processes see the resolved values; the job document, the database and the exports keep
    the ``${NAME}`` form, so a token given this way is never stored."""
    import os
    import re

    out: dict[str, str] = {}
    for key, value in job.executor.env.items():
        def sub(m: re.Match[str], key: str = key) -> str:
            name = m.group(1)
            if name not in os.environ:
                raise BadInput(f"executor.env.{key}: ${{{name}}} is not set in the tuner's environment")
            return os.environ[name]

        out[key] = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, value)
    return out


def _check_ray_address(address: str | None) -> None:
    """Fail before the study starts when a named Ray cluster does not answer (not at the first trial)."""
    if not address or address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise BadInput(f"--ray-address: {address!r} is not HOST:PORT (the Ray head's GCS address, e.g. 127.0.0.1:6379)")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise BadInput(f"--ray-address: no Ray head answers at {address} ({e.strerror or e})") from None


def model_params(job: TuningJob) -> PerfParams:
    """The performance model's parameters for this job: ``executor.perf_params`` (a calibrated profile) or the
    defaults of the cluster's GPU kind. The simulated executor predicts with them; a guided study starts
    its model from them."""
    from executors.perf import default_params
    from executors.perf.params import REFERENCE, reference_missing, reference_params

    spec = job.executor
    if not spec.perf_params:
        return default_params(job.cluster.gpu)
    if spec.perf_params == REFERENCE:
        ref = reference_params(job.cluster.gpu)
        if ref is None:
            raise BadInput(reference_missing(job.cluster.gpu))
        return ref
    try:
        return job.params_file()  # read once per job (``load_job`` read it first)
    except (OSError, ValueError) as e:
        raise BadInput(f"executor.perf_params: cannot load {job.resolve_path(spec.perf_params)}: {e}") from None


def executor_class(spec: ExecutorSpec) -> type[Executor]:
    """The class ``make_executor`` builds for ``spec``, unbuilt: what an executor can do (``Executor.simulated``)
    is asked of it, never read off a kind string (``simulated`` with ``reserve_gpus`` is still the model)."""
    if spec.kind is ExecutorKind.SIMULATED:
        if spec.reserve_gpus:
            from executors.simulated.reserved import ReservedSimulatedExecutor

            return ReservedSimulatedExecutor
        from executors.simulated.executor import SimulatedExecutor

        return SimulatedExecutor
    if spec.kind is ExecutorKind.LOCAL:
        from executors.local import LocalExecutor

        return LocalExecutor
    from executors.ray.executor import RayExecutor

    return RayExecutor


def is_simulated(spec: ExecutorSpec) -> bool:
    """A job with this ``executor`` section gets the performance model's numbers (no spread to measure, no
    baseline, exports say "simulated"): what ``advisor best``, the exports and the dashboard ask where they hold
    a job rather than its executor (the tuner asks its executor)."""
    return executor_class(spec).simulated


def make_executor(job: TuningJob, *, ray_address: str | None = None) -> Executor:
    spec = job.executor
    cls = executor_class(spec)  # which class: one place (``executor_class``); here only how it is built
    if spec.kind is ExecutorKind.SIMULATED:
        # no parameter file: the study resolves them (a stored hardware profile, else the defaults; advisor.profile)
        params = model_params(job) if spec.perf_params else None
        if spec.reserve_gpus:
            address = ray_address or spec.ray_address
            if not address:
                raise BadInput("executor.reserve_gpus: needs a Ray cluster to reserve on (executor.ray_address or "
                               "--ray-address)")
            _check_ray_address(address)
            return cls(job.model_profile(), params, ray_address=address, hold_s=spec.hold_s)  # type: ignore[call-arg]
        return cls(job.model_profile(), params)  # type: ignore[call-arg]
    if spec.kind is ExecutorKind.RAY:
        _check_ray_address(ray_address or spec.ray_address)
    platform = platform_for(job, resolve_env=True)
    if spec.kind is ExecutorKind.LOCAL and platform.name == "gpu":  # measured here, stored as the job's GPU kind
        from executors.vllm.gpu_kind import GPUKindMismatch, check_local_kind

        try:
            check_local_kind(job.cluster.gpu)
        except GPUKindMismatch as e:
            raise BadInput(str(e)) from None
    model_path = model_path_for(job)
    t = spec.timeouts
    common = dict(
        platform=platform,
        served_model_name=spec.served_model_name or job.name,
        max_model_len=job.workload.max_model_len,
        run_dir=job.resolve_path(spec.run_dir) / job.name,
        health_timeout_s=health_timeout_for(job),
        bench_timeout_s=t.benchmark_s,
        teardown_timeout_s=t.teardown_s,
        router_timeout_s=t.router_s,
        host=spec.host,
        extra_serve_args=spec.extra_serve_args,
        # what the workload asks of every server (routing simulator env, EPLB diagnosis)
        expert_routing=job.workload.expert_routing,
        eplb_log_balancedness=job.workload.eplb_log_balancedness,
    )
    if spec.kind is ExecutorKind.LOCAL:
        return cls(model_path, **common)  # type: ignore[call-arg]
    from executors import PreflightFailed

    ex = cls(model_path, ray_address=ray_address or spec.ray_address,  # type: ignore[call-arg]
             placement_timeout_s=t.placement_s, port_base=spec.port_base, **common)
    try:
        ex.preflight(job.cluster)  # a cluster that cannot run the job: one line, exit 2, before any write
    except PreflightFailed as e:
        ex.close()
        raise BadInput(str(e)) from None
    except BaseException:
        ex.close()
        raise
    return ex
