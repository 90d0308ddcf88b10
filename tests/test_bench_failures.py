"""A failed helper process says why, and a failure of its environment is never its configuration's.

Every helper here is a real process that really fails: a client whose module import fails, clients that end
with an exit code or a signal after saying something, a bench zygote whose vLLM import fails, a client whose
code folder is removed before it starts. Two stand-ins are labelled where they are made: a fake ``vllm``
package (on the zygote's PYTHONPATH, made to fail its import) and, for the tune loop, the simulated executor
whose warm-up runs that failing real client first.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from advisor import tune as tune_mod
from advisor.job import job_from_dict
from advisor.tune import tune
from db import connect, queries
from executors import FailureKind, Platform
from executors.measuring import bench
from executors.measuring.bench_zygote import Zygote
from executors.measuring.loop import LevelRunner, MeasurePlan, measure_deployment
from executors.processes import broken_env
from executors.simulated.executor import SimulatedExecutor, default_params
from executors.vllm.serving import start_failure
from search_spaces import TrialState

MISSING = "deploy_advisor_no_such_module"


def _run(platform: Platform, tmp_path: Path, zygote: Zygote | None = None) -> bench.BenchRun:
    return bench.run_bench(platform, ["--seed", "1"], result_path=tmp_path / "c1.json", log_path=tmp_path / "c1.log",
                           timeout_s=60, cwd=tmp_path, term_timeout_s=5, zygote=zygote)


def _client(code: str, **env: str) -> Platform:
    """A real client process: ``python -c CODE bench serve ARGS``."""
    return Platform(name="test", engine_cmd=[sys.executable, "-c", code], env=env)


def test_a_client_whose_module_does_not_import_fails_for_the_environment_and_says_which(tmp_path: Path) -> None:
    with pytest.raises(bench.BenchFailed) as e:
        _run(_client(f"import {MISSING}"), tmp_path)
    assert e.value.environment
    assert e.value.reason == f"ModuleNotFoundError: No module named '{MISSING}'"
    assert "Traceback" in e.value.tail and f"import {MISSING}" in e.value.tail


def test_a_client_that_fails_under_load_says_its_last_lines_and_is_the_benchmarks_failure(tmp_path: Path) -> None:
    code = ("import sys; print('# not our header, its own line'); print('sent 3 of 8 requests');"
            " print('the server closed the connection', file=sys.stderr); sys.exit(3)")
    with pytest.raises(bench.BenchFailed) as e:
        _run(_client(code), tmp_path)
    assert not e.value.environment
    assert e.value.reason == ("vllm bench serve exited with code 3 and wrote no result: # not our header, its own "
                              "line | sent 3 of 8 requests | the server closed the connection")


def test_a_client_killed_by_a_signal_says_which_signal(tmp_path: Path) -> None:
    code = "import os, signal; print('level started', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    with pytest.raises(bench.BenchFailed) as e:
        _run(_client(code), tmp_path)
    assert e.value.reason == "vllm bench serve was killed by SIGKILL and wrote no result: level started"
    assert not e.value.environment


def test_a_bench_zygote_that_cannot_import_vllm_says_why_and_is_the_environments_failure(tmp_path: Path) -> None:
    fake = tmp_path / "fake-vllm" / "vllm"  # fake: a `vllm` package that fails its import, found first
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"import {MISSING}\n")
    platform = Platform(name="gpu", engine_cmd=[sys.executable, "-m", "vllm.entrypoints.cli.main"],
                        env={"PYTHONPATH": str(fake.parent)})
    zygote = Zygote(platform, tmp_path / "bench")
    try:
        with pytest.raises(bench.BenchFailed) as e:
            _run(platform, tmp_path, zygote)
    finally:
        zygote.close()
    assert e.value.environment
    assert e.value.reason == f"the bench zygote exited with code 1: ModuleNotFoundError: No module named '{MISSING}'"
    assert "_preload" in e.value.tail  # its traceback, from its own log


def _remove_code_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout standing for this tuner's code folder (``broken_env.CODE_DIR`` pointed at it), then removed."""
    checkout = tmp_path / "checkout"
    (checkout / "executors").mkdir(parents=True)
    (checkout / "executors" / "__init__.py").write_text("")
    (checkout / "client_stub.py").write_text("print('a level')\n")
    monkeypatch.setattr(broken_env, "CODE_DIR", checkout / "executors")
    assert broken_env.code_gone() is None
    shutil.rmtree(checkout)
    return checkout


