"""Several `advisor tune` workers on one PostgreSQL study and one Ray cluster: unique trial numbers, nothing
lost, and no two trials holding the same GPU slot at the same time (Ray placement groups keep them apart).

The trials' numbers come from the performance model (executor `simulated` with `reserve_gpus`), while the
GPU reservations are real Ray placement groups on a cluster of 2 logical GPUs that 4 workers compete for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import db
from advisor.job import job_from_dict
from db import queries
from search_spaces import TrialState
from tests.test_tune_real import ray_head  # noqa: F401 — the module-scoped Ray head fixture

pytestmark = [pytest.mark.postgres, pytest.mark.ray]
WORKERS = 4
BUDGET = 10


def test_four_workers_share_one_study_without_sharing_gpus(tmp_path: Path, pg_url: str, ray_head: str) -> None:  # noqa: F811
    name = f"parallel-{os.getpid()}-{int(time.time())}"
    job = {"name": name, "preset": "h200-qwen3-235b", "budget": {"trials": BUDGET},
           # the Ray head has 2 logical GPUs and 4 workers want them: 1-GPU trials, two at a time at most
           "cluster": {"gpu": "H200", "nodes": 1, "gpus_per_node": 2},
           "space": {"modes": ["aggregated"],
                     "mixed": {"instances": [1], "dp_sizes": [1], "tp_sizes": [1],
                               "max_num_seqs": [32, 64, 128, 256],
                               "max_num_batched_tokens": [2048, 4096, 8192, 16384]}},
           # FP8 attention beside MXFP4 experts: one H200 holds it (NVFP4 would need FP4 tensor cores)
           "model": {"preset": "qwen3-moe-235b", "weight_bytes": 1, "expert_weight_bytes": 0.5,
                     "expert_format": "mxfp4"},
           "executor": {"kind": "simulated", "reserve_gpus": True, "hold_s": 3.0, "ray_address": ray_head},
           "storage": pg_url, "sampler": {"seed": 3}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    workers = [subprocess.Popen([sys.executable, "-m", "advisor", "tune", "job.yaml"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
               for _ in range(WORKERS)]
    outs = []
    for w in workers:
        try:
            outs.append(w.communicate(timeout=600)[0])
        finally:
            if w.poll() is None:
                os.killpg(w.pid, 9)
    assert all(w.returncode == 0 for w in workers), "\n".join(outs)

    database = db.connect(pg_url)
    try:
        trials = [queries.get_trial(database, name, t.number) for t in queries.list_trials(database, name)]
    finally:
        database.close()
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)), "a trial number was given twice"
    assert not [t for t in trials if t.state is TrialState.RUNNING], "a trial was left running"
    ran = [t for t in trials if t.state is TrialState.COMPLETE and (t.resources or {}).get("gpu_slots")]
    assert BUDGET <= len(ran) <= BUDGET + WORKERS - 1, len(ran)  # each worker stops once the budget is reached
    fixed = set(job_from_dict(job).workload.load_levels)  # every fixed level, beside the knee search's
    assert all(fixed <= {m.concurrency for m in t.measurements} for t in ran), "a measured trial lost load levels"
    assert len({t.worker for t in ran}) > 1, "only one worker ran trials"
    overlaps = 0
    for i, a in enumerate(ran):
        for b in ran[i + 1:]:
            ra, rb = a.resources, b.resources
            if ra["held_from"] < rb["held_to"] and rb["held_from"] < ra["held_to"]:
                overlaps += 1
                shared = {tuple(s) for s in ra["gpu_slots"]} & {tuple(s) for s in rb["gpu_slots"]}
                assert not shared, f"trials {a.number} and {b.number} held GPU slots {shared} at the same time"
            assert len(ra["gpu_slots"]) == a.gpus
    assert overlaps, "no two trials ran at the same time: the test proved nothing"
