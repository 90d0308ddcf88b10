"""The simulated executor: the performance model (``executors.perf_model``) behind the Executor contract.

Nothing is launched: ``deploy`` returns a Deployment without processes, ``measure`` predicts one
Measurement per load level (``source="simulated"``), ``teardown`` has nothing to stop. It is the
reference implementation of the contract, the executor of what-if studies on clusters we do not have,
and the prior that ranks candidates before real trials.
"""

from __future__ import annotations

from executors.base import Deployment, Executor
from executors.perf_model import MODEL_VERSION, PerfParams, default_params, predict
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

    def measure(self, deployment: Deployment, workload: Workload) -> list[Measurement]:
        params = deployment.handle
        if not isinstance(params, PerfParams):
            params = self.params_for(deployment.topology)
        return predict(deployment.topology, self.model, workload, params)

    def teardown(self, deployment: Deployment) -> None:
        return None
