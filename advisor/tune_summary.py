"""What ``tune`` reports: a line per trial (``TrialReport``, the CLI's progress and the dashboard's live view) and
the run's summary (``TuneSummary``: counts, why it stopped, what the CLI's exit code follows)."""

from __future__ import annotations

from dataclasses import dataclass, field

from advisor.objectives import Outcome
from search_spaces import DeploymentConfig, TrialState


@dataclass
class TrialReport:
    """What the CLI's progress line shows after each trial."""

    number: int
    state: TrialState
    config: DeploymentConfig | None
    outcome: Outcome | None
    reason: str | None = None
    executed: bool = False
    wall_s: float = 0.0
    #: A line to show at once (an environment failure and what the tuner does about it); None otherwise.
    note: str | None = None


@dataclass
class TuneSummary:
    study: str
    storage: str
    executed: int = 0
    invalid: int = 0
    failed: int = 0
    #: Trials that failed twice for the environment this run (in neither ``executed`` nor ``failed``).
    environment_failed: int = 0
    repeats: int = 0
    #: Picks another worker was measuring at that moment: told FAIL, not run twice (``advisor.tune._taken_elsewhere``).
    taken_elsewhere: int = 0
    interrupted_found: int = 0
    baseline: int | None = None  # the trial measuring vLLM's defaults, when this run measured it
    repeated: list[int] = field(default_factory=list)  # trials measured again this run (their repeats' numbers)
    stopped_because: str = "budget reached"
    #: Every valid candidate of the space is measured: the study cannot go on (the CLI says so, exit 0).
    exhausted: bool = False
    #: The study stopped because the cluster kept failing (the CLI exits non-zero).
    environment_broken: bool = False
    reports: list[TrialReport] = field(default_factory=list)
    #: What the model's predictions (the knee searches' starts, the guide's start) rest on: a hardware profile,
    #: a parameter file, or the GPU kind's defaults, unmeasured (``advisor.profile.resolve_params``).
    model_params: str = ""
    #: The profile this run made before its first trial, when none matched (``executor.profile: auto``).
    profiled: str | None = None
