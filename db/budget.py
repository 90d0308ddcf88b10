"""What a study's trial budget (``budget.trials``, ``--trials``) counts: one rule, read by the tuner (when to stop),
the CLI (its progress bar) and the dashboard ("N of budget trials").

The budget counts configurations of the search measured: a trial that deployed its configuration and whose
result judges it (``executed``: complete or failed), and that is part of the search. Not counted:

- vLLM's defaults (``baseline``) and the best deployments deployed again after the search (``repeat_of``):
  measured on purpose outside the search, so a budget of N searches N configurations;
- a configuration proposed again whose measurements are reused (``reused_from``): nothing ran;
- a trial the environment failed twice: its configuration was not judged (three in a row stop the study
  instead, ``advisor.tune.ENVIRONMENT_FAILURES_TO_STOP``);
- an invalid candidate (never launched) and an interrupted trial (cut short; a resume measures again).

While a study runs, its workers also reserve the search trials still RUNNING (``in_flight``), so that several
workers sharing one study stop together instead of each running a whole budget.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session

from db.models import TrialRow
from search_spaces import TrialState


def _search() -> ColumnElement[bool]:
    return and_(TrialRow.baseline.is_(False), TrialRow.repeat_of.is_(None))


def counts_toward_budget(*, in_flight: bool = False) -> ColumnElement[bool]:
    """The rule, as a condition on ``advisor_trials`` rows; ``in_flight`` adds the search trials still running."""
    done = and_(TrialRow.executed.is_(True), _search())
    if not in_flight:
        return done
    return or_(done, and_(TrialRow.state == TrialState.RUNNING.value, _search()))


def budget_used(s: Session, study_ids: Collection[int], *, in_flight: bool = False) -> dict[int, int]:
    """Trials the budget counts, per study id (0 for a study with none)."""
    out = dict.fromkeys(study_ids, 0)
    if not out:
        return out
    q = (select(TrialRow.study_id, func.count()).where(TrialRow.study_id.in_(list(out)),
                                                       counts_toward_budget(in_flight=in_flight))
         .group_by(TrialRow.study_id))
    out.update({sid: n for sid, n in s.execute(q)})
    return out
