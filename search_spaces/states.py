"""The life of a trial. Stored as text, so values are never renumbered.

::

    RUNNING ──▶ COMPLETE      measured every load level
       │  ├───▶ FAILED        deployment/benchmark failed (reason + log tail kept); told to the sampler
       │  └───▶ INTERRUPTED   the tuner died or was stopped mid-trial; found and closed by the next run
    INVALID                   broke a validity rule; never launched (recorded with the rule)
"""

from __future__ import annotations

from enum import StrEnum


class TrialState(StrEnum):
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    INVALID = "invalid"
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        return self is not TrialState.RUNNING

    def can_become(self, new: TrialState) -> bool:
        return self is TrialState.RUNNING and new is not TrialState.RUNNING


class IllegalTransition(ValueError):
    pass


def transition(old: TrialState, new: TrialState) -> TrialState:
    if not old.can_become(new):
        raise IllegalTransition(f"a {old.value} trial cannot become {new.value}")
    return new
