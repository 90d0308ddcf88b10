"""Real runs that several test files assert on (a pytest plugin: ``tests/conftest.py`` loads it).

Each CPU vLLM cold start costs tens of seconds on the 2-core CI machine, so a deployment that can answer several
files' questions is started once per session.

``tiny_local_probe``: the tiny dummy-weight MoE (max-num-seqs 4, one instance) on the local executor, measured by
``evaluate`` at concurrency 1 and 8 (``evaluate_probe``) — the local-executor checks of tests/test_executors_real.py
and the local executor's ``evaluate`` contracts in tests/test_executor_conformance.py.
On the same servers, after those two levels and before the teardown, the agentic and prefix workloads run (what
tests/test_executors_real.py asserts on them), then one level during which the server is paused with SIGSTOP
(``STALL``, what tests/test_stall_real.py asserts on); they cannot change the probe's numbers, which were taken first.
tests/test_knee_real.py evaluates the same probe again right before its study (``evaluate_probe``): an SLO taken
from a probe measured minutes earlier failed every level of the study once (CI, 4 Dec: c=1 73 ms in the session's
probe, 165 ms in the study).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from search_spaces import Dataset, DeploymentConfig, LengthDist, Workload

#: The knee study's candidate and workload (tests/test_knee_real.py): the probe measures exactly what the study
#: will deploy, at the two initial levels.
PROBE_SEQS = 4
PROBE_JOB: dict[str, Any] = {
    "name": "knee-probe",
    "preset": "cpu-tiny-moe",
    "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 1},
    "workload": {"dataset": "random", "isl": {"mean": 256, "range_ratio": 0.2}, "osl": {"mean": 32, "range_ratio": 0.2},
                 "load_levels": [1, 8], "prompts_per_concurrency": 3, "min_prompts": 16, "warmups_per_concurrency": 1,
                 "max_load": 8, "max_levels": 6, "knee_tolerance": 0.15, "knee_search": False},
    "space": {"modes": ["aggregated"],
              "mixed": {"instances": [1], "dp_sizes": [1], "max_num_seqs": [PROBE_SEQS],
                        "max_num_batched_tokens": [2048]}},
}
PROBE_LEVELS = [1, 8]
#: The probe's deployment: PROBE_JOB's one candidate.
PROBE_CONFIG = DeploymentConfig.model_validate(
    {"mode": "aggregated", "decode": {"role": "mixed", "max_num_seqs": PROBE_SEQS, "max_num_batched_tokens": 2048}})

# Two more workloads on the probe's deployment: vLLM's custom dataset fed by executors.measuring.datasets (multi-turn
# sessions whose context grows) and its random dataset with a shared prefix. vLLM's CPU block size is 128 tokens,
# so the shared parts are longer than one block.
AGENTIC = Workload(dataset=Dataset.AGENTIC, isl=LengthDist(mean=48, range_ratio=0.25), osl=LengthDist(mean=8),
                   prefix_reuse=0.5, turns=3, load_levels=[2], prompts_per_concurrency=6,
                   warmups_per_concurrency=0, min_prompts=8)
PREFIX = Workload(dataset=Dataset.PREFIX, isl=LengthDist(mean=256, range_ratio=0.25), osl=LengthDist(mean=8),
                  prefix_reuse=0.75, load_levels=[2], prompts_per_concurrency=4, warmups_per_concurrency=0,
                  min_prompts=8)


# One level on the probe's deployment during which the test pauses the server (SIGSTOP to its process group) once
# it takes its first request (``pause_once_in_flight``): a stall the measure loop must measure again
# (``LevelProbe._unstall``). The pause is longer than the ~3 s that would do on a clean level: a level is stalled at
# 20× its reference gap, and where the loaded 2-core machine delivers each response in one lump the reference is a
# request's whole latency — 0.25 s at OSL 64 on 4 Dec (a 5-s pause was then detected with 0.6% to spare).
STALL = Workload(dataset=Dataset.RANDOM, isl=LengthDist(mean=64), osl=LengthDist(mean=32), load_levels=[2],
                 prompts_per_concurrency=6, warmups_per_concurrency=0, min_prompts=12)
STALL_PAUSE_S = 10.0


def pause_once_in_flight(pgid: int, log_path: str, pause_s: float, done: threading.Event, out: dict[str, Any]) -> None:
    """Wait until the server whose log is ``log_path`` takes a completion request (its access-log line, written
    when the response starts streaming), then stop its process group ``pgid`` for ``pause_s`` seconds — continued
    in a ``finally`` whatever happens — and record the pause in ``out``. Gives up when ``done`` is set first.

    The log, not ``/metrics``: a c=2 level of the tiny model lasts ~1 s on the loaded 2-core machine, and a
    scrape through the busy server missed all of it once (4 Dec). Any request the client starts during the pause
    waits, so the pause is in flight unless the client had sent its last request already."""
    log = Path(log_path)
    seen = log.stat().st_size if log.exists() else 0
    while not done.is_set():
        size = log.stat().st_size if log.exists() else 0
        if size > seen:
            with log.open("rb") as f:
                f.seek(seen)
                new = f.read(size - seen)
            seen = size
            if b"POST /v1/completions" in new:
                t0 = time.monotonic()
                os.killpg(pgid, signal.SIGSTOP)
                try:
                    time.sleep(pause_s)
                finally:
                    os.killpg(pgid, signal.SIGCONT)
                    out["paused_s"] = time.monotonic() - t0
                return
        time.sleep(0.02)


def measure_with_a_stall(measure: Callable[..., Any], dep: Any) -> tuple[Any, dict[str, Any]]:
    """``STALL`` measured on ``dep`` (a local deployment) while ``pause_once_in_flight`` pauses its first server:
    (the level, what the pause recorded)."""
    server = dep.handle.servers[0]
    out: dict[str, Any] = {"pgid": server.proc.pgid}
    done = threading.Event()
    pauser = threading.Thread(target=pause_once_in_flight, name="stall-pauser",
                              args=(server.proc.pgid, str(server.proc.log_path), STALL_PAUSE_S, done, out))
    pauser.start()
    try:
        (m,) = measure(dep, STALL)
    finally:
        done.set()
        pauser.join()
        os.killpg(server.proc.pgid, signal.SIGCONT)  # already continued by the pauser; never leave it stopped
    return m, out


def evaluate_probe(run_dir: Path, measure_hook: Callable[[Any], Callable[..., Any]] | None = None,
                   on_started: Callable[[dict[str, Any]], None] | None = None) -> tuple[Any, Any]:
    """``evaluate`` of the probe deployment (PROBE_JOB's candidate: deploy, warm-up, c=1 and c=8, tear down) with
    its folders under ``run_dir``; ``measure_hook(measure)`` may wrap the executor's measure step, ``on_started``
    is ``evaluate``'s. Returns (the run, the job)."""
    from advisor.executor_factory import make_executor
    from advisor.job import job_from_dict
    from executors import place

    job = job_from_dict({**PROBE_JOB, "executor": {"kind": "local", "run_dir": str(run_dir),
                                                   "timeouts": {"health_s": 240}}})
    ex = make_executor(job)
    if measure_hook is not None:
        ex.measure = measure_hook(ex.measure)
    try:
        return ex.evaluate(place(PROBE_CONFIG, job.cluster), job.workload, on_started=on_started), job
    finally:
        ex.close()


@pytest.fixture(scope="session")
def tiny_local_probe(tmp_path_factory) -> dict[str, Any]:
    """The probe deployment, evaluated once for the session (``evaluate_probe``); its measure step then also
    measures AGENTIC, PREFIX and STALL on the same servers. ``side`` holds those, the timings before and after
    them, the process groups, or the error they raised (reported by the test that reads them)."""
    tmp = tmp_path_factory.mktemp("tiny-local-probe")
    side: dict[str, Any] = {}

    def then_other_workloads(measure: Callable[..., Any]) -> Callable[..., Any]:
        def measure_then_other_workloads(dep, workload, plan=None):
            ms = measure(dep, workload, plan)
            own = dep.timings.warmup_s, dep.timings.measure_s  # the evaluate's timings are the probe's alone
            try:  # the evaluate's own result must not depend on these
                (side["agentic"],) = measure(dep, AGENTIC)
                (side["prefix"],) = measure(dep, PREFIX)
            except Exception as e:  # noqa: BLE001 — reported by the test that reads them
                side["error"] = e
            try:
                side["stall"], side["stall_pause"] = measure_with_a_stall(measure, dep)
            except Exception as e:  # noqa: BLE001 — reported by tests/test_stall_real.py
                side["stall_error"] = e
            finally:
                side["own"], side["after"] = own, (dep.timings.warmup_s, dep.timings.measure_s)
                dep.timings.warmup_s, dep.timings.measure_s = own
            side["pgids"] = list(dep.resources["pgids"])
            return ms
        return measure_then_other_workloads

    started: list[dict[str, Any]] = []
    t0 = time.monotonic()
    run, job = evaluate_probe(tmp / "runs", then_other_workloads, on_started=started.append)
    # ``runs``: where the executor put the deployment's folder (``run_dir`` / the job's name); ``started``: the
    # resources as ``evaluate`` told them (tests/test_executor_conformance.py's local run is this one)
    return {"run": run, "wall": time.monotonic() - t0, "runs": tmp / "runs" / job.name, "side": side, "job": job,
            "started": started}
