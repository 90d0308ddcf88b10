"""The model guide inside a study: who gets a turn, the model's pick enqueued for the next ask (or, while the guide
yields, the search around the measured best's), the turns and the measured trials a study already has (a resumed
study, or another worker's) — what ``advisor.tune`` asks of ``advisor.proposers.guide.ModelGuide``."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import optuna

import db
from advisor.executor_factory import model_params
from advisor.job import SamplerKind, TuningJob
from advisor.proposers.around_best import AROUND_BEST, AroundBest
from advisor.proposers.guide import DECLINED_ATTR, MAX_FIT_TRIALS, PROPOSER_ATTR, ModelGuide
from advisor.trial_record import CONFIG_KEY_ATTR, EXECUTED_ATTR, STATE_ATTR
from executors.perf import PerfParams
from search_spaces import TrialState


def make_guide(job: TuningJob, start: PerfParams) -> ModelGuide | None:
    """A guide for the default sampler (TPE with ``sampler.guide``); None for the baselines."""
    if job.sampler.kind is not SamplerKind.TPE or not job.sampler.guide or job.sampler.guided_trials == 0:
        return None
    return ModelGuide(job, start)


#: Each guide's search around the measured best, made the first time the guide yields.
_AROUND: weakref.WeakKeyDictionary[ModelGuide, AroundBest | None] = weakref.WeakKeyDictionary()


def enqueue_turn(guide: ModelGuide | None, study: optuna.Study, executed: int,
                 taken: Callable[[], set[str]], best_measured: float | None = None) -> bool | None:
    """On a model turn, enqueue the model's pick so that the next ``study.ask()`` returns it: True if it did,
    None if the model declined its turn (the caller marks the sampler's trial with ``DECLINED_ATTR``, so the
    study counts the turn), False when it was not a model turn. ``taken`` (the config keys not to propose) is
    asked for only on a model turn. While the guide yields (the model missed the baseline), every trial is the
    search around the measured best's (True), where the space can be listed; else the sampler's (False)."""
    if guide is not None and guide.yielding:
        return enqueue_around_best(guide, study)
    if guide is None or not guide.wants_turn(executed):
        return False
    params = guide.propose(taken(), best_measured)
    if params is None:
        return None
    study.enqueue_trial(params, user_attrs={PROPOSER_ATTR: "model"})
    return True


def enqueue_around_best(guide: ModelGuide, study: optuna.Study) -> bool:
    """Enqueue the search around the measured best's next candidate (``advisor.proposers.around_best``); False
    where the valid space cannot be listed or nothing is measured yet."""
    if guide not in _AROUND:
        valid = guide.job.valid_space()
        _AROUND[guide] = AroundBest(guide.job, valid) if valid is not None else None
    around = _AROUND[guide]
    params = around.propose(study) if around is not None else None
    if params is None:
        return False
    study.enqueue_trial(params, user_attrs={PROPOSER_ATTR: AROUND_BEST})
    return True


def study_turns(trials: Iterable[optuna.trial.FrozenTrial]) -> int:
    """Model turns a study has had, in any worker: picks enqueued plus turns the model declined."""
    return sum(1 for t in trials if t.user_attrs.get(PROPOSER_ATTR) == "model" or t.user_attrs.get(DECLINED_ATTR))


def resume_guide(job: TuningJob, study: optuna.Study, database: db.Database, name: str,
                 start: PerfParams | None = None) -> ModelGuide | None:
    """The model guide of a guided study, re-fitted to what the study has measured so far (a continued study
    picks up its calibration and its count of model turns). ``start``: what the model starts from (a hardware
    profile; default the job's parameter file or the GPU kind's defaults)."""
    guide = make_guide(job, start if start is not None else model_params(job))
    if guide is None:
        return None
    trials = study.get_trials(deepcopy=False)
    guide.turns = study_turns(trials)
    done = [t.number for t in trials if t.state is optuna.trial.TrialState.COMPLETE
            and t.user_attrs.get(EXECUTED_ATTR) and t.user_attrs.get(STATE_ATTR) == TrialState.COMPLETE.value]
    for number in done[-MAX_FIT_TRIALS:]:
        t = db.queries.get_trial(database, name, number)
        if t is not None and t.config is not None:
            guide.observe(t.config, list(t.measurements), refit=False)
            if t.predicted and t.objectives and (t.violation or 0.0) <= 0:
                guide.judge(t.predicted, t.objectives, baseline=t.baseline and t.repeat_of is None)
    guide.refit()
    return guide


def study_taken(guide: ModelGuide, study: optuna.Study) -> set[str]:
    """Config keys the model must not propose: measured, failed, or asked by a worker and not yet told."""
    taken = set()
    for t in study.get_trials(deepcopy=False):
        if CONFIG_KEY_ATTR in t.user_attrs:
            taken.add(t.user_attrs[CONFIG_KEY_ATTR])
        elif t.state in (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING) and t.params:
            try:
                taken.add(guide.config_of(t.params).key())
            except ValueError:
                continue
    return taken
