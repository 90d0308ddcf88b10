"""A DeploymentConfig placed on a cluster: which instance runs on which GPUs of which node.

``place`` is a pure function (no ports, no processes): the simulated executor reads it for the
scale-up/scale-out split, the real executors turn it into placement groups and command lines, and the
exports render it. Ports are given out by the executor that launches, since only it knows what is free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from search_spaces import ClusterSpec, DeploymentConfig, Role, RoleConfig, instance_sizes, pack


@dataclass(frozen=True)
class NodeShard:
    """The part of one instance on one node: DP ranks ``[start_rank, start_rank + local_ranks)``."""

    node: int
    gpus: tuple[int, ...]  # GPU indices on that node
    start_rank: int
    local_ranks: int

    @property
    def is_head(self) -> bool:
        return self.start_rank == 0


@dataclass(frozen=True)
class Instance:
    """One vLLM deployment (one API endpoint) of one role."""

    role: Role
    index: int  # within its role
    config: RoleConfig
    shards: tuple[NodeShard, ...]

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.index}"

    @property
    def head(self) -> NodeShard:
        return self.shards[0]

    @property
    def multi_node(self) -> bool:
        return len(self.shards) > 1


@dataclass(frozen=True)
class Topology:
    config: DeploymentConfig
    cluster: ClusterSpec
    instances: tuple[Instance, ...] = field(default_factory=tuple)

    def of_role(self, role: Role) -> list[Instance]:
        return [i for i in self.instances if i.role is role]

    @property
    def gpus(self) -> int:
        return self.config.total_gpus

    def to_dict(self) -> dict:
        """JSON-safe placement, as stored with each trial and drawn by the dashboard."""
        return {
            "cluster": self.cluster.model_dump(mode="json"),
            "instances": [
                {
                    "name": i.name,
                    "role": i.role.value,
                    "gpus": i.config.gpus_per_instance,
                    "shards": [
                        {"node": s.node, "gpus": list(s.gpus), "start_rank": s.start_rank, "local_ranks": s.local_ranks}
                        for s in i.shards
                    ],
                }
                for i in self.instances
            ],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], config: DeploymentConfig) -> Topology:
        """The placement ``to_dict`` stored, on the configuration it was stored with: what a trial ran, rather
        than what ``place`` would give today. Raises ``ValueError`` when the document is not a placement of
        ``config`` (another number of instances or GPUs per role, a shard of another instance's size)."""
        try:
            cluster = ClusterSpec.model_validate(doc["cluster"])
            by_role = {r.role: r for r in config.roles}
            instances: list[Instance] = []
            for item in doc["instances"]:
                role_cfg = by_role[Role(item["role"])]
                shards = tuple(NodeShard(int(s["node"]), tuple(int(g) for g in s["gpus"]), int(s["start_rank"]),
                                         int(s["local_ranks"])) for s in item["shards"])
                if sum(len(s.gpus) for s in shards) != role_cfg.gpus_per_instance:
                    raise ValueError(f"{item['name']} holds {sum(len(s.gpus) for s in shards)} GPUs, its "
                                     f"configuration {role_cfg.gpus_per_instance}")
                index = sum(i.role is role_cfg.role for i in instances)
                instances.append(Instance(role_cfg.role, index, role_cfg, shards))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a placement of this configuration: {e}") from None
        for r in config.roles:
            placed = sum(i.role is r.role for i in instances)
            if placed != r.instances:
                raise ValueError(f"not a placement of this configuration: {placed} {r.role.value} instance(s) "
                                 f"stored, {r.instances} configured")
        return cls(config, cluster, tuple(instances))

    def describe(self) -> str:
        lines = [f"{self.config.describe()} on {self.cluster.describe()}"]
        for inst in self.instances:
            where = ", ".join(f"node {s.node} GPUs {s.gpus[0]}–{s.gpus[-1]}" for s in inst.shards)
            lines.append(f"  {inst.name}: {where}")
        return "\n".join(lines)


def place(cfg: DeploymentConfig, cluster: ClusterSpec) -> Topology:
    """Pack every instance onto the cluster (``search_spaces.pack``) and split it into DP ranks per node.

    Raises ``search_spaces.PackingError`` when it does not fit (``search_spaces.check`` says so first).
    """
    slices = pack(instance_sizes(cfg), cluster)
    instances: list[Instance] = []
    k = 0
    for role_cfg in cfg.roles:
        tp = role_cfg.tensor_parallel_size
        for idx in range(role_cfg.instances):
            shards: list[NodeShard] = []
            rank = 0
            for s in slices[k]:
                local = s.count // tp
                shards.append(NodeShard(s.node, tuple(range(s.first_gpu, s.first_gpu + s.count)), rank, local))
                rank += local
            instances.append(Instance(role_cfg.role, idx, role_cfg, tuple(shards)))
            k += 1
    return Topology(cfg, cluster, tuple(instances))
