"""Who proposed a trial, in the words ``advisor best`` says it with: the names a trial's ``PROPOSER_ATTR`` and the
results database's ``proposer`` column hold, each said once here."""

from __future__ import annotations

#: The performance model's pick (``advisor.proposers.guide``).
MODEL = "model"
#: The study's sampler, on a model turn the model declined (it predicted nothing better than the measured best):
#: the turn counts as the model's (``Ledger.turns``). At most 16 characters (the column's width).
MODEL_DECLINED = "model-declined"
SAMPLER = "sampler"
GRID = "grid"
PROGRESS = "progress"
#: The search around the measured best (``advisor.proposers.around_best``), while the model guide yields.
AROUND_BEST = "around-best"

PROPOSERS: dict[str, str] = {
    MODEL: "the performance model's pick (the guide, re-fitted to the measured trials)",
    SAMPLER: "the study's sampler",
    MODEL_DECLINED: "the study's sampler, on a turn the performance model declined (it predicted nothing better "
                    "than the measured best)",
    AROUND_BEST: "the search around the measured best (TPE on the measured trials), while the model, which had "
                 "missed vLLM's defaults by more than it is held to, yielded",
    GRID: "the shuffled grid",
    PROGRESS: "the tuner's own draw of an unmeasured candidate (the sampler had stalled)",
    "baseline": "vLLM's defaults, measured before the search",
    "repeat": "a repeat of a measured deployment",
}


def found_by(proposer: str | None) -> str:
    """The line that says which proposer found a study's answer."""
    return f"found by: {PROPOSERS.get(proposer or '', proposer or 'not recorded (a study older than the column)')}"
