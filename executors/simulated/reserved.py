"""The simulated executor on real GPU reservations (``executor: {kind: simulated, reserve_gpus: true}``).

A feature, not test scaffolding: a *placement rehearsal* of a study on the Ray cluster it will run on, before
any GPU hour is spent on vLLM. Each instance of every trial reserves its GPUs as the Ray executor would — a
placement group with one bundle per node shard, STRICT_PACK within a node, SPREAD across nodes — holds them
for ``hold_s`` (standing in for the trial's measuring time, so that several tuner workers contend as they
would), records which GPU slots Ray assigned, and releases them at teardown (also on failure; the recorded
placement group ids let ``advisor cleanup`` remove what a killed worker left). The numbers come from the
performance model and say so (``source="simulated"``, kind ``simulated-reserved``).

What it answers: does every candidate's placement fit this cluster's real GPU layout within the placement
timeout; do several workers sharing one study and one cluster keep off each other's GPUs; is cleanup clean.
``tests/test_parallel_workers.py`` is its test (4 workers, 2 logical GPUs, PostgreSQL). Needs Ray
(``executor.ray_address`` or ``--ray-address``), never vLLM.
"""

from __future__ import annotations

import os
import time
from typing import Any

from executors.base import Deployment, DeploymentFailed, FailureKind
from executors.measuring.loop import MeasurePlan
from executors.simulated.executor import SimulatedExecutor
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
