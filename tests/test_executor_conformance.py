"""One contract, three executors: the simulated one, the local one and the Ray one (``executors/base.py``).

Each executor is built from the same job as ``advisor tune`` builds it (``make_executor``; the tiny dummy-weight MoE
on the CPU build of vLLM for the real ones, a private local Ray cluster for Ray) and held for the module. Ray pays
one vLLM start for the success contracts; the local executor's success contracts read the session's probe
deployment (``tiny_local_probe``, an ``evaluate`` of a local job built the same way). Each real one then pays a
start for the deployment that cannot start, and the local one one for the interrupted measure. The contracts:

* ``evaluate`` (deploy → measure → teardown) returns a ``RunResult`` with every load level asked for, each with the
  objectives' values, and its timings; afterwards no process group it recorded runs, no process works in its
  deployment's folder, and on Ray no actor or placement group is left;
* a deployment whose server refuses its flags comes back as ``FailureKind.START`` with vLLM's reason, no level,
  and nothing left running (the simulated executor starts nothing, so nothing fails to start there);
* a measure stopped in the middle of a level — by an error or by Ctrl-C — still tears everything down: an error
  becomes ``FailureKind.INTERNAL``, Ctrl-C leaves ``evaluate`` with the run marked ``INTERRUPTED``. On the real
  executors the stop is a signal to this process once the server has taken the level's first request (what a
  user's Ctrl-C is); only the Ctrl-C case runs there, the error case taking the same ``finally`` in ``evaluate``;
* ``close`` leaves nothing the executor held across trials (Ray: the private cluster and its workers).

Run: ``pytest tests/test_executor_conformance.py`` (``-m "not vllm"``: the simulated executor alone; the real ones
need the CPU build of vLLM, and Ray).
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from advisor.executor_factory import make_executor
from advisor.job import TuningJob, job_from_dict
from advisor.objectives import objective_names, score
from executors import place
from executors.base import Executor, FailureKind, RunResult
from executors.processes import procs
from search_spaces import DeploymentConfig
from tests.shared_runs import PROBE_CONFIG
from tests.trial_processes import trial_processes

#: One level of a few short prompts, no warm-up, no knee search: the least a real level can be.
LEVELS = [2]
WORKLOAD = {"dataset": "random", "isl": {"mean": 64, "range_ratio": 0.2}, "osl": {"mean": 16, "range_ratio": 0.2},
            "load_levels": LEVELS, "prompts_per_concurrency": 2, "min_prompts": 4, "warmups_per_concurrency": 0,
            "knee_search": False}
#: The level the stop tests interrupt: the same requests (the servers' context length is the module's), one at a
#: time and many, so that the stop lands while it runs; it is never measured to the end.
LONG = {**WORKLOAD, "load_levels": [1], "min_prompts": 200}
CONFIG = DeploymentConfig.model_validate(
    {"mode": "aggregated", "decode": {"role": "mixed", "max_num_seqs": 4, "max_num_batched_tokens": 1024}})
BROKEN_FLAG = ["--max-num-seqs", "notanumber"]


def _job(kind: str, work: Path, workload: dict[str, Any] = WORKLOAD) -> TuningJob:
    """The job every executor is built from. ``health_s`` is only a ceiling: Ray's first deploy starts the private
    cluster inside it, and vLLM starts slowly on a machine other tests load too."""
    return job_from_dict({"name": "conformance", "preset": "cpu-tiny-moe",
                          "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 1}, "workload": workload,
                          "objective": {"mode": "pareto"},
                          "executor": {"kind": kind, "run_dir": str(work / "runs"), "timeouts": {"health_s": 420}}})


@pytest.fixture(scope="module", params=[
    "simulated",
    pytest.param("local", marks=pytest.mark.vllm),
    pytest.param("ray", marks=[pytest.mark.vllm, pytest.mark.ray]),
])
def executor(request, tmp_path_factory) -> Iterator[tuple[Executor, TuningJob]]:
    """The executor of one kind, built as ``advisor tune`` builds it, for the whole module (Ray: one cluster)."""
    job = _job(request.param, tmp_path_factory.mktemp(request.param))
    ex = make_executor(job)
    try:
        yield ex, job
    finally:
        ex.close()


@pytest.fixture(scope="module")
def run(executor, request) -> dict[str, Any]:
    """One ``evaluate`` on this executor, with what ran during it and the job it ran. The local executor's is the
    session's probe deployment (``tiny_local_probe``, tests/shared_runs.py: ``evaluate`` through ``make_executor``
    of a local job, its levels and resources as the contract reads them): one vLLM start spared."""
    ex, job = executor
    if ex.kind == "local":
        probe = request.getfixturevalue("tiny_local_probe")
        r = probe["run"]
        return {"result": r, "topology": place(PROBE_CONFIG, probe["job"].cluster), "started": probe["started"],
                "job": probe["job"]}
    seen: dict[str, Any] = {"started": []}
    topo = place(CONFIG, job.cluster)
    r = ex.evaluate(topo, job.workload, on_started=lambda res: seen["started"].append(res))
    return {"result": r, "topology": topo, "job": job, **seen}


# ---------------------------------------------------------------------------------------------- helpers
def _left_behind(ex: Executor, res: dict[str, Any]) -> list[str]:
    """What of a torn-down deployment (its resources ``res``) still exists: live processes of its recorded groups,
    live processes working in or naming its folder, and on Ray live actors and placement groups."""
    left = [f"pid {pid}: {shown}" for (pid, _), shown in trial_processes(res).items()]
    for g in {*(res.get("pgids") or []), *(res.get("bench_pgids") or [])}:
        try:
            os.killpg(int(g), 0)
            left.append(f"process group {g}")
        except ProcessLookupError:
            pass
    left += _working_in(res.get("run_dir"))
    if ex.kind == "ray":
        left += _ray_left()
    return left


def _working_in(folder: str | None) -> list[str]:
    """Live processes whose working folder is in ``folder`` or whose command line names it (not this one)."""
    if not folder:
        return []
    out = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (cwd == folder or cwd.startswith(folder + "/") or folder in cmd) and procs.pid_alive(pid):
            out.append(f"pid {pid} in {cwd}: {cmd[:120]}")
    return out


def _ray_left(wait_s: float = 60) -> list[str]:
    """Actors still alive and placement groups not removed on the private cluster (``ray.kill`` is asynchronous:
    waited for up to ``wait_s``)."""
    import ray
    from ray._private.state import actors
    from ray.util import placement_group_table

    assert ray.is_initialized(), "the module's Ray connection closed before the check"
    deadline = time.monotonic() + wait_s
    while True:
        alive = [f"actor {a}" for a, v in actors().items() if v["State"] != "DEAD"]
        pgs = [f"placement group {p}" for p, v in placement_group_table().items() if v["state"] != "REMOVED"]
        if not (alive or pgs) or time.monotonic() > deadline:
            return alive + pgs
        time.sleep(0.5)


def _why(r: RunResult) -> str:
    return f"{r.failure}: {r.reason}\n{r.log_tail}"


@contextmanager
def _serve_args(ex: Executor, args: list[str]) -> Iterator[None]:
    """``ex``'s extra ``vllm serve`` arguments replaced for the ``with`` (the module's one executor: on Ray one
    cluster for every test)."""
    before = ex.extra_serve_args  # type: ignore[attr-defined]
    ex.extra_serve_args = list(args)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        ex.extra_serve_args = before  # type: ignore[attr-defined]


class Stopped(RuntimeError):
    """The error the stop test raises in the middle of a level."""


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped("stopped by the test in the middle of a level")


@contextmanager
def _stopped_mid_level(ex: Executor, how: str) -> Iterator[dict[str, Any]]:
    """``ex.measure`` stopped in the middle of its first level for the ``with``: by Ctrl-C (``how="interrupt"``:
    SIGINT to this process) or by an error (``"error"``: ``Stopped`` raised by a SIGUSR1 handler). A real
    executor is signalled once its first server has taken a request of the level; the simulated one, whose
    levels take no time, raises at the start of its measure. Yields what happened (``signalled``)."""
    measure: Callable[..., Any] = ex.measure
    sig = signal.SIGINT if how == "interrupt" else signal.SIGUSR1
    out: dict[str, Any] = {"signalled": False}

    def stopped_measure(dep, workload, plan=None):
        if ex.simulated:
            out["signalled"] = True
            raise KeyboardInterrupt if how == "interrupt" else Stopped("stopped by the test")
        log = Path(next(p for n, p in dep.resources["log_paths"].items() if n != "router"))
        done = threading.Event()

        def watch() -> None:
            seen = log.stat().st_size
            while not done.is_set():
                with log.open("rb") as fh:
                    fh.seek(seen)
                    new = fh.read()
                seen += len(new)
                if b"POST /v1/completions" in new:
                    out["signalled"] = True
                    os.kill(os.getpid(), sig)
                    return
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, name="stop-mid-level", daemon=True)
        watcher.start()
        try:
            return measure(dep, workload, plan)
        finally:
            done.set()
            watcher.join()

    old = signal.signal(signal.SIGUSR1, _raise_stopped) if how == "error" else None
    ex.measure = stopped_measure  # type: ignore[method-assign]
    try:
        yield out
    finally:
        del ex.measure  # the class's own again
        if old is not None:
            signal.signal(signal.SIGUSR1, old)


# ---------------------------------------------------------------------------------------------- contracts
def test_evaluate_measures_every_level_with_the_objectives(run, executor) -> None:
    ex, job = executor[0], run["job"]
    r: RunResult = run["result"]
    assert r.ok and r.failure is None and r.reason is None, _why(r)
    assert [m.concurrency for m in r.measurements] == job.workload.load_levels
    for m in r.measurements:
        assert m.source == ("simulated" if ex.simulated else "measured")
        assert m.gpus == run["topology"].gpus
        assert m.num_requests >= job.workload.min_prompts and m.completed == m.num_requests and m.failed == 0
        assert m.throughput_per_gpu and m.throughput_per_gpu > 0
        assert m.p50_ttft_ms is not None and 0 < m.p50_ttft_ms <= m.p99_ttft_ms
        for name in objective_names(job):  # every objective a study tells its sampler has a value at every level
            assert getattr(m, name) is not None, name
    outcome = score(job, r.measurements)
    assert outcome.best in r.measurements and len(outcome.values) == len(objective_names(job))
    assert all(math.isfinite(v) for v in outcome.values)
    t = r.timings
    assert min(t.deploy_s, t.warmup_s, t.measure_s, t.teardown_s) >= 0
    if not ex.simulated:
        assert t.deploy_s > 0 and t.measure_s > 0 and t.teardown_s > 0


def test_evaluate_reports_its_resources_and_leaves_nothing_running(run, executor) -> None:
    ex, _ = executor
    r: RunResult = run["result"]
    assert r.ok, _why(r)
    if ex.simulated:
        assert r.resources == {} and run["started"] == [{}, {}]  # nothing started, nothing to stop
        return
    res = r.resources
    assert res["executor"] == ex.kind and res["pgids"] and all(res["stopped"].values())
    # told as they grew, then once more after teardown: the last record is the one the result carries
    assert run["started"][-1] == json.loads(json.dumps(res, default=str))
    assert Path(res["run_dir"], "resources.json").is_file() and not os.path.exists(res["kv_dir"])
    if ex.kind == "ray":
        assert len(res["placement_groups"]) == 1
    assert _left_behind(ex, res) == []


def test_a_deployment_that_cannot_start_fails_at_start_and_leaves_nothing(executor, monkeypatch) -> None:
    ex, job = executor
    if ex.simulated:
        pytest.skip("the simulated executor starts nothing: no deployment of it can fail to start")
    monkeypatch.setenv("DEPLOY_ADVISOR_BENCH_ZYGOTE", "1")  # local: the levels' client starts with the servers
    seen: list[dict[str, Any]] = []
    with _serve_args(ex, BROKEN_FLAG):
        r = ex.evaluate(place(CONFIG, job.cluster), job.workload, on_started=seen.append)
    assert r.failure is FailureKind.START and not r.ok and r.measurements == [], _why(r)
    assert "invalid int value: 'notanumber'" in (r.reason or "") and "notanumber" in (r.log_tail or "")
    assert (r.reason or "").startswith(f"{place(CONFIG, job.cluster).instances[0].name}")  # which server said it
    # deploy tears a half-started deployment down itself; its record on disk says so
    assert seen, "the failed deployment never told what it started"
    record = seen[-1]
    assert record["pgids"] and record["stopped"]
    if ex.kind == "local":  # the client started at deploy, stopped with the servers though no level ran
        assert len(record["bench_pgids"]) == 1 and record["bench_pgids"][0] not in record["pgids"]
    assert _left_behind(ex, record) == []


@pytest.mark.parametrize("how", ["interrupt", "error"])
def test_a_measure_stopped_mid_level_still_tears_down(executor, how: str, tmp_path: Path) -> None:
    ex, job = executor
    if how == "error" and not ex.simulated:
        pytest.skip("the error case takes the interrupt's teardown (``evaluate``'s finally); one vLLM start spared")
    if ex.kind == "ray":
        pytest.skip("Ray's measure stopped mid-level is tests/test_stop_real.py's (through `advisor tune`, levels "
                    "kept too); one Ray deploy spared")
    wl = _job(ex.kind, tmp_path, LONG).workload
    seen: list[dict[str, Any]] = []
    with _stopped_mid_level(ex, how) as stop:
        if how == "interrupt":
            with pytest.raises(KeyboardInterrupt) as caught:
                ex.evaluate(place(CONFIG, job.cluster), wl, on_started=seen.append)
            r = caught.value.run  # type: ignore[attr-defined]
            assert r.failure is FailureKind.INTERRUPTED
        else:
            r = ex.evaluate(place(CONFIG, job.cluster), wl, on_started=seen.append)
            assert r.failure is FailureKind.INTERNAL and "Stopped" in (r.reason or ""), _why(r)
    assert stop["signalled"], "the level ended before the stop reached it"
    assert r.measurements == []  # the one level was stopped: nothing measured
    assert seen and r.timings.teardown_s >= 0
    if ex.simulated:
        return
    record = seen[-1]  # the record told after teardown
    assert record["pgids"] and all(record["stopped"].values())
    assert _left_behind(ex, record) == []


def test_close_releases_what_the_executor_holds(executor) -> None:
    """The module's last test: ``close`` (what ``advisor tune`` calls once its study ends) leaves nothing running
    that the executor held across trials — Ray: the private cluster it started."""
    ex, _ = executor
    head = getattr(ex, "_head", None)
    ex.close()
    if ex.kind == "ray":
        import ray

        assert head is not None and not ray.is_initialized()
        with pytest.raises(ProcessLookupError):
            os.killpg(head.pgid, 0)
        assert procs.marked_processes([str(Path(head.log_path).resolve())]) == []  # nor any of its workers
    assert not getattr(ex, "_next", None)  # local: no server left waiting for a next deployment
