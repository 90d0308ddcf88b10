"""Progress guaranteed: when the sampler keeps proposing what was measured or cannot run, the tuner
proposes an unmeasured valid candidate itself — the model's best, else a random one — so a study always moves
or ends saying its space is exhausted."""

from __future__ import annotations

import random
from typing import Any

import optuna

from advisor.proposers.guide import PROPOSER_ATTR, ModelGuide
from advisor.proposers.guide_turns import study_taken
from advisor.job import TuningJob
from search_spaces import check
from search_spaces.valid_space import ValidSpace, params_key

#: Proposals in a row that measured nothing new (invalid, or measured already) before the tuner proposes an
#: unmeasured valid candidate itself. Only a space too large to enumerate gets there (``ValidSpaceSampler``
#: steers every other study's proposals to valid, unmeasured candidates).
STALE_PROPOSALS = 3
#: Random draws the tuner tries for an unmeasured valid candidate when the space could not be enumerated.
PROGRESS_DRAWS = 200


def enqueue_progress(job: TuningJob, study: optuna.Study, guide: ModelGuide | None, valid: ValidSpace | None,
                     taken: set[str], rng: random.Random) -> bool:
    """After ``STALE_PROPOSALS`` proposals in a row that ran nothing new: the best unmeasured valid candidate
    by the model (the guide's ranking), else a random one — so a study always moves."""
    params = None
    if guide is not None:
        params = guide.propose(study_taken(guide, study))
    if params is None and valid is not None:
        params = valid.sample(rng, taken)
    if params is None:  # no enumerable space: random draws, checked one by one
        model = job.model_profile()
        for _ in range(PROGRESS_DRAWS):
            draw: dict[str, Any] = {}
            cfg = job.space.build(lambda n, ch: draw.setdefault(n, ch[rng.randrange(len(ch))]))
            if params_key(draw) not in taken and not check(cfg, model, job.cluster, job.workload.max_model_len):
                params = draw
                break
    if params is None:
        return False
    study.enqueue_trial(params, user_attrs={PROPOSER_ATTR: "progress"})
    return True
