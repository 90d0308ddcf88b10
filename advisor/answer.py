"""A study's one answer: which deployment to run, at which operating point.

A real study measures vLLM's defaults first, searches, then repeats its best deployments and the defaults; the
answer is the deployment ``db.ranking.rank_deployments`` ranks first over all of them, the defaults included —
so when no searched deployment beats the defaults, the answer *is* the defaults. Deployments are compared for
the job's whole cluster unless ``objective.per: used_gpu``: what the copies of each that fit serve, idle GPUs
serving nothing, so the answer says how many copies to run (``Answer.copies``, ``Answer.served``). Its numbers
come from its operating point (``objectives.operating_point``: the level its objective was told from), never
from another level of the same trial, so the table of ``advisor best``, its verdict, the progress bar, ``advisor
export`` without ``--trial`` and the dashboard's recommendation all speak of one (trial, level).
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.job import Per, TuningJob
from advisor.objectives import cluster_gpus, cluster_served, copies, objective_names, operating_point
from db import Database, Trial, queries
from db.queries import RunRow, Runs, objective_maximized, rank_deployments
from search_spaces import Measurement


def rank(job: TuningJob, trials: list[Trial], per: Per | None = None) -> list[Runs]:
    """The study's feasible deployments by the job's first objective, the answer first (compared as ``per``
    says, else as the job's ``objective.per`` does)."""
    rows = [RunRow(t.number, t.state.value, t.objectives, t.violation, t.proposer, t.repeat_of, t.reused_from, t.gpus,
                   t.baseline)
            for t in trials]
    return rank_deployments(rows, objective_names(job)[0], cluster_gpus(job, per))


def best_text(value: float | None, objective: str | None, runs: int) -> str | None:
    """A study's best as ``advisor studies`` and the dashboard's study list say it: the mean of the answer's
    runs (``db.ranking.best_of``), with how many runs it averages — never one run's level beside another
    screen's mean."""
    if value is None or objective is None:
        return None
    return f"{value:,.1f} {objective}" + (f" (mean of {runs} runs)" if runs > 1 else "")


@dataclass(frozen=True)
class EqualLoad:
    """The answer and vLLM's defaults at one load both were measured at, for when the defaults met the SLOs at
    none of their levels: their knee is unknown, so no gain can be stated, yet the two can still be compared
    where they ran under the same load (the level of the defaults' first run nearest the answer's operating
    point). Each number is one measured level of each deployment's first trial."""

    concurrency: int
    answer: Measurement
    defaults: Measurement
    defaults_trial: int

    def ratio(self, metric: str) -> float | None:
        """The answer's ``metric`` over the defaults' at this load (None where either is unmeasured)."""
        a, d = getattr(self.answer, metric, None), getattr(self.defaults, metric, None)
        return a / d if a is not None and d else None

    def worse(self, metric: str) -> bool:
        """The answer gives less of ``metric`` than the defaults at this load (more, for a latency)."""
        r = self.ratio(metric)
        return r is not None and (r < 1 if objective_maximized(metric) else r > 1)

    def text(self, trial: int, metric: str) -> str:
        """The sentence ``advisor best`` prints."""
        a, d, r = getattr(self.answer, metric, None), getattr(self.defaults, metric, None), self.ratio(metric)
        if a is None or d is None or r is None:
            return ""
        word = "worse than the defaults there" if self.worse(metric) else "better than the defaults there"
        return (f"at equal load ({self.answer.label()}, the load both were measured at): trial {trial} made "
                f"{a:,.1f} {metric} against vLLM's defaults' {d:,.1f} (trial {self.defaults_trial}): "
                f"{r:.2f}×, {word}")


def equal_load(answer: Measurement, answer_levels: list[Measurement], defaults_trial: Trial) -> EqualLoad | None:
    """``EqualLoad`` of the answer (its operating point and levels) and the defaults' first trial, at the load
    both measured that lies nearest the answer's operating point (None when they share no load)."""
    mine = {m.concurrency: m for m in answer_levels if m.request_rate is None}
    theirs = {m.concurrency: m for m in defaults_trial.measurements if m.request_rate is None}
    common = sorted(set(mine) & set(theirs), key=lambda c: (abs(c - answer.concurrency), c))
    if not common:
        return None
    c = common[0]
    return EqualLoad(c, mine[c], theirs[c], defaults_trial.number)


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
    #: The answer and vLLM's defaults at a load both measured, when the defaults met the SLOs nowhere.
    equal_load: EqualLoad | None = None
    #: Each run of the answer (its first trial, then its repeats on fresh deploys): (trial, the objective as
    #: recorded, the concurrency of the run's own operating point).
    runs: tuple[tuple[int, float, int], ...] = ()

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
        """Mean over mean of the answer and vLLM's defaults (1.0 when the defaults are the answer): the ratio
        ``advisor.verdict.Gain`` words."""
        base = self.baseline
        return self.best.mean / base.mean if base is not None and base.mean else None


def operating_points(database: Database, study: str, job: TuningJob) -> dict[int, int]:
    """Trial → the concurrency of its operating point (``objectives.operating_point``), from one read of the
    study's levels."""
    levels: dict[int, list[Measurement]] = {}
    for lv in queries.measurements(database, study):
        levels.setdefault(lv.trial_number, []).append(lv.measurement)
    out = {}
    for n, ms in levels.items():
        point, _ = operating_point(job, ms)
        if point is not None:
            out[n] = point.concurrency
    return out


def _point(job: TuningJob, trial: Trial | None) -> Measurement | None:
    return operating_point(job, list(trial.measurements))[0] if trial is not None else None


def study_answer(database: Database, study: str, job: TuningJob) -> Answer | None:
    """The study's answer (None while no complete trial met the SLOs)."""
    trials = queries.list_trials(database, study)
    ranked = rank(job, trials)
    if not ranked:
        return None
    first = queries.get_trial(database, study, ranked[0].trial)
    point = _point(job, first)
    if first is None or point is None:
        return None
    base = next((r for r in ranked if r.baseline), None)
    baseline_point = (point if base is ranked[0] else
                      _point(job, queries.get_trial(database, study, base.trial)) if base is not None else None)
    equal = None
    if base is None:  # the defaults met the SLOs nowhere: compare at a load both measured
        defaults = next((t for t in trials if t.proposer == "baseline" and t.state.value == "complete"), None)
        full = queries.get_trial(database, study, defaults.number) if defaults is not None else None
        equal = equal_load(point, list(first.measurements), full) if full is not None else None
    return Answer(ranked, first, point, baseline_point, copies(job, ranked[0].gpus or job.cluster.total_gpus),
                  cluster_served(job, objective_names(job)[0], ranked[0]), equal,
                  _runs(database, study, job, first, point, [t for t in trials if t.repeat_of == first.number]))


def _runs(database: Database, study: str, job: TuningJob, first: Trial, point: Measurement,
          repeats: list[Trial]) -> tuple[tuple[int, float, int], ...]:
    """``Answer.runs``: the first trial and those repeats that count as runs (``db.ranking.deployments``:
    complete, meeting the SLOs), each at its own operating point."""
    name = objective_names(job)[0]
    out = [(first.number, float((first.objectives or {})[name]), point.concurrency)]
    for t in repeats:
        value = (t.objectives or {}).get(name)
        if t.state.value != "complete" or value is None or (t.violation is not None and t.violation > 0):
            continue
        own = _point(job, queries.get_trial(database, study, t.number))
        if own is not None:
            out.append((t.number, float(value), own.concurrency))
    return tuple(out)
