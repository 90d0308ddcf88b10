"""Parameter importance for the Study page: Optuna's ``get_param_importances`` over the study's measured trials as
our rows hold them (the tuner's ledger, ``advisor.proposers.ledger``), cached, and computed at once only for studies
small enough."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import optuna
import streamlit as st
from optuna.distributions import CategoricalDistribution

import db
from advisor.api import job_of_study
from advisor.errors import BadInput
from advisor.job import TuningJob
from advisor.objectives import objective_names
from advisor.proposers.ledger import Ledger, Row
from search_spaces import TrialState, higher_is_better
from ui.data import TTL_S

#: Fewer measured trials than this and parameter importance says so instead of guessing.
MIN_IMPORTANCE_TRIALS = 4
#: Up to this many complete trials the Study page shows parameter importance at once; above, on request.
IMPORTANCE_AT_ONCE_TRIALS = 300


@dataclass(frozen=True)
class Importance:
    values: dict[str, float]
    message: str = ""
    trials_used: int = 0


def bucket(complete: int) -> int:
    """Importance is recomputed when the complete trials grew by a tenth (every trial while there are few):
    loading every trial from Optuna's storage takes seconds for thousands of trials."""
    step = max(1, complete // 10)
    return complete - complete % step


def at_once(complete: int) -> bool:
    """Whether the Study page computes importance on its first paint, or only when the reader asks: loading
    every trial from Optuna's storage costs about 2 s per 1,000 trials, more than the whole page may take."""
    return complete <= IMPORTANCE_AT_ONCE_TRIALS


def _measured(r: Row) -> bool:
    """A search trial the tuner measured: not an invalid candidate, and neither vLLM's defaults (whose parameters
    are not the search's) nor a repeat (a second draw of a deployment already counted, which would weigh its
    parameters twice)."""
    return r.state is TrialState.COMPLETE and bool(r.params) and not r.baseline and r.repeat_of is None


def _distributions(job: TuningJob, params: dict) -> dict[str, CategoricalDistribution] | None:
    """Each parameter's choices as the tuner suggested them (``SearchSpace.build`` on this candidate's path); None
    for parameters of another space (the job's space changed since they were measured)."""
    out: dict[str, CategoricalDistribution] = {}

    def choose(name: str, choices):
        out[name] = CategoricalDistribution(list(choices))
        return params[name] if params.get(name) in choices else choices[0]

    job.space.build(choose)
    if set(out) != set(params) or any(v not in out[k].choices for k, v in params.items()):
        return None
    return out


@st.cache_data(ttl=TTL_S * 4, show_spinner=False)
def importance(url: str, optuna_name: str, bucket: int, objective_index: int = 0) -> Importance:
    """``optuna.importance.get_param_importances`` (PED-ANOVA) for one objective, on the study's measured search
    trials (``_measured``) read from our rows — the same values Optuna was told — in a scratch in-memory study.

    Only measured trials count, so the answer is about what made deployments good, not about what made them
    break a rule. PED-ANOVA ranks what reaches *low* targets, so a maximized objective is negated. The tuner
    names its Optuna study after the study (``optuna_name``). ``bucket`` (see ``bucket``) only keys the cache.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            database = db.connect(url)
            try:
                job = job_of_study(database, optuna_name)
                rows = [r for r in Ledger.read(job, database, optuna_name).measured_rows() if _measured(r)]
            finally:
                database.close()
            if len(rows) < MIN_IMPORTANCE_TRIALS:
                return Importance({}, f"parameter importance needs at least {MIN_IMPORTANCE_TRIALS} measured "
                                      f"trials; this study has {len(rows)} so far", len(rows))
            sign = -1.0 if higher_is_better(objective_names(job)[objective_index]) else 1.0
            scratch = optuna.create_study()
            for r in rows:
                if r.told is not None and (dists := _distributions(job, dict(r.params))) is not None:
                    scratch.add_trial(optuna.trial.create_trial(params=dict(r.params), distributions=dists,
                                                                value=sign * r.told.values[objective_index]))
            trials = scratch.get_trials(deepcopy=False)
            params = sorted({p for t in trials for p in t.distributions})
            values = optuna.importance.get_param_importances(scratch, params=params, target=lambda t: t.value)
    except (db.UnknownStudy, db.DatabaseUnavailable) as e:
        return Importance({}, f"no study named {optuna_name!r} in this storage ({str(e).splitlines()[0]})")
    except (BadInput, ValueError, RuntimeError, ZeroDivisionError) as e:
        return Importance({}, f"parameter importance is not available: {str(e).splitlines()[0]}")
    return Importance({k: float(v) for k, v in values.items()}, "", len(rows))
