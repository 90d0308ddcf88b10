"""What a study's repeats, baseline and predictions say about its answer: spread, gain, ties, model error.

A single measurement of a deployment is one draw; the tuner repeats its best deployments and vLLM's defaults
on fresh deploys (``budget.repeat_top``), and these functions turn those runs into the sentences ``advisor
best`` prints: the run-to-run spread of the answer (``advisor.answer``: vLLM's defaults when no searched
deployment beats them), its margin over the defaults — or the defaults' over the search's best — as a range
(worst and best pairing of the runs), and a *tie* wherever two deployments' run ranges overlap. Every line
speaks of the answer's trial.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from advisor.answer import rank
from advisor.executor_factory import is_simulated
from advisor.job import Per, Scope, TuningJob
from advisor.objectives import cluster_served, copies, objective_names, served_unit
from advisor.proposers.guide import JUDGE_WINDOW, MAX_CV_ERROR, REENTRY_TRIALS  # the guide owns these
from advisor.proposers.names import AROUND_BEST, MODEL, MODEL_DECLINED, found_by
from db import Trial
from db.queries import Runs
from search_spaces import TrialState


def _errors(trials: list[Trial], name: str) -> list[tuple[int, float]]:
    """(trial, |predicted / measured − 1|) of the first objective, in trial order, for each complete trial that
    met the SLOs and whose prediction was stored before it ran."""
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.state is TrialState.COMPLETE and t.predicted and t.objectives and (t.violation or 0.0) <= 0:
            p, m = t.predicted.get(name), t.objectives.get(name)
            if p is not None and m:
                out.append((t.number, abs(p / m - 1.0)))
    return out


def model_error(trials: list[Trial], job: TuningJob, since: int = 0) -> tuple[float | None, int]:
    """Mean |predicted / measured − 1| of the first objective over the last ``JUDGE_WINDOW`` trials whose
    prediction was stored before they ran (the guide's out-of-sample error), from trial ``since`` on, and how
    many it covers."""
    recent = [e for n, e in _errors(trials, objective_names(job)[0]) if n >= since][-JUDGE_WINDOW:]
    return (sum(recent) / len(recent) if recent else None), len(recent)


def _runs_text(r: Runs, at: Mapping[int, int]) -> str:
    """``2 runs 22,213.4 (trial 4 @ c=85) / 21,479.5 (trial 6 @ c=86), mean 21,846.4``: every run as recorded,
    with the trial and the load of its own operating point."""
    runs = " / ".join(f"{v:,.1f} (trial {t}{f' @ c={at[t]}' if t in at else ''})"
                      for t, v in zip(r.trials or [r.trial], r.recorded, strict=False))
    if len(r.values) == 1:
        return f"1 run {runs}"
    return f"{len(r.values)} runs {runs}, mean {r.per_used_gpu:,.1f}"


@dataclass(frozen=True)
class Gain:
    """One deployment against vLLM's defaults: the answer against them, or — when the defaults are the answer —
    the search's best against them. The ratio is of the *means* of the runs (each run at its own operating
    point), so the sentence names every run of both sides, not one; its range pairs run against run (worst
    and best pairing), and the word says whether the ranges separate (a gain or a loss) or overlap (a tie).
    ``advisor best`` prints ``text`` and the dashboard's headline shows it."""

    subject: Runs
    defaults: Runs
    metric: str
    #: Trial → the concurrency of its operating point, where known.
    at: Mapping[int, int] = field(default_factory=dict)
    #: The defaults are the answer (``subject`` is then the search's best).
    defaults_best: bool = False

    @property
    def ratio(self) -> float:
        return self.subject.mean / self.defaults.mean

    @property
    def low(self) -> float:
        return self.subject.low / self.defaults.high

    @property
    def high(self) -> float:
        return self.subject.high / self.defaults.low

    @property
    def word(self) -> str:
        a, b = self.subject, self.defaults
        word = "a tie (within the run-to-run spread)" if a.ties(b) else ("a gain" if self.low > 1 else "a loss")
        once = [f"trial {r.trial}" for r in (a, b) if len(r.values) < 2]
        if once:  # one run has no range: the word rests on one draw of it
            word += f" ({' and '.join(once)} measured once: the spread is not known)"
        return word

    def _margin(self) -> str:
        a, b = self.subject, self.defaults
        cluster = (" (per GPU of the whole cluster: the copies that fit, idle GPUs serving nothing)"
                   if a.factor != b.factor else "")
        return (f"{self.ratio:.2f}× the defaults, mean over mean{cluster} — trial {a.trial}'s "
                f"{_runs_text(a, self.at)}; the defaults' {_runs_text(b, self.at)} {self.metric}; "
                f"run against run {self.low:.2f}–{self.high:.2f}×: {self.word}")

    def text(self) -> str:
        if self.defaults_best:
            return (f"vLLM's defaults (trial {self.defaults.trial}) are the best measured deployment: no searched "
                    f"deployment beats every run of theirs; the search's best, trial {self.subject.trial}, is "
                    f"{self._margin()}")
        return f"vs vLLM's defaults (trial {self.defaults.trial}): trial {self.subject.trial} is {self._margin()}"


