"""What a study's repeats, baseline and predictions say about its answer: spread, gain, ties, model error.

A single measurement of a deployment is one draw; the tuner repeats its best deployments and vLLM's defaults
on fresh deploys (``budget.repeat_top``), and these functions turn those runs into the sentences ``advisor
best`` prints: the run-to-run spread of the best deployment, its gain over the baseline as a range (worst and
best pairing of the runs), and a *tie* wherever two deployments' run ranges overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from advisor.guide import JUDGE_WINDOW, MAX_CV_ERROR  # the guide owns the window and the limit
from advisor.job import TuningJob
from advisor.objectives import copies, objective_names
from db import Trial
from search_spaces import TrialState


@dataclass
class Runs:
    """Every measured run of one deployment: its first trial and the repeats of it."""

    trial: int
    config_text: str
    gpus: int | None
    values: list[float] = field(default_factory=list)
    proposer: str | None = None

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def spread(self) -> float:
        """(max − min) / mean of the runs; 0 with one run (then nothing is known of the spread)."""
        return (self.high - self.low) / self.mean if self.mean else 0.0

    def ties(self, other: Runs) -> bool:
        """Whether the two deployments' run ranges overlap (neither is measurably better)."""
        return self.low <= other.high and other.low <= self.high


def runs_by_deployment(job: TuningJob, trials: list[Trial]) -> dict[int, Runs]:
    """Feasible completed measured trials grouped by original trial (a repeat joins the trial it repeats)."""
    name = objective_names(job)[0]
    out: dict[int, Runs] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if t.state is not TrialState.COMPLETE or not t.objectives or (t.violation or 0.0) > 0:
            continue
        if (t.reason or "").startswith("same configuration"):
            continue
        v = t.objectives.get(name)
        if v is None:
            continue
        key = t.repeat_of if t.repeat_of is not None else t.number
        r = out.setdefault(key, Runs(key, t.config_text or "", t.gpus, proposer=None))
        r.values.append(float(v))
        if t.repeat_of is None:
            r.proposer, r.config_text, r.gpus = t.proposer, t.config_text or "", t.gpus
    return out


def model_error(trials: list[Trial], job: TuningJob) -> tuple[float | None, int]:
    """Mean |predicted / measured − 1| of the first objective over the last ``JUDGE_WINDOW`` trials whose
    prediction was stored before they ran (the guide's out-of-sample error), and how many it covers."""
    name = objective_names(job)[0]
    errs = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.state is TrialState.COMPLETE and t.predicted and t.objectives and (t.violation or 0.0) <= 0:
            p, m = t.predicted.get(name), t.objectives.get(name)
            if p is not None and m:
                errs.append(abs(p / m - 1.0))
    recent = errs[-JUDGE_WINDOW:]
    return (sum(recent) / len(recent) if recent else None), len(recent)


def verdict_lines(job: TuningJob, trials: list[Trial]) -> list[str]:
    """The sentences under ``advisor best``: spread, gain over the baseline, ties, whole cluster, model error."""
    name = objective_names(job)[0]
    runs = runs_by_deployment(job, trials)
    lines: list[str] = []
    base = next((r for r in runs.values() if r.proposer == "baseline"), None)
    search = sorted((r for r in runs.values() if r.proposer != "baseline"), key=lambda r: r.mean, reverse=True)
    simulated = job.executor.kind.value == "simulated"  # the model (reserving GPUs or not): no spread, no baseline
    if search:
        best = search[0]
        vals = " / ".join(f"{v:,.1f}" for v in best.values)
        if simulated:
            pass
        elif len(best.values) > 1:
            lines.append(f"run to run: trial {best.trial} measured {len(best.values)}× on fresh deploys: {vals} "
                         f"{name} (spread {best.spread:.1%})")
        else:
            lines.append(f"run to run: trial {best.trial} measured once ({vals} {name}); no spread known")
        if len(search) > 1 and best.ties(search[1]) and len(best.values) > 1:
            lines.append(f"tie: trial {search[1].trial} ({search[1].mean:,.1f}) is within trial {best.trial}'s "
                         f"run-to-run range ({best.low:,.1f}–{best.high:,.1f})")
        if base is None and not simulated:
            bases = {t.number for t in trials if t.proposer == "baseline"}
            missed = [t for t in trials if t.number in bases or t.repeat_of in bases]
            if missed:
                lines.append(f"vs vLLM's defaults: no gain can be stated — no level of the baseline's {len(missed)} "
                             f"run(s) (trial {', '.join(str(t.number) for t in missed)}) met the SLOs")
        if base is not None:
            lo, hi = best.low / base.high, best.high / base.low
            word = "a tie" if best.ties(base) else ("a gain" if lo > 1 else "a loss")
            lines.append(f"vs vLLM's defaults (trial {base.trial}, {base.mean:,.1f} over {len(base.values)} run(s)): "
                         f"{best.mean / base.mean:.2f}× (range {lo:.2f}–{hi:.2f}×): {word}")
        if best.gpus:
            n = copies(job, best.gpus)
            total = job.cluster.total_gpus
            idle = total - n * best.gpus
            per_dep = best.mean * best.gpus if name in ("throughput_per_gpu", "output_throughput_per_gpu") \
                else None
            text = f"whole cluster: {n} cop{'y' if n == 1 else 'ies'} of {best.gpus} GPU(s) fit {total} GPUs"
            text += f" ({idle} idle)" if idle else ""
            if per_dep is not None and job.objective.scope.value == "deployment":
                text += f": {n * per_dep:,.0f} tok/s for the cluster at the SLOs"
            lines.append(text)
    err, n = model_error(trials, job)
    if err is not None:
        state = "model turns yield to the sampler" if err > MAX_CV_ERROR and n >= 2 else "model turns go on"
        lines.append(f"performance model: {err:.0%} mean error on the last {n} trial(s), predicted before each ran "
                     f"({state}; the limit is {MAX_CV_ERROR:.0%})")
    return lines
