"""Which GPUs of which nodes each instance gets: the one packing rule, shared by the validity check
(does it fit?) and by placement in ``executors`` (where exactly?)."""

from __future__ import annotations

from dataclasses import dataclass

from search_spaces.cluster import ClusterSpec


@dataclass(frozen=True)
class Slice:
    """GPUs ``[first_gpu, first_gpu + count)`` of node ``node``."""

    node: int
    first_gpu: int
    count: int


class PackingError(ValueError):
    pass


def pack(sizes: list[int], cluster: ClusterSpec) -> list[list[Slice]]:
    """Assign each instance (by GPU count, in order) to slices of nodes.

    Instances larger than a node take whole nodes (vLLM's multi-node DP puts the same number of ranks on
    every node); smaller ones are packed first-fit-decreasing into the nodes left, never across a node
    boundary, so that their GPUs share NVLink. Raises PackingError with a readable reason.
    """
    per_node = cluster.gpus_per_node
    free = [per_node] * cluster.nodes
    result: list[list[Slice] | None] = [None] * len(sizes)
    next_whole = 0
    for i, g in enumerate(sizes):
        if g > per_node:
            if g % per_node:
                raise PackingError(
                    f"an instance of {g} GPUs spans nodes but is not a multiple of {per_node} GPUs per node"
                )
            need = g // per_node
            if next_whole + need > cluster.nodes:
                raise PackingError(f"instances need more than the cluster's {cluster.nodes} nodes")
            result[i] = [Slice(n, 0, per_node) for n in range(next_whole, next_whole + need)]
            for n in range(next_whole, next_whole + need):
                free[n] = 0
            next_whole += need
    small = sorted((i for i, g in enumerate(sizes) if g <= per_node), key=lambda i: -sizes[i])
    for i in small:
        g = sizes[i]
        for n in range(next_whole, cluster.nodes):
            if free[n] >= g:
                result[i] = [Slice(n, per_node - free[n], g)]
                free[n] -= g
                break
        else:
            raise PackingError(
                f"an instance of {g} GPUs finds no node with {g} free GPUs "
                f"({sum(sizes)} GPUs asked of {cluster.total_gpus})"
            )
    return [r for r in result if r is not None]
