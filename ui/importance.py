"""Parameter importance for the Study page: Optuna's ``get_param_importances`` over the measured trials of the
study's Optuna side (same storage), cached, and computed at once only for studies small enough."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import optuna
import streamlit as st

from advisor.errors import BadInput
from advisor.study import storage_for
from advisor.trial_record import EXECUTED_ATTR, EXTRA_ATTR, STATE_ATTR
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


def _measured(t: optuna.trial.FrozenTrial) -> bool:
    """A search trial the tuner measured: not an invalid candidate told the worst value, and neither vLLM's
    defaults (whose parameters are not the search's) nor a repeat (a second draw of a deployment already
    counted, which would weigh its parameters twice)."""
    return (bool(t.user_attrs.get(EXECUTED_ATTR)) and t.user_attrs.get(STATE_ATTR) == "complete"
            and not t.user_attrs.get(EXTRA_ATTR))


@st.cache_data(ttl=TTL_S * 4, show_spinner=False)
def importance(url: str, optuna_name: str, bucket: int, objective_index: int = 0) -> Importance:
    """``optuna.importance.get_param_importances`` (PED-ANOVA) for one objective, on the study in the same storage.

    Only search trials that were measured (``_measured``) count, so the
    answer is about what made deployments good, not about what made them break a rule: the others get a NaN
    target, which the evaluator leaves out, so it runs on the stored study itself (no copy of thousands of
    trials into a scratch study). PED-ANOVA ranks what reaches *low* targets, so a maximized objective is
    negated. ``bucket`` (see ``bucket``) only keys the cache.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stored = optuna.load_study(study_name=optuna_name, storage=storage_for(url))
            complete = stored.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            measured = [t for t in complete if _measured(t)]
            if len(measured) < MIN_IMPORTANCE_TRIALS:
                return Importance({}, f"parameter importance needs at least {MIN_IMPORTANCE_TRIALS} measured "
                                      f"trials; this study has {len(measured)} so far", len(measured))
            sign = -1.0 if stored.directions[objective_index] == optuna.study.StudyDirection.MAXIMIZE else 1.0
            ids = {t.number for t in measured}

            def target(t: optuna.trial.FrozenTrial) -> float:
                return sign * t.values[objective_index] if t.number in ids else float("nan")

            params = sorted({p for t in measured for p in t.distributions})
            values = optuna.importance.get_param_importances(stored, params=params, target=target)
    except KeyError:
        return Importance({}, f"no Optuna study named {optuna_name!r} in this storage")
    except (BadInput, ValueError, RuntimeError, ZeroDivisionError) as e:
        return Importance({}, f"parameter importance is not available: {str(e).splitlines()[0]}")
    return Importance({k: float(v) for k, v in values.items()}, "", len(measured))
