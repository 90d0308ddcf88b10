"""From a trial's measurements to what Optuna is told: objective values and one constraint value.

One deployment is measured at several load levels. A level is *feasible* when it meets every SLO.

- ``max_under_slo``: value = the best ``metric`` over feasible levels.
- ``pareto``: values = (best ``metric``, best ``pareto_y``) over feasible levels; the sampler then pushes
  both ends, and the true front over every trial × level point comes from the database.

When no level is feasible the values come from all levels and the constraint is the smallest SLO
violation (> 0): TPE/NSGA-II learn the infeasible region and still see which way is better. Failed and
invalid trials get the worst values and a violation of 1 — the sampler must learn they are bad, not
forget them (peers that tell FAIL get the same candidate proposed again).
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.job import ObjectiveMode, TuningJob
from search_spaces import Measurement, slo_violation

#: Constraint value for candidates that broke a rule or failed to run.
INFEASIBLE = 1.0


@dataclass(frozen=True)
class Outcome:
    values: list[float]
    violation: float  # ≤ 0: some level met every SLO
    best: Measurement | None  # the level behind values[0]

    @property
    def feasible(self) -> bool:
        return self.violation <= 0

    def as_dict(self, job: TuningJob) -> dict[str, float]:
        return dict(zip(objective_names(job), self.values, strict=True))


def objective_names(job: TuningJob) -> list[str]:
    o = job.objective
    return [o.metric] if o.mode is ObjectiveMode.MAX_UNDER_SLO else [o.metric, o.pareto_y]


def score(job: TuningJob, measurements: list[Measurement]) -> Outcome:
    if not measurements:
        return worst(job)
    violations = [slo_violation(job.slos, m) for m in measurements]
    feasible = [m for m, v in zip(measurements, violations, strict=True) if v <= 0]
    pool = feasible or measurements
    names = objective_names(job)

    def best_of(name: str) -> tuple[float, Measurement | None]:
        scored = [(getattr(m, name), m) for m in pool if getattr(m, name) is not None]
        return max(scored, key=lambda t: t[0]) if scored else (0.0, None)

    firsts = [best_of(n) for n in names]
    return Outcome([float(v) for v, _ in firsts], 0.0 if feasible else min(violations), firsts[0][1])


def worst(job: TuningJob) -> Outcome:
    return Outcome([0.0] * len(objective_names(job)), INFEASIBLE, None)