def test_a_client_whose_code_folder_was_removed_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = _remove_code_folder(tmp_path, monkeypatch)
    platform = Platform(name="test", engine_cmd=[sys.executable, "-m", "client_stub"],
                        env={"PYTHONPATH": str(checkout)})
    with pytest.raises(bench.BenchFailed) as e:
        _run(platform, tmp_path)
    assert e.value.environment
    assert e.value.reason.startswith("vllm bench serve exited with code 1 and wrote no result: ")
    assert "No module named client_stub" in e.value.reason
    assert f"this tuner's code folder {checkout} is gone" in e.value.reason


def test_a_server_that_fails_to_start_after_its_code_folder_went_is_the_environments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    why = "ModuleNotFoundError: No module named 'executors'"
    assert start_failure("server-0", 1, why, "").kind is FailureKind.START  # the code is there: the server's
    checkout = _remove_code_folder(tmp_path, monkeypatch)
    failed = start_failure("server-0", 1, why, "")
    assert failed.kind is FailureKind.ENVIRONMENT and str(checkout) in failed.reason


# ------------------------------------------------------------------------------ the tune loop
SPACE = {"modes": ["aggregated"],
         "mixed": {"instances": [1], "dp_sizes": [8], "max_num_seqs": [64, 128, 256],
                   "max_num_batched_tokens": [8192], "all2all_backends": ["allgather_reducescatter"],
                   "dbo": [False]},
         "eplb": {"enabled": [False], "num_redundant_experts": [0]}}


class ClientBreaksFirst(SimulatedExecutor):
    """Stand-in for a cluster (the simulated executor) whose first ``broken`` measurements run the real, failing
    client of ``_client(import MISSING)`` as their warm-up, through the real measure loop."""

    def __init__(self, job, tmp_path: Path, broken: int) -> None:
        super().__init__(job.model_profile(), default_params(job.cluster.gpu))
        self.tmp_path, self.broken, self.calls = tmp_path, broken, 0

    def measure(self, deployment, workload, plan=None):
        self.calls += 1
        if self.calls > self.broken:
            return super().measure(deployment, workload, plan)
        out = self.tmp_path / f"bench-{self.calls}"
        out.mkdir()

        def run_level(spec: bench.LevelSpec):
            run = bench.run_level(_client(f"import {MISSING}"), workload, spec, url="http://127.0.0.1:9",
                                  model="m", tokenizer=str(out), out_dir=out, timeout_s=60)
            return run.result, run.wall_s

        runner = LevelRunner(run_level, lambda: None, [])
        return measure_deployment(runner, workload, plan or MeasurePlan(), gpus=8, disaggregated=False,
                                  timings=deployment.timings)


def test_a_client_that_fails_for_its_environment_is_retried_and_never_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune_mod, "ENVIRONMENT_RETRY_PAUSE_S", 0.0)
    job = job_from_dict({"name": "client", "preset": "gb300-rack-dsv3", "sampler": {"kind": "grid", "seed": 7},
                         "budget": {"trials": 3}, "space": SPACE})
    url = f"sqlite:///{tmp_path / 's.db'}"
    ex = ClientBreaksFirst(job, tmp_path, broken=3)  # the first trial fails twice, the second's first attempt
    summary = tune(job, storage=url, executor=ex)
    assert (summary.executed, summary.failed, summary.environment_failed) == (3, 0, 1)
    database = connect(url)
    try:
        trials = queries.list_trials(database, "client")
    finally:
        database.close()
    assert [(t.state, t.failure_kind) for t in trials] == [(TrialState.FAILED, "environment")] + \
        [(TrialState.COMPLETE, None)] * 3
    said = f"ModuleNotFoundError: No module named '{MISSING}'"
    assert trials[0].reason.startswith("warm-up at warmup-c") and said in trials[0].reason
    assert said in trials[1].reason  # the retried trial keeps what its first attempt met
