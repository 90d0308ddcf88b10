"""The shuffled grid (``sampler.kind: grid``): every valid candidate once, in a seeded order, picking up where a
continued study stopped."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import optuna

from advisor.job import TuningJob
from search_spaces import check
from search_spaces.valid_space import params_key


def _grid_held(study: optuna.Study) -> set[str]:
    """Grid points the study holds (asked, enqueued or told), except those told FAIL: a configuration's own
    failure is told COMPLETE-infeasible, so FAIL means it was never judged (the environment failed it, or its
    tuner was interrupted) and the grid measures it again."""
    return {params_key(t.system_attrs.get("fixed_params", t.params)) for t in study.get_trials(deepcopy=False)
            if t.state is not optuna.trial.TrialState.FAIL}


def grid_points(job: TuningJob, study: optuna.Study) -> Iterator[dict[str, Any]]:
    """Valid grid points in a seeded shuffled order (the 'shuffled grid' baseline), minus those the study
    already holds — so a continued grid study picks up where it stopped. After a pass, points the environment
    failed come round again (the loop's stop on repeated environment failures bounds this)."""
    valid = job.valid_space()
    if valid is not None:
        pts = list(valid.iter_valid())
    else:
        model, wl = job.model_profile(), job.workload
        pts = [p for p, cfg in job.space.enumerate() if not check(cfg, model, job.cluster, wl.max_model_len)]
    random.Random(job.sampler.seed).shuffle(pts)
    while True:
        held = _grid_held(study)
        todo = [p for p in pts if params_key(p) not in held]
        if not todo:
            return
        for p in todo:
            if params_key(p) not in _grid_held(study):  # another worker may have taken it meanwhile
                yield p
