"""A study's one answer: which deployment to run, at which operating point.

A real study measures vLLM's defaults first, searches, then repeats its best deployments and the defaults; the
answer is the deployment ``db.ranking.rank_deployments`` ranks first over all of them, the defaults included —
so when no searched deployment beats the defaults, the answer *is* the defaults. Deployments are compared for
the job's whole cluster unless ``objective.per: used_gpu``: what the copies of each that fit serve, idle GPUs
serving nothing, so the answer says how many copies to run (``Answer.copies``, ``Answer.served``). Its numbers
come from its operating point (``objectives.operating_point``: the level its objective was told from), never
from another level of the same trial, so the table of ``advisor best``, its verdict, the progress bar, ``advisor export``
without ``--trial`` and the dashboard's recommendation all speak of one (trial, level).
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.job import Per, TuningJob
from advisor.objectives import cluster_gpus, cluster_served, copies, objective_names, operating_point
from db import Database, Trial, queries
from db.queries import RunRow, Runs, rank_deployments
from search_spaces import Measurement


def rank(job: TuningJob, trials: list[Trial], per: Per | None = None) -> list[Runs]:
    """The study's feasible deployments by the job's first objective, the answer first (compared as ``per``
    says, else as the job's ``objective.per`` does)."""
    rows = [RunRow(t.number, t.state.value, t.objectives, t.violation, t.proposer, t.repeat_of, t.reused_from, t.gpus,
                   t.baseline)
            for t in trials]
    return rank_deployments(rows, objective_names(job)[0], cluster_gpus(job, per))


@dataclass(frozen=True)
class Answer:
    """The deployment to run: its runs and those of every other feasible deployment (``ranked``, the answer
    first), its first trial, and the operating points of it and of vLLM's defaults."""

    ranked: list[Runs]
    first: Trial
    #: The level the answer's objective comes from (its knee, when the knee search found one).
    point: Measurement
    #: vLLM's defaults at their own operating point, when they met the SLOs.
    baseline_point: Measurement | None = None
    #: Copies of the answer the job's cluster holds (run them all: the answer was chosen for the cluster unless
    #: ``objective.per: used_gpu``), and what they serve together at the SLOs (``objectives.cluster_served``).
    copies: int = 1
    served: float | None = None

    @property
    def best(self) -> Runs:
        return self.ranked[0]

    @property
    def trial(self) -> int:
        return self.best.trial

    @property
    def is_baseline(self) -> bool:
        """vLLM's defaults are the best measured deployment."""
        return self.best.baseline

    @property
    def baseline(self) -> Runs | None:
        return next((r for r in self.ranked if r.baseline), None)

    @property
    def rival(self) -> Runs | None:
        """What the answer is weighed against: vLLM's defaults, or — when the defaults are the answer — the
        search's best."""
        if self.is_baseline:
            return next((r for r in self.ranked if not r.baseline), None)
        return self.baseline

    @property
    def gain(self) -> float | None:
        """Mean over mean of the answer and vLLM's defaults (1.0 when the defaults are the answer)."""
        base = self.baseline
        return self.best.mean / base.mean if base is not None and base.mean else None


def _point(job: TuningJob, trial: Trial | None) -> Measurement | None:
    return operating_point(job, list(trial.measurements))[0] if trial is not None else None


def study_answer(database: Database, study: str, job: TuningJob) -> Answer | None:
    """The study's answer (None while no complete trial met the SLOs)."""
    ranked = rank(job, queries.list_trials(database, study))
    if not ranked:
        return None
    first = queries.get_trial(database, study, ranked[0].trial)
    point = _point(job, first)
    if first is None or point is None:
        return None
    base = next((r for r in ranked if r.baseline), None)
    baseline_point = (point if base is ranked[0] else
                      _point(job, queries.get_trial(database, study, base.trial)) if base is not None else None)
    return Answer(ranked, first, point, baseline_point, copies(job, ranked[0].gpus or job.cluster.total_gpus),
                  cluster_served(job, objective_names(job)[0], ranked[0]))
