"""What a study's repeats, baseline and predictions say about its answer: spread, gain, ties, model error.

A single measurement of a deployment is one draw; the tuner repeats its best deployments and vLLM's defaults
on fresh deploys (``budget.repeat_top``), and these functions turn those runs into the sentences ``advisor
best`` prints: the run-to-run spread of the answer (``advisor.answer``: vLLM's defaults when no searched
deployment beats them), its margin over the defaults — or the defaults' over the search's best — as a range
(worst and best pairing of the runs), and a *tie* wherever two deployments' run ranges overlap. Every line
speaks of the answer's trial.
"""

from __future__ import annotations

from advisor.answer import rank
from advisor.executor_factory import is_simulated
from advisor.proposers.guide import JUDGE_WINDOW, MAX_CV_ERROR  # the guide owns the window and the limit
from advisor.job import Per, Scope, TuningJob
from advisor.objectives import cluster_served, copies, objective_names, served_unit
from db import Trial
from db.queries import Runs
from search_spaces import TrialState


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


def _runs_text(r: Runs) -> str:
    return f"trial {r.trial}, {r.per_used_gpu:,.1f} over {len(r.values)} run(s)"


def _margin(a: Runs, b: Runs) -> str:
    """``a`` against ``b``: mean ratio, its range over the runs' worst and best pairings, and the word."""
    lo, hi = a.low / b.high, a.high / b.low
    word = "a tie (within the run-to-run spread)" if a.ties(b) else ("a gain" if lo > 1 else "a loss")
    once = [f"trial {r.trial}" for r in (a, b) if len(r.values) < 2]
    if once:  # one run has no range: the word rests on one draw of it
        word += f" ({' and '.join(once)} measured once: the spread is not known)"
    return f"{a.mean / b.mean:.2f}× (range {lo:.2f}–{hi:.2f}×): {word}"


def _defaults_line(best: Runs, rival: Runs | None) -> str:
    if best.baseline:
        if rival is None:
            return (f"vLLM's defaults ({_runs_text(best)}) are the best measured deployment: no searched "
                    f"deployment met the SLOs")
        return (f"vLLM's defaults ({_runs_text(best)}) are the best measured deployment: the search's best "
                f"({_runs_text(rival)}) is {_margin(rival, best)}")
    assert rival is not None
    return f"vs vLLM's defaults ({_runs_text(rival)}): trial {best.trial} is {_margin(best, rival)}"


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


def verdict_lines(job: TuningJob, trials: list[Trial]) -> list[str]:
    """The sentences under ``advisor best``, each of the answer's trial: spread, margin over vLLM's defaults
    (or the defaults' over the search), ties, the whole cluster (how many copies to run), the model's error."""
    name = objective_names(job)[0]
    ranked = rank(job, trials)
    by_number = {t.number: t for t in trials}
    lines: list[str] = []
    simulated = is_simulated(job.executor)  # the model (reserving GPUs or not): no spread, no baseline
    best = ranked[0] if ranked else None
    if best is not None:
        vals = " / ".join(f"{v:,.1f}" for v in best.recorded)
        who = "vLLM's defaults, " if best.baseline else ""
        if simulated:
            pass
        elif len(best.values) > 1:
            lines.append(f"run to run: trial {best.trial} ({who}the answer) measured {len(best.values)}× on fresh "
                         f"deploys: {vals} {name} (spread {best.spread:.1%})")
        else:
            lines.append(f"run to run: trial {best.trial} ({who}the answer) measured once ({vals} {name}); "
                         f"no spread known")
        base = next((r for r in ranked if r.baseline), None)
        rival = next((r for r in ranked if not r.baseline), None) if best.baseline else base
        if len(ranked) > 1 and ranked[1] is not rival and best.ties(ranked[1]) and len(best.values) > 1:
            lines.append(f"tie: trial {ranked[1].trial} ({ranked[1].per_used_gpu:,.1f}) is within trial "
                         f"{best.trial}'s run-to-run range ({min(best.recorded):,.1f}–{max(best.recorded):,.1f})")
        if base is None and not simulated:
            bases = {t.number for t in trials if t.baseline}
            missed = [t for t in trials if t.number in bases or t.repeat_of in bases]
            if missed:
                lines.append(f"vs vLLM's defaults: no gain can be stated — no level of the baseline's {len(missed)} "
                             f"run(s) (trial {', '.join(str(t.number) for t in missed)}) met the SLOs")
        if base is not None:
            lines.append(_defaults_line(best, rival))
        if best.gpus:
            other = rank(job, trials, _OTHER[job.objective.per]) if job.objective.scope is Scope.DEPLOYMENT else []
            lines.append(_cluster_line(job, name, best, other))
    err, n = model_error(trials, job)
    if err is not None:
        state = "model turns yield to the sampler" if err > MAX_CV_ERROR and n >= 2 else "model turns go on"
        first = by_number.get(best.trial) if best is not None else None
        own = (first.predicted or {}).get(name) if first is not None else None
        mine = (f"; trial {best.trial} was predicted at {own:,.1f}, measured {(first.objectives or {})[name]:,.1f}"
                if own is not None and best is not None and first is not None else "")
        lines.append(f"performance model: {err:.0%} mean error on the last {n} trial(s), predicted before each ran "
                     f"({state}; the limit is {MAX_CV_ERROR:.0%}){mine}")
    return lines
