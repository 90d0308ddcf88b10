"""What a trial of a candidate would be told with the model as the deployment: the guide's ranking (one candidate,
or thousands at once through the batch model) and the search-efficiency benchmark's ground truth."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from advisor.job import TuningJob
from advisor.objectives import Outcome, score
from executors import place
from executors.measuring.loop import MeasurePlan
from executors.perf import LazyLevel, PerfParams, collector_paused
from executors.simulated.executor import model_levels, model_levels_many
from search_spaces import DeploymentConfig, check


def predicted_outcome(job: TuningJob, cfg: DeploymentConfig, params: PerfParams,
                      plan: MeasurePlan | None = None) -> Outcome:
    """What a trial of ``cfg`` would be told, with the model as the deployment: its knee (to 15%, started from
    the fixed levels' verdicts) or, without a knee to search, its fixed levels."""
    return score(job, model_levels(place(cfg, job.cluster), job.model_profile(), job.workload,
                                   plan or MeasurePlan(tuple(job.slos)), params, tolerance=0.15, max_levels=10))


def predicted_outcomes(job: TuningJob, cfgs: Sequence[DeploymentConfig], params: PerfParams,
                       plan: MeasurePlan | None = None, *, points: bool = True) -> list[Outcome]:
    """``predicted_outcome`` of each of ``cfgs``, the model answering them together (``model_levels_many``: its
    knee searches in lockstep, each level of every candidate as one element of NumPy arrays, and only each
    candidate's operating point built as a Measurement) — the same outcomes, about four times faster on a ranking of
    thousands (docs/benchmarks.md). ``points=False``: no operating point (``best`` None), for a ranking that reads
    the values and the violation only (the guide's)."""
    with collector_paused():
        levels = model_levels_many([place(c, job.cluster) for c in cfgs], job.model_profile(), job.workload,
                                   plan or MeasurePlan(tuple(job.slos)), params, tolerance=0.15, max_levels=10,
                                   lazy=True)
        return [_with_point(score(job, ms), points) for ms in levels]


def _with_point(o: Outcome, built: bool) -> Outcome:
    """``o`` with its operating point built as a Measurement (the batch scored lazy levels: only this one is
    built), or without one (``best`` None) where the caller reads the values and the violation only."""
    if isinstance(o.best, LazyLevel):
        return replace(o, best=o.best.built() if built else None)
    return o if built else replace(o, best=None)


def exhaustive(job: TuningJob, params: PerfParams) -> dict[str, Outcome]:
    """Every valid candidate of the job's space scored with ``params`` (config key → outcome): the ground truth
    of the search-efficiency benchmark and of the guide's tests."""
    model, wl = job.model_profile(), job.workload
    cfgs = [cfg for _, cfg in job.space.enumerate() if not check(cfg, model, job.cluster, wl.max_model_len)]
    return {cfg.key(): o for cfg, o in zip(cfgs, predicted_outcomes(job, cfgs, params), strict=True)}
