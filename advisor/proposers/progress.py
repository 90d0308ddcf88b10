"""Progress guaranteed: when the sampler keeps proposing what was measured or cannot run, the tuner
proposes an unmeasured valid candidate itself — the model's best, else a random one — so a study always moves
or ends saying its space is exhausted."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from advisor.job import TuningJob
from advisor.proposers.guide import ModelGuide
from advisor.proposers.ledger import Ledger
from advisor.proposers.names import PROGRESS
from advisor.proposers.protocol import Exhausted, Proposal
from search_spaces import check
from search_spaces.valid_space import ValidSpace, params_key

#: Proposals in a row that measured nothing new (invalid, or measured already) before the tuner proposes an
#: unmeasured valid candidate itself. Only a space too large to enumerate gets there (``ValidSpaceSampler``
#: steers every other study's proposals to valid, unmeasured candidates).
STALE_PROPOSALS = 3
#: Random draws the tuner tries for an unmeasured valid candidate when the space could not be enumerated.
PROGRESS_DRAWS = 200


class Progress:
    """Due after ``STALE_PROPOSALS`` proposals in a row that ran nothing new (``stale`` counts them): the best
    unmeasured valid candidate by the model (the guide's ranking), else a random one; ``Exhausted`` when there is
    none."""

    name = PROGRESS

    def __init__(self, job: TuningJob, guide: ModelGuide | None, valid: ValidSpace | None, rng: random.Random,
                 stale: Callable[[], int]) -> None:
        self.job, self.guide, self.valid, self.rng, self.stale = job, guide, valid, rng, stale

    def propose(self, ledger: Ledger) -> Proposal | None:
        if self.stale() < STALE_PROPOSALS:
            return None
        taken = ledger.taken
        params = self.guide.propose(ledger.config_keys) if self.guide is not None else None
        if params is None and self.valid is not None:
            params = self.valid.sample(self.rng, taken)
        if params is None:
            params = self._draw(taken)
        if params is None:
            raise Exhausted(f"space exhausted: no unmeasured valid candidate in {PROGRESS_DRAWS} random draws after "
                            f"{self.stale()} proposals in a row that measured nothing new")
        return Proposal(params, self.name)

    def _draw(self, taken: set[str]) -> dict[str, Any] | None:
        """No enumerable space: random draws, checked one by one."""
        job, model = self.job, self.job.model_profile()
        for _ in range(PROGRESS_DRAWS):
            draw: dict[str, Any] = {}
            cfg = job.space.build(lambda n, ch: draw.setdefault(n, ch[self.rng.randrange(len(ch))]))
            if params_key(draw) not in taken and not check(cfg, model, job.cluster, job.workload.max_model_len):
                return draw
        return None
