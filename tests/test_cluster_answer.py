"""The cluster-level answer (issue 33, part 2): deployments compared by what the cluster serves at the SLOs.

On the GB300 rack preset (72 GPUs) the deployment with the best throughput per used GPU takes 48 GPUs (one copy,
24 idle) while a 24-GPU one tiles the rack three times and serves more: the answer is the tiled layout, and
``objective.per: used_gpu`` keeps the per-used-GPU answer. The rows are real: each deployment measured by the
simulated executor (the knee search the tuner runs), scored by ``advisor.objectives.score`` and written to the
database as the tuner writes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import db
from advisor import api
from advisor.cli import app
from advisor.job import TuningJob, job_from_dict
from advisor.objectives import score
from db import queries
from executors import place
from executors.measuring.loop import MeasurePlan
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import DeploymentConfig, TrialState

STUDY = "rack"
_P = {"role": "prefill", "enable_expert_parallel": True, "max_num_batched_tokens": 16384,
      "all2all_backend": "deepep_high_throughput"}
_D = {"role": "decode", "enable_expert_parallel": True, "max_num_seqs": 512, "all2all_backend": "deepep_low_latency",
      "enable_dbo": True}
#: Trial 0: the study's best per used GPU (48 GPUs: prefill 4 × DEP4, decode EP32); trial 1: 24 GPUs (prefill
#: DEP8, decode EP16), less per used GPU, three copies on the rack — both seen in the README's 200-trial study.
CONFIGS = [
    {"mode": "disaggregated", "prefill": {**_P, "instances": 4, "data_parallel_size": 4, "enable_dbo": True,
                                          "eplb": {"enabled": True, "num_redundant_experts": 32}},
     "decode": {**_D, "data_parallel_size": 32, "eplb": {"enabled": True}}},
    {"mode": "disaggregated", "prefill": {**_P, "data_parallel_size": 8, "eplb": {"enabled": True}},
     "decode": {**_D, "data_parallel_size": 16}},
]


def _job(name: str, **objective: str) -> TuningJob:
    return job_from_dict({"name": name, "preset": "gb300-rack-dsv3", "executor": {"kind": "simulated"},
                          "objective": {"mode": "pareto", **objective}})


def _record(url: str, job: TuningJob) -> None:
    database = db.connect(url)
    ex = SimulatedExecutor(job.model_profile(), default_params(job.cluster.gpu))
    try:
        database.upsert_study(job.name, job.to_document(), executor="simulated", hardware=job.cluster.describe())
        for number, doc in enumerate(CONFIGS):
            cfg = DeploymentConfig.model_validate(doc)
            topo = place(cfg, job.cluster)
            dep = ex.deploy(topo)
            ms = ex.measure(dep, job.workload, MeasurePlan(tuple(job.slos)))
            outcome = score(job, ms)
            tid = database.start_trial(job.name, number, params={}, config=cfg, topology=topo.to_dict(),
                                       proposer="sampler")
            database.finish_trial(tid, TrialState.COMPLETE, measurements=ms, objectives=outcome.as_dict(job),
                                  violation=outcome.violation)
    finally:
        database.close()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    u = f"sqlite:///{tmp_path_factory.mktemp('cluster') / 'advisor.db'}"
    _record(u, _job(STUDY))
    _record(u, _job("per-used-gpu", per="used_gpu"))
    return u


def _notes(url: str, study: str) -> tuple[str, list[str]]:
    """``advisor best``'s "best:" line and notes, each checked to be in what the command prints."""
    res = CliRunner().invoke(app, ["best", study, "--storage", url], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    rep = api.best_report(url, study)
    flat = " ".join(res.output.split())  # the console folds long lines at spaces
    for line in [rep.best_text, *rep.notes]:
        assert " ".join(line.split()) in flat, (line, res.output)
    return "best: " + rep.best_text, rep.notes


def test_the_rack_answer_is_three_copies_of_the_24_gpu_deployment(url: str, tmp_path: Path) -> None:
    ans = api.answer(url, STUDY)
    assert ans is not None and ans.trial == 1 and ans.best.gpus == 24 and ans.copies == 3
    per_gpu = {r.trial: r.per_used_gpu for r in ans.ranked}
    assert per_gpu[0] > per_gpu[1]  # the 48-GPU deployment is better per used GPU …
    assert ans.served == pytest.approx(3 * 24 * per_gpu[1])  # … the tiled 24-GPU one serves the rack more
    assert ans.served > 48 * per_gpu[0]
    best, notes = _notes(url, STUDY)
    assert best.startswith("best: trial 1 at ") and \
        f"run 3 copies on the cluster's 72 GPUs ({ans.served:,.0f} tok/s together at the SLOs)" in best, best
    gain = ans.served / (48 * per_gpu[0]) - 1
    assert (f"whole cluster: 3 copies of trial 1's 24 GPU(s) fit 72 GPUs: {ans.served:,.0f} tok/s for the cluster "
            f"at the SLOs, {gain:+.0%} over the best per used GPU (trial 0, 1 × 48 GPUs, 24 idle: "
            f"{48 * per_gpu[0]:,.0f} tok/s)") in notes, notes
    # the study list and export without --trial name the same deployment
    database = db.connect(url)
    try:
        assert queries.get_study(database, STUDY).best_trial == 1  # type: ignore[union-attr]
        assert queries.get_study(database, "per-used-gpu").best_trial == 0  # type: ignore[union-attr]
    finally:
        database.close()
    paths = api.export(url, STUDY, fmt="json", trial=None, out=tmp_path / "e", model="m")
    assert '"trial": 1' in paths[0].read_text()


def test_per_used_gpu_keeps_the_48_gpu_answer_and_names_the_tiled_one(url: str) -> None:
    ans = api.answer(url, "per-used-gpu")
    assert ans is not None and ans.trial == 0 and ans.copies == 1
    best, notes = _notes(url, "per-used-gpu")
    assert best.startswith("best: trial 0 at ") and "copies" not in best, best
    line = next(n for n in notes if n.startswith("whole cluster"))
    assert line.startswith(f"whole cluster: 1 copy of trial 0's 48 GPU(s) fit 72 GPUs (24 idle): "
                           f"{ans.served:,.0f} tok/s for the cluster at the SLOs; per cluster, trial 1 (3 × 24 GPUs) "
                           f"would serve "), line


def test_per_used_gpu_with_cluster_scope_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: x\npreset: gb300-rack-dsv3\nobjective: {scope: cluster, per: used_gpu}\n")
    res = CliRunner().invoke(app, ["validate", str(job)])
    assert res.exit_code == 2 and "objective.per: used_gpu contradicts objective.scope: cluster" in res.output, \
        res.output
