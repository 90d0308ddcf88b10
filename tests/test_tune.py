"""The tuner end to end on the simulated executor: search → evaluate → store → best → export."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import db
from advisor import api
from advisor.job import job_from_dict
from advisor.tune import tune
from db import queries
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import TrialState


def _job(name: str = "t", **over):
    doc = {"name": name, "preset": "gb300-rack-dsv3", "sampler": {"seed": 7}, "budget": {"trials": 12}}
    doc.update(over)
    return job_from_dict(doc)


class CountingSimulator(SimulatedExecutor):
    """The real simulator, counting what it was asked to run (to prove invalid candidates never run)."""

    def __init__(self, job) -> None:
        super().__init__(job.model_profile(), default_params(job.cluster.gpu))
        self.deployed: list[str] = []

    def deploy(self, topology):
        self.deployed.append(topology.config.key())
        return super().deploy(topology)


def test_study_stores_every_level_and_never_runs_invalid_candidates(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    job = _job()
    ex = CountingSimulator(job)
    summary = tune(job, storage=url, executor=ex)
    assert summary.executed == 12 == len(ex.deployed)
    database = db.connect(url)
    try:
        trials = queries.list_trials(database, "t")
        complete = [t for t in trials if t.state is TrialState.COMPLETE and not (t.reason or "").startswith("same")]
        invalid = [t for t in trials if t.state is TrialState.INVALID]
        assert len(complete) == 12
        assert summary.invalid == len(invalid)
        executed_keys = set(ex.deployed)
        for t in invalid:
            assert t.reason and ":" in t.reason  # "rule: reason"
            assert t.config is None or t.config.key() not in executed_keys
        levels = queries.measurements(database, "t")
        by_trial: dict[int, list] = {}
        for lv in levels:
            by_trial.setdefault(lv.trial_number, []).append(lv.measurement)
        assert len(by_trial) == 12
        for ms in by_trial.values():  # the fixed levels, plus the knee search's (at most max_levels more)
            assert set(job.workload.load_levels) <= {m.concurrency for m in ms}
            assert len(ms) <= len(job.workload.load_levels) + job.workload.max_levels
        assert all(lv.measurement.source == "simulated" for lv in levels)
    finally:
        database.close()


def test_rerun_continues_without_duplicates(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    tune(_job(), storage=url, trials=5)
    tune(_job(), storage=url, trials=9)
    tune(_job(), storage=url, trials=9)  # already done: runs nothing
    database = db.connect(url)
    try:
        trials = queries.list_trials(database, "t")
        numbers = [t.number for t in trials]
        assert len(numbers) == len(set(numbers))
        ran = [t for t in trials if t.state is TrialState.COMPLETE and not (t.reason or "").startswith("same")]
        assert len(ran) == 9
        levels = queries.measurements(database, "t")
        assert len({lv.trial_number for lv in levels}) == 9
        assert len({(lv.trial_number, lv.measurement.concurrency) for lv in levels}) == len(levels)
    finally:
        database.close()


def test_seeded_studies_are_reproducible(tmp_path: Path) -> None:
    seqs = []
    for i in range(2):
        url = f"sqlite:///{tmp_path / f's{i}.db'}"
        tune(_job(), storage=url, trials=8)
        database = db.connect(url)
        try:
            seqs.append([(t.number, t.state, json.dumps(t.params, sort_keys=True))
                         for t in queries.list_trials(database, "t")])
        finally:
            database.close()
    assert seqs[0] == seqs[1]


def test_best_and_export_parse_with_vllms_own_parser(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    tune(_job(objective={"mode": "pareto"}, budget={"trials": 20}), storage=url)
    rep = api.best_report(url, "t")
    assert rep.rows, rep.empty_reason
    paths = api.export(url, "t", fmt="all", trial=None, out=tmp_path / "out", model=None)
    names = {p.name for p in paths}
    assert names == {"launch.sh", "deployment.json", "k8s", "ray-serve"}  # k8s/, ray-serve/: folders
    doc = json.loads((tmp_path / "out" / "deployment.json").read_text())
    assert doc["evidence"]["source"] == "simulated" and doc["evidence"]["measurements"]
    script = (tmp_path / "out" / "launch.sh").read_text()
    serve_lines = [ln for ln in script.splitlines() if " serve " in ln and not ln.startswith("#")]
    assert len(serve_lines) == sum(len(c["gpus"]) > 0 for c in doc["commands"])
    from tests.vllm_parser import parse_serve_args  # vLLM's own parser, from the installed CPU build

    for line in serve_lines:
        argv = shlex.split(line.split(" > ")[0].replace('"${NODE', "'${NODE").replace('_IP}"', "_IP}'"))
        args = argv[argv.index("serve") + 1:]
        ns = parse_serve_args(args)
        assert ns.model_tag == args[0] or getattr(ns, "model", None) == args[0]
    database = db.connect(url)
    try:
        t = queries.get_trial(database, "t", doc["evidence"]["trial"])
        assert {e.format for e in t.exports} == {"vllm", "json", "k8s", "ray-serve"}
    finally:
        database.close()


def test_cli_tune_best_export_round_trip(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: cli\npreset: h200-qwen3-235b\nbudget: {trials: 6}\nsampler: {seed: 1}\n")
    env_db = f"sqlite:///{tmp_path / 'c.db'}"

    def run(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "advisor", *a], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)

    p = run("tune", str(job), "--storage", env_db)
    assert p.returncode == 0, p.stderr
    assert "best" in p.stdout
    for cmd in (["studies"], ["trials", "cli"], ["best", "cli"], ["query", "pareto", "study=cli", "--format", "csv"]):
        p = run(*cmd, "--storage", env_db)
        assert p.returncode == 0, (cmd, p.stderr)
    p = run("export", "cli", "--format", "json", "--out", str(tmp_path / "e"), "--storage", env_db)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "e" / "deployment.json").read_text())["evidence"]["study"] == "cli"


@pytest.mark.parametrize("mode", ["max_under_slo", "pareto"])
def test_both_objective_modes_run(mode: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    s = tune(_job(objective={"mode": mode}, budget={"trials": 6}), storage=url)
    assert s.executed == 6


_DYING_ENGINE = """import sys
print("INFO 12-01 02:45:00 [api_server.py:1] vLLM API server version 0.0-planted", flush=True)
print("(EngineCore_DP0 pid=1) ERROR 12-01 02:45:08 [core.py:1] EngineCore failed to start.", flush=True)
print("(EngineCore_DP0 pid=1) RuntimeError: planted engine death: no KV cache fits", flush=True)
print("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}", flush=True)
print("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above)", flush=True)
sys.exit(1)
"""


def test_a_failed_trials_reason_is_printed_as_it_happens(tmp_path: Path) -> None:
    """A trial whose engine dies says why at once, with the log's informative error line (not vLLM's "see stack
    trace (above)", which the user never sees), instead of only "(1 failed)" in the summary at the end."""

    (tmp_path / "engine.py").write_text(_DYING_ENGINE)
    (tmp_path / "job.yaml").write_text(
        "name: dies\npreset: cpu-tiny-moe\nbudget: {trials: 1, repeat_top: 0}\nbaseline: {enabled: false}\n"
        f"executor: {{kind: local, engine_cmd: [{sys.executable!r}, {str(tmp_path / 'engine.py')!r}]}}\n")
    p = subprocess.run([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage",
                        f"sqlite:///{tmp_path / 'x.db'}"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    failed = [ln for ln in lines if ln.startswith("trial 0 failed:")]
    assert failed and "RuntimeError: planted engine death: no KV cache fits" in failed[0], p.stdout
    assert "stack trace" not in failed[0]
    assert lines.index(failed[0]) < next(i for i, ln in enumerate(lines) if ln.startswith("study 'dies'"))
