"""Stand-in machines for research: the performance model with seeded, perturbed parameters.

A benchmark or a test of the guided search needs a "truth" the model does not know exactly — a machine
whose efficiencies and overheads differ from the defaults by an unknown factor. ``perturbed`` draws one,
reproducibly per seed. It is a research helper, not part of the product (``executors`` never uses it).

Scripts in this folder import it as ``from truths import perturbed`` (they run as ``python benchmarks/x.py``);
tests as ``from benchmarks.truths import perturbed`` (pytest puts the repository root on the path).
"""

from __future__ import annotations

import math
import random

from executors.perf import PerfParams


def perturbed(params: PerfParams, seed: int, spread: float = 2.0) -> PerfParams:
    """``params`` with each non-zero field scaled by a seeded log-uniform factor in [1/spread, spread], kept in
    its range: a stand-in for a machine the model does not know (benchmarks and tests of the guided search)."""
    rng = random.Random(f"truth-{seed}")
    vec = []
    for v, (lo, hi) in zip(params.to_vector(), PerfParams.bounds(), strict=True):
        f = math.exp(rng.uniform(-math.log(spread), math.log(spread)))
        vec.append(v if v == 0 else min(hi, max(lo, v * f)))
    return PerfParams.from_vector(vec, params)
