"""Who proposed a trial, in the words ``advisor best`` says it with: the names a trial's ``PROPOSER_ATTR`` and the
results database's ``proposer`` column hold, each said once here."""

from __future__ import annotations

#: The search around the measured best (``advisor.proposers.around_best``), while the model guide yields.
AROUND_BEST = "around-best"

PROPOSERS: dict[str, str] = {
    "model": "the performance model's pick (the guide, re-fitted to the measured trials)",
    "sampler": "the study's sampler",
    AROUND_BEST: "the search around the measured best (TPE on the measured trials), while the model, which had "
                 "missed vLLM's defaults by more than it is held to, yielded",
    "grid": "the shuffled grid",
    "progress": "the tuner's own draw of an unmeasured candidate (the sampler had stalled)",
    "baseline": "vLLM's defaults, measured before the search",
    "repeat": "a repeat of a measured deployment",
}


def found_by(proposer: str | None) -> str:
    """The line that says which proposer found a study's answer."""
    return f"found by: {PROPOSERS.get(proposer or '', proposer or 'not recorded (a study older than the column)')}"
