""""Is it simulated?" is asked of the executor (``Executor.simulated``), never of its kind string, so every place
that asks answers alike — also for the simulated executor on real GPU reservations (``simulated`` with
``reserve_gpus``, stored as kind ``simulated-reserved``), whose numbers are the model's though it holds GPUs and
takes time: the tuner (baseline and repeats), ``advisor best`` (no spread to state), the exports (evidence
source) and the dashboard's trial table (its caption: the model's numbers, not measurements). The reserved
executor's phase timings are real (it holds GPUs), so the dashboard shows what was recorded for every kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import db
from advisor import api
from advisor.executor_factory import executor_class
from advisor.job import job_from_dict
from advisor.objectives import score
from executors import place
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import DeploymentConfig, Mode, Role, RoleConfig, TrialState

APP = str(Path(__file__).resolve().parent.parent / "ui" / "app.py")
RESERVED = {"kind": "simulated", "reserve_gpus": True, "ray_address": "127.0.0.1:6379"}
#: (the job's executor section, the kind its executor stores with the study, simulated?)
CASES = {"simulated": ({"kind": "simulated"}, "simulated", True),
         "reserved": (RESERVED, "simulated-reserved", True),
         "local": ({"kind": "local"}, "local", False)}


def _store(url: str, name: str, executor: dict, stored_kind: str) -> None:
    """A study as its executor leaves it: two complete trials, each with the time its phases took (a reserved
    trial holds its GPUs ``hold_s`` while it measures; a real one deploys and measures)."""
    job = job_from_dict({"name": name, "preset": "h200-qwen3-235b", "executor": executor})
    database = db.connect(url)
    try:
        database.upsert_study(name, job.to_document(), executor=stored_kind, hardware=job.cluster.describe())
        ex = SimulatedExecutor(job.model_profile(), default_params(job.cluster.gpu))
        for number, tp in enumerate((4, 8)):
            cfg = DeploymentConfig(mode=Mode.AGGREGATED, decode=RoleConfig(role=Role.MIXED, tensor_parallel_size=tp))
            topo = place(cfg, job.cluster)
            run = ex.evaluate(topo, job.workload)
            outcome = score(job, run.measurements)
            tid = database.start_trial(name, number, params={}, config=cfg, topology=topo.to_dict())
            database.finish_trial(tid, TrialState.COMPLETE, measurements=run.measurements,
                                  timings={"deploy_s": 1.5, "measure_s": 2.0, "teardown_s": 0.2},
                                  objectives=outcome.as_dict(job), violation=outcome.violation, executed=True)
    finally:
        database.close()


@pytest.mark.parametrize("case", list(CASES))
def test_every_place_answers_alike_whether_an_executor_is_simulated(case: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    executor, stored_kind, simulated = CASES[case]
    url = f"sqlite:///{tmp_path / 's.db'}"
    _store(url, case, executor, stored_kind)
    job = job_from_dict({"name": case, "preset": "h200-qwen3-235b", "executor": executor})
    answers: dict[str, bool] = {}
    # the tuner asks the executor it runs (no baseline, no repeats for the model's numbers)
    answers["tune"] = executor_class(job.executor).simulated
    notes = api.best_report(url, case).notes
    answers["best"] = not any(n.startswith("run to run:") for n in notes)  # no spread to state
    doc = json.loads(api.rendered_export(url, case, fmt="json", trial=0))
    answers["export"] = doc["evidence"]["source"] == "simulated"
    monkeypatch.setenv("ADVISOR_STORAGE", url)
    monkeypatch.delenv("ADVISOR_ALLOW_NEW_STUDIES", raising=False)
    monkeypatch.setenv("ADVISOR_UI_RUN_DIR", str(tmp_path / "runs"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("views/study.py")
    at.query_params["study"] = case
    at.query_params["tab"] = "Trials"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    table = next(d.value for d in at.dataframe if {"trial", "state"} <= set(d.value.columns))
    answers["dashboard"] = any("the performance model's numbers" in c.value for c in at.caption)
    assert answers == dict.fromkeys(answers, simulated), f"{stored_kind}: {answers}"
    assert "measure_s" in table.columns  # recorded for every kind here: shown


def test_the_ray_executor_is_built_with_the_jobs_cluster_and_placement_timeout(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``make_executor`` builds the class ``executor_class`` names with the job's settings: a refactor once dropped
    ``ray_address`` (every Ray study then started a private head, and the two-host tests ran on one host).
    A real TCP listener stands in for the Ray head's port (``_check_ray_address`` connects to it); ``preflight``,
    which would ask that cluster for its GPUs, is skipped — no Ray cluster runs in this test."""
    import socket

    from advisor.executor_factory import make_executor
    from executors.ray.executor import RayExecutor

    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        monkeypatch.setattr(RayExecutor, "preflight", lambda self, cluster: None)
        job = job_from_dict({"name": "r", "preset": "cpu-tiny-moe",
                             "executor": {"kind": "ray", "ray_address": address, "run_dir": str(tmp_path),
                                          "timeouts": {"placement_s": 77}}})
        ex = make_executor(job)
        try:
            assert isinstance(ex, RayExecutor)
            assert (ex.ray_address, ex.placement_timeout_s) == (address, 77)
            other = make_executor(job, ray_address=address)
            assert other.ray_address == address
            other.close()
        finally:
            ex.close()
