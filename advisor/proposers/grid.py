"""The shuffled grid (``sampler.kind: grid``): every valid candidate once, in a seeded order, picking up where a
continued study stopped."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from advisor.job import TuningJob
from advisor.proposers.ledger import Ledger
from advisor.proposers.names import GRID
from advisor.proposers.protocol import Exhausted, Proposal
from search_spaces import check
from search_spaces.valid_space import params_key


def grid_order(job: TuningJob) -> list[dict[str, Any]]:
    """Every valid grid point in the seeded shuffled order (the 'shuffled grid' baseline)."""
    valid = job.valid_space()
    if valid is not None:
        pts = list(valid.iter_valid())
    else:
        model, wl = job.model_profile(), job.workload
        pts = [p for p, cfg in job.space.enumerate() if not check(cfg, model, job.cluster, wl.max_model_len)]
    random.Random(job.sampler.seed).shuffle(pts)
    return pts


class Grid:
    """The points the study does not hold yet (``Ledger.taken``: a point told FAIL — its environment failed, its
    tuner was interrupted — was never judged and comes round again), pass after pass: a pass lists what is left,
    then proposes each point another worker has not taken meanwhile. The loop's stop on repeated environment
    failures bounds the passes."""

    name = GRID

    def __init__(self, job: TuningJob) -> None:
        self.points = grid_order(job)
        self._pass: Iterator[dict[str, Any]] | None = None

    def propose(self, ledger: Ledger) -> Proposal:
        taken = ledger.taken
        point = next((p for p in self._pass if params_key(p) not in taken), None) if self._pass else None
        if point is None:  # a new pass, over what is left
            self._pass = iter([p for p in self.points if params_key(p) not in taken])
            point = next(self._pass, None)
        if point is None:
            raise Exhausted("grid exhausted", exhausted=False)
        return Proposal(point, self.name)
