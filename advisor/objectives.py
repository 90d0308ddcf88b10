"""From a trial's measurements to what Optuna is told: objective values and one constraint value.

A deployment is measured at several load levels (``executors.measuring.loop``). A level is *feasible* when it meets
every SLO (the error-rate SLO included). Every value told to Optuna comes from **one** measured level — the
trial's *operating point* — so a trial's point on a Pareto chart is a point some level really reached:

- the knee the knee search found (the highest load meeting every SLO), when it found one;
- else the feasible level with the best ``objective.metric`` (knee search off, or no SLO load can break);
- else (nothing feasible) the level closest to feasibility, with the constraint set to its violation (> 0).
  The samplers read that violation (``advisor.study._base_sampler``): TPE puts an infeasible trial among its
  good ones only when too few feasible trials fill that group, and ranks infeasible ones by violation alone; NSGA-II's
  constrained domination puts every feasible trial ahead and compares infeasible ones by violation; only GP
  uses an infeasible trial's values too — its objective model is fitted on every trial, beside a separate model
  of the constraint — which is why they are the measured values at that level, not the worst.

``max_under_slo``: value = ``metric`` at the operating point. ``pareto``: (``metric``, ``pareto_y``) at the same
point; the study's front over every (trial, level) point comes from the database. With
``objective.scope: cluster`` throughput metrics count every GPU of the cluster: the deployment is copied as
many times as it fits and idle GPUs produce nothing (an operator pays for them). That changes what the sampler
is told; the *answer* compares deployments for the cluster by default whatever the scope (``objective.per``,
``cluster_gpus``), so seeded studies propose the same trials either way.

Failed and invalid trials get the worst values and a violation of 1 — the sampler must learn they are bad,
not forget them (peers that tell FAIL get the same candidate proposed again).
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.job import ObjectiveMode, Per, Scope, TuningJob
from db.queries import Runs, cluster_factor, copies as copies_in
from search_spaces import Measurement, Scaling, metric, slo_violation

#: Constraint value for candidates that broke a rule or failed to run.
INFEASIBLE = 1.0


@dataclass(frozen=True)
class Outcome:
    values: list[float]
    violation: float  # ≤ 0: some level met every SLO
    best: Measurement | None  # the operating point: the one level every value comes from

    @property
    def feasible(self) -> bool:
        return self.violation <= 0

    def as_dict(self, job: TuningJob) -> dict[str, float]:
        return dict(zip(objective_names(job), self.values, strict=True))


def objective_names(job: TuningJob) -> list[str]:
    o = job.objective
    return [o.metric] if o.mode is ObjectiveMode.MAX_UNDER_SLO else [o.metric, o.pareto_y]


def copies(job: TuningJob, gpus: int) -> int:
    """How many copies of a ``gpus``-GPU deployment the job's cluster holds."""
    return copies_in(gpus, job.cluster.total_gpus)


def cluster_gpus(job: TuningJob, per: Per | None = None) -> int | None:
    """The cluster the answer ranks for (``db.ranking.rank_deployments``): the job's, when it compares per cluster
    (``per``, else ``objective.per``) and the stored values are still per deployment (``scope: cluster`` stored
    them for the cluster already)."""
    o = job.objective
    return job.cluster.total_gpus if (per or o.per) is Per.CLUSTER and o.scope is Scope.DEPLOYMENT else None


def served_unit(name: str) -> str:
    """The unit of ``cluster_served`` for objective ``name``: its declared unit, for the whole cluster."""
    m = metric(name)
    return m.unit.removesuffix("/GPU") if m is not None else "tok/s"


def cluster_served(job: TuningJob, name: str, runs: Runs) -> float | None:
    """What the whole cluster serves with as many copies of ``runs``' deployment as fit, at the SLOs: tok/s for
    a per-GPU throughput, requests/s for ``request_throughput``; None for other metrics or an unknown size."""
    total = job.cluster.total_gpus
    m = metric(name)
    if m is None or m.scaling is Scaling.NONE or not runs.gpus:
        return None
    per_cluster = runs.mean if job.objective.scope is Scope.CLUSTER else \
        runs.per_used_gpu * cluster_factor(name, runs.gpus, total)
    return per_cluster * total if m.scaling is Scaling.PER_GPU else per_cluster


def scoped(job: TuningJob, name: str, m: Measurement) -> float | None:
    """``m.name`` as the objective counts it: per deployment, or per cluster (``objective.scope``)."""
    v = getattr(m, name)
    if v is None or job.objective.scope is Scope.DEPLOYMENT:
        return v
    return v * cluster_factor(name, m.gpus, job.cluster.total_gpus)


def operating_point(job: TuningJob, measurements: list[Measurement]) -> tuple[Measurement | None, float]:
    """The one level a trial's values come from, and its SLO violation (≤ 0: feasible)."""
    if not measurements:
        return None, 1.0
    knee = next((m for m in measurements if m.purpose == "knee"), None)
    if knee is not None and slo_violation(job.slos, knee) <= 0:
        return knee, slo_violation(job.slos, knee)
    metric = job.objective.metric
    feasible = [m for m in measurements if slo_violation(job.slos, m) <= 0]
    if feasible:
        best = max(feasible, key=lambda m: (getattr(m, metric) is not None, getattr(m, metric) or 0.0))
        return best, slo_violation(job.slos, best)
    closest = min(measurements, key=lambda m: slo_violation(job.slos, m))
    return closest, slo_violation(job.slos, closest)


def score(job: TuningJob, measurements: list[Measurement]) -> Outcome:
    point, violation = operating_point(job, measurements)
    if point is None:
        return worst(job)
    values = [scoped(job, n, point) for n in objective_names(job)]
    return Outcome([float(v) if v is not None else 0.0 for v in values], 0.0 if violation <= 0 else violation, point)


def worst(job: TuningJob) -> Outcome:
    return Outcome([0.0] * len(objective_names(job)), INFEASIBLE, None)
