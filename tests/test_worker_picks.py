"""Two `advisor tune` workers on one study never run the same configuration twice (issue 32): a model turn taken
by both workers, or a draw racing the other worker's, is re-checked against every worker's trials right before it
runs (``advisor.tune._taken_elsewhere``). Simulated trials, on one SQLite file shared by two processes.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna

import db
from advisor import tune as tune_mod
from advisor.study import open_study
from advisor.job import job_from_dict
from db import queries
from search_spaces import TrialState

BUDGET = 200  # two workers, ~100 trials each


def _has_trials(url: str) -> bool:
    try:
        database = db.connect(url)
    except db.DatabaseUnavailable:
        return False
    try:
        return bool(queries.list_trials(database, "pair"))
    except db.UnknownStudy:
        return False
    finally:
        database.close()


def test_two_workers_never_run_one_configuration_twice(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    # the default sampler (TPE, model-guided) on the Pareto front: every other trial is a model turn, the ones
    # both workers took (the same model, fitted to the same trials, picks the same candidate)
    doc = {"name": "pair", "preset": "h200-qwen3-235b", "sampler": {"seed": 4, "guided_trials": BUDGET},
           "objective": {"mode": "pareto"}, "budget": {"trials": BUDGET}, "storage": url}
    (tmp_path / "job.yaml").write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}

    def worker() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "advisor", "tune", "job.yaml"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)

    # the second worker starts once the first has made the study (creating Optuna's tables is not the race here)
    workers = [worker()]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and workers[0].poll() is None and not _has_trials(url):
        time.sleep(0.2)
    workers.append(worker())
    outs = []
    for w in workers:
        try:
            outs.append(w.communicate(timeout=600)[0])
        finally:
            if w.poll() is None:
                w.kill()
    assert all(w.returncode == 0 for w in workers), "\n".join(outs)

    database = db.connect(url)
    try:
        trials = [queries.get_trial(database, "pair", t.number) for t in queries.list_trials(database, "pair")]
        used = database.budget_used("pair")
    finally:
        database.close()
    ran = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAILED) and t.reused_from is None]
    assert len({t.worker for t in ran}) == 2, "one worker ran every trial: the test proved nothing"
    counts = collections.Counter(t.config.key() for t in ran)
    repeated = {k: n for k, n in counts.items() if n > 1}
    assert not repeated, f"{len(repeated)} configuration(s) run more than once: {repeated}"
    study = open_study(job_from_dict(doc), url, "pair")
    assert used == len(ran)  # every configuration run counts once toward the budget
    assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    proposers = collections.Counter(t.proposer for t in ran)
    assert proposers["model"] > 10, proposers  # the model took turns: the race the test is about was possible
