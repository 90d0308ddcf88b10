"""Simulated performance on real GPU reservations: the performance model behind Ray placement groups.

For what only the scheduling needs to be real — several tuner workers sharing one Ray cluster's GPUs —
each instance of a trial reserves its GPUs as a placement group (one bundle per node shard, STRICT_PACK
within a node) and holds them while the trial "runs" (``hold_s``); the numbers come from the performance
model and say so (``source="simulated"``). Ray's accounting is what keeps two trials off the same GPU, exactly
as it does for the real Ray executor; the GPU slots Ray assigned are recorded with the trial.
"""

from __future__ import annotations

import os
import time
from typing import Any

from executors.base import Deployment, DeploymentFailed, FailureKind
from executors.measure import MeasurePlan
from executors.simulated import SimulatedExecutor
from executors.topology import Topology
from search_spaces import Measurement, ModelProfile, Workload


class _Slot:
    """Sits in a bundle to learn which GPU slots Ray gave it."""

    def gpu_ids(self) -> dict[str, Any]:
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()]}


class ReservedSimulatedExecutor(SimulatedExecutor):
    kind = "simulated-reserved"

    def __init__(self, model: ModelProfile, params: Any = None, *, ray_address: str, hold_s: float = 2.0,
                 placement_timeout_s: float = 600.0) -> None:
        super().__init__(model, params)
        self.ray_address = ray_address
        self.hold_s = hold_s
        self.placement_timeout_s = placement_timeout_s
        self._slot_cls: Any = None
        self._actors: dict[int, list[Any]] = {}  # id(deployment) → the actors sitting in its bundles

    def _ray(self) -> Any:
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(address=self.ray_address, log_to_driver=False, include_dashboard=False)
        if self._slot_cls is None:
            self._slot_cls = ray.remote(_Slot)
        return ray

    def deploy(self, topology: Topology) -> Deployment:
        ray = self._ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        dep = super().deploy(topology)
        dep.resources = {"executor": self.kind, "ray_address": self.ray_address, "placement_groups": [],
                         "gpu_slots": [], "actors": []}
        t0 = time.monotonic()
        try:
            for inst in topology.instances:
                pg = placement_group([{"GPU": float(len(s.gpus)), "CPU": 0.01} for s in inst.shards],
                                     strategy="SPREAD" if inst.multi_node else "STRICT_PACK")
                dep.resources["placement_groups"].append(pg.id.hex())
                self._save(dep)
                if not pg.wait(self.placement_timeout_s):
                    raise DeploymentFailed(FailureKind.PLATFORM, f"{inst.name}: no {inst.config.gpus_per_instance} "
                                           f"GPUs free within {self.placement_timeout_s:g} s")
                for i, s in enumerate(inst.shards):
                    actor = self._slot_cls.options(num_cpus=0.01, num_gpus=len(s.gpus),
                                                   scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
                    self._actors.setdefault(id(dep), []).append(actor)
                    got = ray.get(actor.gpu_ids.remote(), timeout=60)
                    dep.resources["gpu_slots"] += [[got["node"], g] for g in got["gpus"]]
            dep.resources["held_from"] = time.time()
            self._save(dep)
        except BaseException:
            self.teardown(dep)
            raise
        dep.timings.deploy_s = time.monotonic() - t0
        return dep

    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        time.sleep(self.hold_s)  # the trial holds its GPUs as a real one would while measuring
        return super().measure(deployment, workload, plan)

    def teardown(self, deployment: Deployment) -> None:
        import ray
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        deployment.resources["held_to"] = time.time()
        for actor in self._actors.pop(id(deployment), []):
            ray.kill(actor)
        for pid in deployment.resources.get("placement_groups", []):
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pid))))

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
