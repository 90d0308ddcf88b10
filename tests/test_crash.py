"""Crash safety with real child processes: `advisor tune` killed with SIGKILL in the middle of a trial.

The tuner is killed (the tuner only: its vLLM servers run in process groups of their own and outlive it, as
they would after an OOM-kill or a lost SSH session). The next `advisor tune` on the study must mark the
trial interrupted, stop the orphaned servers from the resources recorded in the database, and complete the
budget — with every measurement written before the kill still there, once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import db
from db import queries
from executors import procs
from search_spaces import TrialState

pytestmark = pytest.mark.vllm


def _trials(url: str) -> list[db.Trial]:
    database = db.connect(url)
    try:
        return [queries.get_trial(database, "crash", t.number) for t in queries.list_trials(database, "crash")]
    finally:
        database.close()


def test_sigkill_mid_trial_then_resume(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    job = {"name": "crash", "preset": "cpu-tiny-moe", "budget": {"trials": 2}, "sampler": {"kind": "grid"},
           "space": {"modes": ["aggregated"], "mixed": {"max_num_seqs": [4, 8, 16]}},
           "executor": {"kind": "local", "run_dir": str(tmp_path / "runs")}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    tuner = procs.start([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], name="tuner",
                        log_path=tmp_path / "tuner.log", cwd=tmp_path)
    orphans: list[int] = []
    try:
        deadline = time.monotonic() + 600
        while True:  # wait for: one trial complete, the next one's server started
            assert tuner.poll() is None, tuner.tail(40)
            assert time.monotonic() < deadline, tuner.tail(40)
            try:
                ts = _trials(url) if Path(url[len("sqlite:///"):]).exists() else []
            except db.UnknownStudy:  # the tuner has not created the study yet
                ts = []
            if ts:
                running = [t for t in ts if t.state is TrialState.RUNNING and (t.resources or {}).get("pgids")]
                if any(t.state is TrialState.COMPLETE for t in ts) and running:
                    orphans = list(running[0].resources["pgids"])
                    victim = running[0].number
                    break
            time.sleep(1)
        tuner.popen.send_signal(signal.SIGKILL)  # the tuner alone, mid-trial
        tuner.popen.wait(timeout=30)
    finally:
        if tuner.poll() is None:
            procs.stop(tuner)
    before = {(t.number, m.concurrency): m.model_dump() for t in _trials(url) for m in t.measurements}
    assert before, "no measurement was written before the kill"
    assert any(procs.group_alive(g) for g in orphans), "the killed tuner's servers should still be running"

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], cwd=tmp_path,
                       capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    resume_s = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    assert "closed 1 trial(s) left running by an earlier tuner" in p.stdout

    try:
        trials = _trials(url)
        interrupted = [t for t in trials if t.number == victim]
        assert interrupted[0].state is TrialState.INTERRUPTED
        assert "stopped process group" in interrupted[0].reason
        for g in orphans:
            assert not procs.group_alive(g), f"orphaned process group {g} is still running"
        complete = [t for t in trials if t.state is TrialState.COMPLETE]
        assert len(complete) == 2  # the budget, completed
        after = [(t.number, m.concurrency) for t in trials for m in t.measurements]
        assert len(after) == len(set(after))  # nothing duplicated
        now = {(t.number, m.concurrency): m.model_dump() for t in trials for m in t.measurements}
        for key, m in before.items():  # nothing lost or changed
            assert now[key] == m
        print(f"resume after SIGKILL: {resume_s:.1f} s including one new trial")
    finally:
        for g in orphans:
            if procs.group_alive(g):
                procs.stop_group(g, 10)


def test_consecutive_failures_stop_the_study_with_a_clear_message(tmp_path: Path) -> None:
    """Every candidate fails to start (a flag vLLM refuses): the study stops after
    budget.max_consecutive_failures trials instead of burning its whole budget, and says why."""
    url = f"sqlite:///{tmp_path / 'fail.db'}"
    job = {"name": "fails", "preset": "cpu-tiny-moe", "budget": {"trials": 6, "max_consecutive_failures": 2},
           "executor": {"kind": "local", "run_dir": str(tmp_path / "runs"),
                        "extra_serve_args": ["--max-num-seqs", "notanumber"]}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 trials failed in a row (budget.max_consecutive_failures)" in p.stdout, p.stdout
    database = db.connect(url)
    try:
        trials = queries.list_trials(database, "fails")
    finally:
        database.close()
    failed = [t for t in trials if t.state is TrialState.FAILED]
    assert len(failed) == 2 and all("notanumber" in (t.reason or "") for t in failed)
    print(f"two start failures and the stop: {took:.1f} s")