def gain(ranked: list[Runs], metric: str, at: Mapping[int, int] | None = None) -> Gain | None:
    """``Gain`` of a study's ranked deployments (``advisor.answer.rank``, the answer first); None without a
    baseline that met the SLOs, or with nothing to weigh it against."""
    if not ranked:
        return None
    best = ranked[0]
    base = next((r for r in ranked if r.baseline), None)
    if base is None:
        return None
    if best.baseline:
        rival = next((r for r in ranked if not r.baseline), None)
        return Gain(rival, best, metric, dict(at or {}), True) if rival is not None else None
    return Gain(best, base, metric, dict(at or {}))


#: The other way of comparing deployments, whose best the whole-cluster line weighs the answer against.
_OTHER = {Per.CLUSTER: Per.USED_GPU, Per.USED_GPU: Per.CLUSTER}


def _layout(job: TuningJob, r: Runs) -> str:
    n, total = copies(job, r.gpus or 0), job.cluster.total_gpus
    idle = total - n * (r.gpus or 0)
    return f"{n} × {r.gpus} GPUs" + (f", {idle} idle" if idle else "")


def _cluster_line(job: TuningJob, name: str, best: Runs, other: list[Runs]) -> str:
    """How many copies of the answer to run on the job's cluster, what they serve, and — when the other way of
    comparing (per used GPU, or per cluster) picks another deployment — what that one would serve instead."""
    n, total = copies(job, best.gpus or 0), job.cluster.total_gpus
    idle = total - n * (best.gpus or 0)
    text = f"whole cluster: {n} cop{'y' if n == 1 else 'ies'} of trial {best.trial}'s {best.gpus} GPU(s) fit " \
           f"{total} GPU{'' if total == 1 else 's'}" + (f" ({idle} idle)" if idle else "")
    served = cluster_served(job, name, best)
    unit = served_unit(name)
    if served is None:
        return text
    text += f": {served:,.0f} {unit} for the cluster at the SLOs"
    alt = other[0] if other else None
    alt_served = cluster_served(job, name, alt) if alt is not None and alt.trial != best.trial else None
    if alt is None or alt_served is None or not alt_served:
        return text
    if job.objective.per is Per.CLUSTER:
        return text + (f", {served / alt_served - 1:+.0%} over the best per used GPU (trial {alt.trial}, "
                       f"{_layout(job, alt)}: {alt_served:,.0f} {unit})")
    return text + (f"; per cluster, trial {alt.trial} ({_layout(job, alt)}) would serve {alt_served:,.0f} {unit}, "
                   f"{alt_served / served - 1:+.0%} (objective.per: cluster)")


@dataclass(frozen=True)
class Verdict:
    """The sentences under ``advisor best``, each of the answer's trial, by what they say; the dashboard's
    headline shows ``spread``, ``gain`` and ``cluster`` as they are, and the rest under it."""

    spread: str = ""
    tie: str = ""
    #: Where the defaults met the SLOs at none of their levels: why no gain is stated.
    no_gain: str = ""
    gain: Gain | None = None
    #: The defaults are the answer and no searched deployment met the SLOs.
    defaults_alone: str = ""
    cluster: str = ""
    model: str = ""
    #: Which proposer found the answer (``advisor.proposers.names.found_by``).
    found: str = ""

    def lines(self) -> list[str]:
        return [line for line in (self.spread, self.tie, self.no_gain, self.gain.text() if self.gain else "",
                                  self.defaults_alone, self.cluster, self.model, self.found) if line]


def _guide_phase(trials: list[Trial], name: str) -> tuple[str, int]:
    """Where the model guide stands after the study's last trial, as the trials of its turns tell (the model's
    picks, the turns it declined, the search around the measured best's): ``yielded`` (the last of them is the
    search around the measured best's: the model missed vLLM's defaults and has not re-entered), ``re-entered``
    (it yielded, then its held-out predictions came within the limit), or ``leads``; and the first trial its error
    is judged from (the guide's own window: since it re-entered)."""
    placed = [t for t in sorted(trials, key=lambda t: t.number) if t.proposer in (MODEL, MODEL_DECLINED, AROUND_BEST)]
    around = [t.number for t in placed if t.proposer == AROUND_BEST]
    if not around:
        return "leads", 0
    if placed[-1].proposer == AROUND_BEST:
        return "yielded", 0
    held = [n for n, _ in _errors(trials, name) if n <= around[-1]][-REENTRY_TRIALS:]
    return "re-entered", held[0] if held else 0


