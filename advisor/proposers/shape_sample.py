"""What the guide ranks on a space too large to rank whole: a seeded sample drawn shape by shape, and where its
hill-climbs start (``advisor.proposers.guide``).

A candidate's *shape* is its mode and, per role, instances × TP × DP × EP: the choices that move a deployment's
throughput by multiples, where batch sizes, kernels and EPLB move it by percents. A one-knob climb rarely
crosses from one shape to another (DEP4 from TP4 is three knobs), so what the sample leaves out of a shape the
guide does not find: a uniform sample of 2,000 of the GB300 preset's 91,008 valid candidates expects 1.6 of
each of its rarest shapes (72 candidates each) and misses about one in five of them.
"""

from __future__ import annotations

import random
from typing import Any, TypeVar

from search_spaces import DeploymentConfig

Params = dict[str, Any]
_T = TypeVar("_T", bound=tuple[Any, ...])

#: At least this many of every shape (or all it has) go into a sample.
PER_SHAPE_SAMPLE = 4
#: Parameters that make a candidate's shape in ``build``'s parameters (``mode`` too): see ``shape_of``.
_SHAPE_SUFFIXES = ("_instances", "_tp", "_dp", "_ep")


def shape_of(cfg: DeploymentConfig) -> tuple[Any, ...]:
    """The mode and, per role, (instances, TP, DP, EP)."""
    return (cfg.mode, *((r.instances, r.tensor_parallel_size, r.data_parallel_size, r.enable_expert_parallel)
                        for r in cfg.roles))


def params_shape(params: Params) -> tuple[Any, ...]:
    """``shape_of`` read from a candidate's parameters, without building it (one-to-one with ``shape_of``)."""
    return tuple(v for k, v in params.items() if k == "mode" or k.endswith(_SHAPE_SUFFIXES))


def stratified(shapes: list[tuple[Any, ...]], rng: random.Random, size: int) -> list[int]:
    """Indices of ``size`` candidates, in order, given each candidate's shape (``params_shape``): every shape's
    share first (``size`` / shapes, at least ``PER_SHAPE_SAMPLE``, or all it has), then uniformly from the rest.
    Keeping the space's order makes ties among equal predictions break as an exhaustive ranking breaks them;
    taking shapes, not the candidates, keeps a listing of 91,008 candidates' parameters out of memory."""
    if len(shapes) <= size:
        return list(range(len(shapes)))
    members: dict[tuple[Any, ...], list[int]] = {}
    for i, s in enumerate(shapes):
        members.setdefault(s, []).append(i)
    quota = max(PER_SHAPE_SAMPLE, size // len(members))
    picked: set[int] = set()
    for of_shape in members.values():
        picked.update(rng.sample(of_shape, min(quota, len(of_shape))))
    rest = [i for i in range(len(shapes)) if i not in picked]
    picked.update(rng.sample(rest, max(0, min(size - len(picked), len(rest)))))
    return sorted(picked)


def best_of_each_shape(ranked: list[_T]) -> list[_T]:
    """The first (best) of each shape in ``ranked`` (tuples whose second item is the candidate), in order: climbs
    from distinct shapes explore more than climbs from the best few, which are mostly one shape with different
    batch sizes."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for t in ranked:
        s = shape_of(t[1])
        if s not in seen:
            seen.add(s)
            out.append(t)
    return out
