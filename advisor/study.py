"""The Optuna side of a study: storage, sampler, directions — on the job's one database URL."""

from __future__ import annotations

import warnings
import weakref

import optuna

import db

from advisor.errors import BadInput
from advisor.job import SamplerKind, TuningJob
from db import redact_url, scrub
from advisor.objectives import objective_names
from advisor.proposers.valid_sampler import ValidSpaceSampler
from search_spaces import higher_is_better

__all__ = ["make_sampler", "open_study", "storage_for", "trial_by_number"]

#: The storage each study was opened on: an ``optuna.Study`` keeps its own private, and a trial known only by its
#: number (a resuming tuner telling what a killed one recorded) is reached through the storage's public methods.
_STORAGES: weakref.WeakKeyDictionary[optuna.Study, optuna.storages.BaseStorage] = weakref.WeakKeyDictionary()

# Errors only: Optuna's warnings are about its own internals, and during a database outage it logs each failed
# query ("Caught an error from sqlalchemy … Falling back to a slower alternative", several lines) ahead of the one
# line the tuner prints (db.outage) — the user can act on that line, not on those.
optuna.logging.set_verbosity(optuna.logging.ERROR)
# ``multivariate``/``group`` are marked experimental; they are what makes TPE work on a conditional space.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def make_sampler(job: TuningJob) -> optuna.samplers.BaseSampler:
    """The job's sampler, steered onto the valid space where the space can be enumerated role by role
    (``advisor.proposers.valid_sampler``); the grid enumerates valid points itself."""
    base = _base_sampler(job)
    space = job.valid_space() if job.sampler.kind is not SamplerKind.GRID else None
    return base if space is None else ValidSpaceSampler(base, space, job.sampler.seed)


def _base_sampler(job: TuningJob) -> optuna.samplers.BaseSampler:
    """No ``constraints_func``: Optuna 5's TPE, NSGA-II and GP read each trial's ``FrozenTrial.constraints``
    themselves (TPE's ``_split_trials``, NSGA-II's constrained domination, GP's constraint model), and the tuner
    stores the SLO violation there before it tells the trial (``advisor.trial_record``). A ``constraints_func``
    would only write the same attribute again in ``after_trial``, and Optuna 5.0 deprecates it."""
    s = job.sampler
    if s.kind is SamplerKind.TPE:
        # multivariate + group: the space is conditional (prefill dims exist only when disaggregated),
        # and grouped TPE models each branch jointly instead of falling back to independent sampling.
        return optuna.samplers.TPESampler(
            seed=s.seed, n_startup_trials=s.n_startup_trials, multivariate=True, group=True,
        )
    if s.kind is SamplerKind.NSGA2:
        return optuna.samplers.NSGAIISampler(seed=s.seed)
    if s.kind is SamplerKind.GP:
        return optuna.samplers.GPSampler(seed=s.seed, n_startup_trials=s.n_startup_trials)
    # random, and grid (grid points are enqueued by the tuner; anything else falls back to random)
    return optuna.samplers.RandomSampler(seed=s.seed)


def storage_for(url: str) -> optuna.storages.RDBStorage:
    try:
        return db.optuna_storage(url)  # one URL, one driver (psycopg 3), for our tables and Optuna's
    except Exception as e:  # noqa: BLE001 — any driver error is the user's URL, said in one line
        raise BadInput(f"storage: cannot open {redact_url(url)}: {scrub(str(e).splitlines()[0], url)}") from None


def open_study(job: TuningJob, url: str, name: str) -> optuna.Study:
    directions = ["maximize" if higher_is_better(n) else "minimize" for n in objective_names(job)]
    storage = storage_for(url)
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, directions=directions, sampler=make_sampler(job), load_if_exists=True
        )
    except ValueError as e:
        raise BadInput(f"study {name!r}: {e}") from None
    if len(study.directions) != len(directions):
        raise BadInput(
            f"objective.mode: study {name!r} was created with {len(study.directions)} objective(s); "
            f"this job asks for {len(directions)} — use another --study name"
        )
    if study.metric_names != objective_names(job):  # optuna-dashboard and the DB name the objectives
        study.set_metric_names(objective_names(job))
    _STORAGES[study] = storage
    return study


def trial_by_number(study: optuna.Study, number: int) -> optuna.Trial:
    """Trial ``number`` of a study ``open_study`` opened, as an ``optuna.Trial`` (to set its attributes, tell it)."""
    storage = _STORAGES[study]
    sid = storage.get_study_id_from_name(study.study_name)
    return optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(sid, number))