def _yield_text(trials: list[Trial], name: str) -> str:
    """The model line's state while the guide has yielded, with the miss on vLLM's defaults that made it yield."""
    base = next((t for t in sorted(trials, key=lambda t: t.number) if t.baseline and t.predicted and t.objectives),
                None)
    p = (base.predicted or {}).get(name) if base is not None else None
    m = (base.objectives or {}).get(name) if base is not None else None
    miss = f" by {abs(p / m - 1.0):.0%}" if p is not None and m else ""
    return (f"model turns yielded to the search around the measured best: the model missed vLLM's defaults{miss}, "
            "more than it is held to, and has not re-entered")


def verdict(job: TuningJob, trials: list[Trial], at: Mapping[int, int] | None = None) -> Verdict:
    """The answer's spread, margin over vLLM's defaults (or the defaults' over the search), ties, the whole
    cluster (how many copies to run) and the model's error; ``at``: each trial's operating point's concurrency."""
    name = objective_names(job)[0]
    at = dict(at or {})
    ranked = rank(job, trials)
    by_number = {t.number: t for t in trials}
    out: dict[str, Any] = {}
    simulated = is_simulated(job.executor)  # the model (reserving GPUs or not): no spread, no baseline
    best = ranked[0] if ranked else None
    if best is not None:
        vals = " / ".join(f"{v:,.1f}" + (f" @ c={at[t]}" if t in at else "")
                          for t, v in zip(best.trials or [best.trial], best.recorded, strict=False))
        who = "vLLM's defaults, " if best.baseline else ""
        if simulated:
            pass
        elif len(best.values) > 1:
            out["spread"] = (f"run to run: trial {best.trial} ({who}the answer) measured {len(best.values)}× on "
                             f"fresh deploys: {vals} {name} (spread {best.spread:.1%})")
        else:
            out["spread"] = (f"run to run: trial {best.trial} ({who}the answer) measured once ({vals} {name}); "
                             f"no spread known")
        base = next((r for r in ranked if r.baseline), None)
        rival = next((r for r in ranked if not r.baseline), None) if best.baseline else base
        if len(ranked) > 1 and ranked[1] is not rival and best.ties(ranked[1]) and len(best.values) > 1:
            out["tie"] = (f"tie: trial {ranked[1].trial} ({ranked[1].per_used_gpu:,.1f}) is within trial "
                          f"{best.trial}'s run-to-run range ({min(best.recorded):,.1f}–{max(best.recorded):,.1f})")
        if base is None and not simulated:
            bases = {t.number for t in trials if t.baseline}
            missed = [t for t in trials if t.number in bases or t.repeat_of in bases]
            if missed:
                out["no_gain"] = (f"vs vLLM's defaults: no gain can be stated — no level of the baseline's "
                                  f"{len(missed)} run(s) (trial {', '.join(str(t.number) for t in missed)}) met the "
                                  "SLOs")
        out["gain"] = gain(ranked, name, at)
        if out["gain"] is None and best.baseline:
            out["defaults_alone"] = (f"vLLM's defaults (trial {best.trial}) are the best measured deployment: no "
                                     "searched deployment met the SLOs")
        if best.gpus:
            other = rank(job, trials, _OTHER[job.objective.per]) if job.objective.scope is Scope.DEPLOYMENT else []
            out["cluster"] = _cluster_line(job, name, best, other)
    phase, since = _guide_phase(trials, name)
    err, n = model_error(trials, job, since)
    if err is not None:
        state = "model turns yield to the sampler" if err > MAX_CV_ERROR and n >= 2 else "model turns go on"
        if phase == "yielded":
            state = _yield_text(trials, name)
        elif phase == "re-entered":
            state += f" (the model re-entered after the search around the measured best; judged from trial {since})"
        first = by_number.get(best.trial) if best is not None else None
        own = (first.predicted or {}).get(name) if first is not None else None
        mine = (f"; trial {best.trial} was predicted at {own:,.1f}, measured {(first.objectives or {})[name]:,.1f}"
                if own is not None and best is not None and first is not None else "")
        out["model"] = (f"performance model: {err:.0%} mean error on the last {n} trial(s), predicted before each "
                        f"ran ({state}; the limit is {MAX_CV_ERROR:.0%}){mine}")
    if best is not None and (found := by_number.get(best.trial)) is not None:
        out["found"] = found_by(found.proposer)
    return Verdict(**out)


def verdict_lines(job: TuningJob, trials: list[Trial], at: Mapping[int, int] | None = None) -> list[str]:
    """The sentences under ``advisor best`` (``verdict``), in order."""
    return verdict(job, trials, at).lines()
