"""The simulated executor: the performance model (``executors.perf_model``) behind the Executor contract.

Nothing is launched: ``deploy`` returns a Deployment without processes, ``measure`` predicts one
Measurement per load level (``source="simulated"``), ``teardown`` has nothing to stop. It is the
reference implementation of the contract, the executor of what-if studies on clusters we do not have,
and the prior that ranks candidates before real trials.
"""

from __future__ import annotations

from executors.base import Deployment, Executor
from executors.measure import MeasurePlan, knee_of, search_levels
from executors.perf_model import MODEL_VERSION, PerfParams, default_params, predict_load
from executors.topology import Topology
from search_spaces import Measurement, ModelProfile, Workload

__all__ = ["SimulatedExecutor", "default_params"]


class SimulatedExecutor(Executor):
    kind = "simulated"
    engine_version = MODEL_VERSION

    def __init__(self, model: ModelProfile, params: PerfParams | None = None) -> None:
        self.model = model
        self.params = params  # None: the defaults of the cluster's GPU kind, chosen at deploy time

    def params_for(self, topology: Topology) -> PerfParams:
        return self.params or default_params(topology.cluster.gpu)

    def deploy(self, topology: Topology) -> Deployment:
        return Deployment(topology=topology, url=None, resources={}, handle=self.params_for(topology))

    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        params = deployment.handle
        if not isinstance(params, PerfParams):
            params = self.params_for(deployment.topology)
        return simulate_levels(deployment.topology, self.model, workload, plan or MeasurePlan(), params)

    def teardown(self, deployment: Deployment) -> None:
        return None


def simulate_levels(topology: Topology, model: ModelProfile, workload: Workload, plan: MeasurePlan,
                    params: PerfParams) -> list[Measurement]:
    """The measure loop of ``executors.measure`` with the performance model as the probe."""
    return search_levels(lambda load: predict_load(topology, model, workload, load, params), workload, plan)


def predicted_knee(topology: Topology, model: ModelProfile, workload: Workload, plan: MeasurePlan,
                   params: PerfParams) -> float | None:
    """Where the model puts the knee of ``topology`` under ``plan``'s SLOs: where a real knee search starts.

    The model's own search (from ``plan.start``, else 16 requests / 1 req/s; no fixed levels; up to 16 levels) to a
    5% tolerance; None when no load meets the SLOs in the model or the plan has no SLO that load can break."""
    if not plan.searchable:
        return None
    wl = workload.model_copy(update={"load_levels": [], "knee_search": True, "knee_tolerance": 0.05,
                                     "max_levels": 16})
    knee = knee_of(simulate_levels(topology, model, wl, MeasurePlan(plan.slos, plan.start), params))
    return knee.load if knee is not None else None
