"""Measure first where the model is not validated: a model that misses vLLM's defaults by more than it is held to
yields to the search around the measured best, and re-enters when its re-fit predicts held-out trials within its
bound; a model that predicts the defaults keeps its turns. ``advisor best`` says who found the answer.

The machine is the simulated executor with other efficiencies than the model's (``_Machine``), labelled: a
stand-in for a GPU this machine does not have. It is not marked simulated, so the study measures vLLM's defaults
first, as a real study does; the space is the one a one-GPU job derives (20 batch candidates on an H100).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import db
from advisor.job import TuningJob, job_from_dict
from advisor.proposers.guide import MAX_CV_ERROR, PROPOSER_ATTR, REENTRY_TRIALS, ModelGuide
from advisor.proposers.guide_turns import resume_guide
from advisor.proposers.names import AROUND_BEST, found_by
from advisor.study import open_study
from advisor.tune import EXECUTED_ATTR, tune
from db import queries
from executors.perf import PerfParams
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import TrialState
from tests.cli_run import advisor

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data"  # the GPU runs' model folders, their config.json alone
#: Efficiencies the stand-in machine reaches, as a share of the model's: the model over-predicts the defaults ~2×.
SLOWER = 0.6
EFFICIENCIES = ("mfu_prefill", "mfu_decode", "attn_eff_prefill", "attn_eff_decode", "hbm_eff")


class _Machine(SimulatedExecutor):
    """A stand-in for a real GPU: the performance model with its own parameters, measured like a real executor
    (a baseline first). Labelled fake: no GPU runs here."""

    simulated = False


def _job(trials: int = 8) -> TuningJob:
    return job_from_dict({
        "name": "y", "model": {"path": str(MODELS / "deepseek-v2-lite")},
        "cluster": {"gpu": "H100", "nodes": 1, "gpus_per_node": 1},
        "workload": {"isl": {"mean": 2048, "range_ratio": 0.2}, "osl": {"mean": 256, "range_ratio": 0.2},
                     "load_levels": []},
        "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 2000},
                 {"metric": "p90_tokens_per_s_per_user", "op": ">=", "value": 30}],
        "sampler": {"seed": 0}, "budget": {"trials": trials, "repeat_top": 0}})


def _slower(params: PerfParams, share: float) -> PerfParams:
    return params.model_copy(update={k: getattr(params, k) * share for k in EFFICIENCIES})


def _trials(url: str) -> list[db.Trial]:
    database = db.connect(url)
    try:
        return sorted(queries.list_trials(database, "y"), key=lambda t: t.number)
    finally:
        database.close()


def _miss(t: db.Trial) -> float:
    assert t.predicted is not None and t.objectives is not None
    return abs(t.predicted["throughput_per_gpu"] / t.objectives["throughput_per_gpu"] - 1.0)


def _run(tmp_path: Path, truth: PerfParams, trials: int = 8) -> tuple[str, list[db.Trial]]:
    job = _job(trials)
    url = f"sqlite:///{tmp_path / 'y.db'}"
    tune(job, storage=url, executor=_Machine(job.model_profile(), truth))
    return url, _trials(url)


def test_a_model_that_misses_the_defaults_yields_to_the_search_around_the_measured_best(tmp_path: Path) -> None:
    url, trials = _run(tmp_path, _slower(default_params("H100"), SLOWER))
    base, search = trials[0], trials[1:]
    assert base.baseline and base.proposer == "baseline" and _miss(base) > MAX_CV_ERROR
    assert len(search) == 8 and all(t.state is TrialState.COMPLETE for t in search)
    who = [t.proposer for t in search]
    assert who[0] == AROUND_BEST  # not the model's pick, not the sampler's random start-up
    # the model re-enters only after REENTRY_TRIALS held-out predictions in a row within its bound
    for i, t in enumerate(search):
        if t.proposer == "model":
            before = [_miss(s) for s in search[:i] if s.proposer == AROUND_BEST][-REENTRY_TRIALS:]
            assert len(before) == REENTRY_TRIALS and all(e <= MAX_CV_ERROR for e in before)
    # measured first: every search trial is valid and new, and the study's answer is at least the defaults
    assert len({t.config.key() for t in trials if t.config is not None}) == len(trials)
    best = max(t.objectives["throughput_per_gpu"] for t in trials if t.objectives and (t.violation or 0) <= 0)
    assert best >= base.objectives["throughput_per_gpu"]
    # a continued study picks the yield up from what it measured
    job = _job()
    open_study(job, url, "y")
    database = db.connect(url)
    try:
        guide = resume_guide(job, database, "y", default_params("H100"))
    finally:
        database.close()
    assert guide is not None and guide.baseline_error == _miss(base)
    p = advisor("best", "y", "--storage", url, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    found = [ln for ln in p.stdout.splitlines() if ln.startswith("found by:")]
    assert len(found) == 1
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("best: trial "))
    answer = next(t for t in trials if t.number == int(line.split()[2]))
    assert found[0] == found_by(answer.proposer)


def test_a_model_that_predicts_the_defaults_keeps_the_guide(tmp_path: Path) -> None:
    """The machine is the model: the baseline is predicted exactly, so the model leads as it always has (its first
    turn the study's first search trial) and the search around the best never runs."""
    url, trials = _run(tmp_path, default_params("H100"), trials=5)
    base = trials[0]
    assert base.baseline and _miss(base) <= MAX_CV_ERROR
    who = [t.proposer for t in trials[1:]]
    assert who[0] == "model" and AROUND_BEST not in who
    study = open_study(_job(), url, "y")
    assert all(t.user_attrs.get(PROPOSER_ATTR) != AROUND_BEST for t in study.get_trials(deepcopy=False)
               if t.user_attrs.get(EXECUTED_ATTR))


def test_the_guide_yields_on_the_baseline_and_re_enters_on_held_out_trials() -> None:
    guide = ModelGuide(_job(), default_params("H100"))
    lead = len(guide.space.modes)

    def judge(predicted: float, measured: float, **kw: Any) -> None:
        guide.judge({"throughput_per_gpu": predicted}, {"throughput_per_gpu": measured}, **kw)

    judge(2000.0, 1000.0, baseline=True)  # the defaults, predicted 2× what they measured
    assert guide.yielding and guide.baseline_error == 1.0 and not guide.wants_turn(0)
    judge(1100.0, 1000.0)
    assert guide.yielding  # one held-out prediction within the bound is not yet enough
    judge(2000.0, 1000.0)
    judge(1100.0, 1000.0)
    assert guide.yielding  # the last REENTRY_TRIALS must all be within it
    for _ in range(REENTRY_TRIALS - 1):
        judge(950.0, 1000.0)
    assert not guide.yielding and guide.wants_turn(lead + 1)
    assert guide.cv_error is not None and guide.cv_error <= MAX_CV_ERROR  # judged from the re-entry on
    right = ModelGuide(_job(), default_params("H100"))
    right.judge({"throughput_per_gpu": 1100.0}, {"throughput_per_gpu": 1000.0}, baseline=True)
    assert not right.yielding and right.wants_turn(0)
    # a repeat of the defaults, or any other trial, never starts a yield
    other = ModelGuide(_job(), default_params("H100"))
    other.judge({"throughput_per_gpu": 3000.0}, {"throughput_per_gpu": 1000.0})
    assert not other.yielding
