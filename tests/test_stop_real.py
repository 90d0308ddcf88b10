"""Stopping at a limit is safe: SIGTERM to `advisor tune`'s process group (what `timeout`, a scheduler or a
wall-clock limit sends) in the middle of a real trial's levels.

One deployment of the tiny dummy-weight MoE (CPU build of vLLM) measured at six fixed levels; once three levels'
results are on disk the tuner's whole process group gets SIGTERM. The tuner must exit promptly, leave no process
of the trial (server, router, load generator — nor, with the Ray executor, the private Ray cluster it started,
whose processes are a session of their own that the signal never reached), and store the levels it measured
with the trial marked interrupted, where calibration finds them. Each case costs one vLLM cold start (~1 min).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import db
from advisor.calibrate import measured_samples
from advisor.job import job_from_dict
from db import queries
from executors.processes import procs
from search_spaces import TrialState
from tests.trial_processes import Seen, kill, snapshot, still_running, trial_processes

LEVELS = [1, 2, 3, 4, 5, 6]
#: Seconds the tuner may take from SIGTERM to exit: stopping the level's client and the deployment (vLLM's
#: server answers TERM in seconds; the group stop's KILL comes after 30 s).
EXIT_WITHIN_S = 120


def _job(kind: str, work: Path) -> dict:
    return {"name": "stop", "preset": "cpu-tiny-moe", "sampler": {"kind": "grid", "seed": 0},
            "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 1},
            "workload": {"dataset": "random", "isl": {"mean": 128, "range_ratio": 0.2},
                         "osl": {"mean": 16, "range_ratio": 0.2}, "knee_search": False, "load_levels": LEVELS,
                         "prompts_per_concurrency": 2, "min_prompts": 8, "warmups_per_concurrency": 1},
            "space": {"modes": ["aggregated"],
                      "mixed": {"instances": [1], "dp_sizes": [1], "max_num_seqs": [4],
                                "max_num_batched_tokens": [2048]}},
            "baseline": {"enabled": False}, "budget": {"trials": 1, "repeat_top": 0},
            "executor": {"kind": kind, "run_dir": str(work / "runs"), "timeouts": {"health_s": 240}}}


def _level_results(runs: Path) -> list[Path]:
    """The measured levels' saved results (``c<N>.json``; the warm-up's is ``warmup-…``)."""
    return sorted(p for p in runs.rglob("c*.json") if p.parent.name == "bench")


@pytest.mark.vllm
# the local executor's SIGTERM takes the same path in `advisor tune`; left out of CI for time
@pytest.mark.parametrize("kind", [pytest.param("ray", marks=pytest.mark.ray)])
def test_sigterm_mid_levels_stops_everything_and_keeps_the_levels(kind: str, tmp_path: Path) -> None:
    work, url = tmp_path, f"sqlite:///{tmp_path / 'stop.db'}"
    runs = work / "runs"
    job = _job(kind, work)
    (work / "job.yaml").write_text(json.dumps(job))
    # a session of its own, as a shell's job or `timeout`'s child is: its pid is the group SIGTERM goes to
    tuner = procs.start([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], name="tuner",
                        log_path=work / "tuner.log", cwd=work, env={"RAY_USAGE_STATS_ENABLED": "0"})
    try:
        deadline = time.monotonic() + 900
        while len(done := _level_results(runs)) < 3:
            assert tuner.poll() is None, tuner.tail(60)
            assert time.monotonic() < deadline, tuner.tail(60)
            time.sleep(0.3)
        os.killpg(tuner.pgid, signal.SIGTERM)
        t0 = time.monotonic()
        tuner.popen.wait(timeout=EXIT_WITHIN_S)
        exit_s = time.monotonic() - t0
    finally:
        if tuner.poll() is None:
            procs.stop(tuner)
    left = procs.marked_processes([], runs)  # every process the tuner started carries a log path under runs/
    for m in left:  # the next test must not inherit them
        procs.stop_group(m.pgid, 5)
    assert tuner.poll() != 0, tuner.tail(40)
    assert len(done) < len(LEVELS), "the study ended before the signal: nothing was stopped mid-trial"
    assert not left, f"processes left after SIGTERM: {[(m.pid, m.mark) for m in left]}\n{tuner.tail(40)}"

    database = db.connect(url)
    try:
        trials = [queries.get_trial(database, "stop", t.number) for t in queries.list_trials(database, "stop")]
        assert len(trials) == 1, [(t.number, t.state) for t in trials]
        t = trials[0]
        assert t.state is TrialState.INTERRUPTED and t.failure_kind == "interrupted", (t.state, t.reason)
        assert (t.reason or "").startswith("interrupted") and "measured before it kept" in t.reason, t.reason
        assert all(not procs.group_alive(int(g)) for g in (t.resources or {}).get("pgids", []))
        stored = sorted(m.concurrency for m in t.measurements)
        # every level whose result was on disk at the signal — but the last, whose counters may still have been
        # read when it landed (then that level is cut short, as is the one whose client was running)
        assert len(stored) >= max(2, len(done) - 1) and set(stored) <= set(LEVELS), (stored, done)
        assert all(m.source == "measured" and m.completed for m in t.measurements)
        assert t.deploy_s and t.measure_s and t.teardown_s is not None
        samples = measured_samples(database, "stop", job_from_dict(job))
        assert [s.number for s in samples] == [t.number] and len(samples[0].measured) == len(stored)
    finally:
        database.close()
    print(f"{kind}: {len(stored)} levels kept of {len(LEVELS)}; exited {exit_s:.1f} s after SIGTERM")


@pytest.mark.vllm
@pytest.mark.ray
def test_sigkill_mid_levels_then_cleanup_leaves_no_process_of_the_trial(tmp_path: Path) -> None:
    """SIGKILL, the signal nothing can catch, to the tuner alone while a Ray trial measures (server, router,
    load generator running, in process groups the agents started): `advisor cleanup` must stop every one of them
    — the router too, which renamed itself (``vllm::router``) and so carries no environment mark — and the
    private Ray cluster the tuner started (a session of its own, which outlives it). The local executor's case is
    tests/test_knee_real.py's killed study (resumed there).

    Before the kill, while the tuner lives, `advisor cleanup --stale-after 0` must leave the trial alone: its
    tuner is alive on this host (``worker_dead``), so nothing of it is stopped or closed and it goes on measuring
    (a cleanup that stopped it made the live tuner die with ``IllegalTransition``). One deployment for both."""
    work, url = tmp_path, f"sqlite:///{tmp_path / 'kill.db'}"
    runs = work / "runs"
    (work / "job.yaml").write_text(json.dumps(_job("ray", work)))
    # Ray kills a dead actor's child processes itself by default; off (as on clusters that turn it off, and for
    # agents whose raylet died), so that what stops them is the cleanup under test (tests/hosts.py does the same)
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_kill_child_processes_on_worker_exit": "0"}
    tuner = procs.start([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], name="tuner",
                        log_path=work / "tuner.log", cwd=work, env=env)
    seen: Seen = {}
    cluster: Seen = {}
    try:
        deadline = time.monotonic() + 900

        def wait_levels(n: int) -> None:
            while len(_level_results(runs)) < n:
                assert tuner.poll() is None, tuner.tail(60)
                assert time.monotonic() < deadline, tuner.tail(60)
                time.sleep(0.3)

        wait_levels(1)  # a level measured: the router answers, the load generator runs
        live = subprocess.run([sys.executable, "-m", "advisor", "cleanup", "stop", "--stale-after", "0", "--storage",
                               url], cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert live.returncode == 0 and "no running trial without a live tuner" in live.stdout, \
            live.stdout + live.stderr
        wait_levels(2)  # the live tuner's trial goes on: its next level measured after the cleanup
        tuner.popen.send_signal(signal.SIGKILL)
        tuner.popen.wait(timeout=30)
        database = db.connect(url)
        try:
            (t,) = [queries.get_trial(database, "stop", r.number) for r in queries.list_trials(database, "stop")]
        finally:
            database.close()
        assert t.state is TrialState.RUNNING, (t.state, t.reason)  # the live tuner's cleanup closed nothing
        res = t.resources or {}
        seen = trial_processes(res)
        # the private Ray cluster the tuner started: Ray's processes carry its head's log under runs/
        cluster = {k: v for k, v in snapshot(m.pid for m in procs.marked_processes([], runs)).items() if k not in seen}
        router = next(p["pgid"] for p in res["processes"] if p["name"] == "router")
        cleanup = subprocess.run([sys.executable, "-m", "advisor", "cleanup", "stop", "--storage", url], cwd=work,
                                 capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        left, cluster_left = still_running(seen), still_running(cluster)
    finally:
        if tuner.poll() is None:
            procs.stop(tuner)
        kill(seen | cluster)  # the next test must not inherit what the cleanup missed
    assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr
    assert router in {pid for pid, _ in seen}, f"the router was not running at the kill: {seen}"
    assert f"stopped process group {router} (router)" in cleanup.stdout, cleanup.stdout
    assert not left, f"processes of the killed trial still running after `advisor cleanup`: {left}\n{cleanup.stdout}"
    assert cluster, "the killed tuner left no private Ray cluster: nothing of it was tested"
    assert not cluster_left, f"the dead tuner's private Ray cluster still runs: {cluster_left}\n{cleanup.stdout}"
