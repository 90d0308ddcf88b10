"""How many trials a study ran and whether it still runs, said once for every screen.

A real study's trials are of three kinds: the search's (what ``budget.trials`` counts, ``db.budget``), vLLM's
defaults (the baseline and its repeats on fresh deploys) and the repeats of the search's best deployments. A bare
"5/5" beside "complete 8" reads as a contradiction, so every count names what it counts (``Counts.text``), and
``advisor studies``, the dashboard's study list, its cards and its progress panel all print that one sentence.

A study "runs" only while a tuner's heartbeat is fresh: a database copied from a machine whose tuner died (or
was cut off) keeps trials in RUNNING that nothing will finish, and those are said as left running, not as a
running study.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from advisor.recovery import STALE_AFTER_S
from db import Study
from search_spaces import TrialState


def budget_of(job: dict[str, Any]) -> int:
    """``budget.trials`` of a stored job document (0 where it names none)."""
    trials = (job.get("budget") or {}).get("trials", 0)
    return trials if isinstance(trials, int) else 0


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else many or word + 's'}"


@dataclass(frozen=True)
class Counts:
    """A study's trials by kind and state, against its budget."""

    #: Search trials that ran and judge their configuration: what the budget counts.
    searched: int
    budget: int
    #: Runs of vLLM's defaults (the baseline and its repeats).
    baseline_runs: int = 0
    #: Repeats of searched deployments on fresh deploys.
    repeats: int = 0
    #: Trials that reused an earlier trial's measurements (nothing ran).
    reused: int = 0
    complete: int = 0
    failed: int = 0
    invalid: int = 0
    interrupted: int = 0
    running: int = 0
    #: The newest heartbeat of a RUNNING trial.
    heartbeat_at: datetime | None = None

    @classmethod
    def of(cls, study: Study, budget: int) -> Counts:
        """The counts of ``study`` (``db.queries.list_studies``'s row) against ``budget`` (its job's
        ``budget.trials``)."""
        c = study.counts
        return cls(study.budget_used, budget, study.baseline_runs, study.repeats, study.reused,
                   c.get(TrialState.COMPLETE.value, 0), c.get(TrialState.FAILED.value, 0),
                   c.get(TrialState.INVALID.value, 0), c.get(TrialState.INTERRUPTED.value, 0),
                   c.get(TrialState.RUNNING.value, 0), study.heartbeat_at)

    def alive(self, now: datetime | None = None) -> bool:
        """Some trial is RUNNING and its tuner's heartbeat is fresh (within ``STALE_AFTER_S``)."""
        if not self.running or self.heartbeat_at is None:
            return False
        beat = self.heartbeat_at if self.heartbeat_at.tzinfo else self.heartbeat_at.replace(tzinfo=UTC)
        return ((now or datetime.now(UTC)) - beat).total_seconds() <= STALE_AFTER_S

    def state(self, now: datetime | None = None) -> str:
        """``running`` (a live tuner), ``left running`` (RUNNING trials, no tuner's heartbeat), ``finished``
        (the budget's search trials ran) or ``stopped`` (fewer)."""
        if self.alive(now):
            return "running"
        if self.running:
            return "left running"
        return "finished" if self.searched >= self.budget else "stopped"

    def searched_text(self) -> str:
        """``5 of 5 search trials run``: the budget's own count, named."""
        return f"{self.searched:,} of {self.budget:,} search trial{'' if self.budget == 1 else 's'} run"

    def text(self, now: datetime | None = None) -> str:
        """Every count named: ``5 of 5 search trials run, plus 2 runs of vLLM's defaults and 1 repeat of a
        searched deployment on fresh deploys; 8 complete, 0 failed, 0 invalid``."""
        extra = []
        if self.baseline_runs:
            extra.append(f"{_plural(self.baseline_runs, 'run')} of vLLM's defaults")
        if self.repeats:
            extra.append(f"{_plural(self.repeats, 'repeat')} of a searched deployment")
        text = self.searched_text()
        if extra:
            text += f", plus {' and '.join(extra)} on fresh deploys"
        if self.reused:
            text += f" ({_plural(self.reused, 'proposal')} reused earlier measurements, not run again)"
        text += f"; {self.complete:,} complete, {self.failed:,} failed, {self.invalid:,} invalid"
        if self.interrupted:
            text += f", {self.interrupted:,} interrupted"
        if self.running:
            text += (f", {self.running:,} running" if self.alive(now) else
                     f", {self.running:,} left running with no tuner's heartbeat for over {STALE_AFTER_S:g} s "
                     "(`advisor cleanup` closes them)")
        return text
