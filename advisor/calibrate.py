"""Fit the performance model's efficiency parameters to the measured trials of a study.

Peers stop at "the model predicts X"; measured trials are what tells us how wrong X is on *this* hardware and
engine build. ``calibrate`` takes every COMPLETE trial of a study whose levels were measured by
``vllm bench serve``, predicts the same deployments at the same load levels with the performance model, and
solves a bounded non-linear least-squares problem (``scipy.optimize.least_squares``, trust-region reflective)
for the parameters in ``PerfParams``:

    minimise  Σ_levels Σ_metrics  log(predicted / measured)²  +  λ² Σ_params ((θ − θ₀) / (hi − lo))²

Log ratios make a 20% miss cost the same on a 50 ms TTFT as on a 20,000 tok/s throughput. The ridge term
(λ, in units of each parameter's allowed range) keeps the parameters the data cannot see at their documented
defaults instead of letting them wander to a bound. Only parameters that move some prediction at all are
fitted (a finite-difference sensitivity check on the training set); the others are reported as untouched.

Honesty: the error reported as "held out" is cross-validated by trial — each trial's levels are predicted by
parameters fitted without that trial (leave-one-trial-out up to 10 trials, else k folds) — so it is measured on
trials the fit never saw. The parameters written out are then fitted on every trial.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

import db
from advisor.errors import BadInput
from advisor.job import TuningJob
from db import queries
from executors import place
from executors.measuring.bench_result import first_wave_left_out
from executors.perf import CALIBRATABLE, Batch, PerfParams, default_params, predict
from search_spaces import DeploymentConfig, Measurement, ModelProfile, TrialState

#: What is fitted: the metrics vllm bench serve measures and the model predicts, per load level — throughput, and
#: P50 TTFT and TPOT where the level's stream reached the client as it was made, else P50 E2E latency in their place
#: (``fitted_values``).
METRICS: tuple[str, ...] = ("throughput_per_gpu", "p50_ttft_ms", "p50_tpot_ms", "p50_e2el_ms")
#: A level's values the fit compares, by how its tokens were delivered.
SERVED_METRICS: tuple[str, ...] = ("throughput_per_gpu", "p50_ttft_ms", "p50_tpot_ms")
BURSTY_METRICS: tuple[str, ...] = ("throughput_per_gpu", "p50_e2el_ms")


def metric_headers() -> list[str]:
    """``METRICS`` as the error tables' column headers: each metric's short label without its percentile (every
    latency fitted is a P50) and unit (the cells are relative errors). With the long names a table of four metrics
    folded its row labels on an 80-column terminal ("calibrat" / "ed")."""
    from search_spaces.metrics import metric

    return [(m.short.removeprefix("P50 ").removesuffix(" (ms)") if (m := metric(k)) else k) for k in METRICS]
#: Ridge weight towards the defaults, in units of a parameter's range.
RIDGE = 0.05
#: A parameter is fitted only if moving it by 5% of its range moves some prediction by at least this (log).
MIN_SENSITIVITY = 1e-3
#: Finite-difference step of the Jacobian, relative to each scaled parameter. scipy's default (~1e-8) lands
#: inside the model's flat steps (whole batches, whole waves of requests) and sees a zero gradient.
DIFF_STEP = 1e-2


@dataclass(frozen=True)
class Sample:
    """One measured trial: its deployment, what it ran on and its measured levels (concurrency → metric → value)."""

    study: str
    number: int
    config: DeploymentConfig
    job: TuningJob
    measured: dict[int, dict[str, float]]
    #: How each level was sent, for a fit that predicts levels as sent (``Problem(as_sent=True)``): its requests
    #: (default: the workload's count), and the levels whose latencies left the first wave out (the bench parser's
    #: rule: ``executors.measuring.bench_result.first_wave``).
    requests: dict[int, int] = field(default_factory=dict)
    first_wave_out: frozenset[int] = frozenset()

    @property
    def key(self) -> str:
        return f"{self.study}#{self.number}"


@dataclass
class Errors:
    """Median |predicted / measured − 1| per metric over a set of levels, and over all of them; and the root
    mean square of log(predicted / measured) over every value — what the fit minimises (without its ridge
    term), so in sample it cannot rise, while the pooled median can: on real CPU levels every metric's
    median fell (throughput 0.52 → 0.49, TTFT 0.66 → 0.50, TPOT 928 → 32) and the pooled one rose 0.71 → 0.95."""

    per_metric: dict[str, float | None]
    overall: float | None
    levels: int
    rms_log: float | None = None

    def row(self) -> list[float | None]:
        return [self.overall, *(self.per_metric[m] for m in METRICS)]

    @classmethod
    def of(cls, ratios: Sequence[tuple[str, float]], levels: int) -> Errors:
        per: dict[str, list[float]] = {m: [] for m in METRICS}
        for k, lr in ratios:
            per[k].append(abs(math.exp(lr) - 1.0))
        every = [x for v in per.values() for x in v]
        rms = math.sqrt(sum(lr * lr for _, lr in ratios) / len(ratios)) if ratios else None
        return cls({k: statistics.median(v) if v else None for k, v in per.items()},
                   statistics.median(every) if every else None, levels, rms)


@dataclass
class Calibration:
    studies: list[str]
    gpu: str
    params: PerfParams
    fitted: list[str]
    frozen: list[str]
    trials: list[str]
    folds: int
    #: "in_sample": every trial, fitted on every trial; "held_out": cross-validated (fit never saw the trial).
    before: dict[str, Errors] = field(default_factory=dict)
    after: dict[str, Errors] = field(default_factory=dict)
    changes: dict[str, tuple[float, float]] = field(default_factory=dict)  # name → (default, fitted)
    #: Imported points of the batches asked for that the model cannot describe, each with the reason.
    left_out: list[str] = field(default_factory=list)
    ridge: float = RIDGE  # the fit's pull towards its start (``fit``)

    def to_dict(self) -> dict[str, object]:
        def err(e: Errors) -> dict[str, object]:
            return {"overall": e.overall, "levels": e.levels, "rms_log": e.rms_log, **e.per_metric}

        return {
            "studies": self.studies, "gpu": self.gpu, "metrics": list(METRICS), "ridge": self.ridge,
            "fitted": self.fitted, "frozen": self.frozen, "trials": self.trials, "folds": self.folds,
            "error_before": {k: err(v) for k, v in self.before.items()},
            "error_after": {k: err(v) for k, v in self.after.items()},
            "changes": {k: {"default": a, "fitted": b} for k, (a, b) in self.changes.items()},
            "left_out": self.left_out,
            "params": self.params.model_dump(),
        }


# ----------------------------------------------------------------------------------------------- data
#: The trial states whose levels the fit uses.
MEASURED_STATES = (TrialState.COMPLETE, TrialState.INTERRUPTED)


def fitted_values(m: Measurement) -> dict[str, float]:
    """The values of one level that the fit compares, where the level has them: throughput, P50 TTFT and P50 TPOT
    (``SERVED_METRICS``) — or, where the level's tokens reached the client in bursts (the flag ``bursty-delivery``),
    throughput and P50 E2E latency (``BURSTY_METRICS``). Rate levels are left out: the fit compares the model at the
    level's concurrency, which a rate level does not set.

    Why bursts change what is compared: a bursty level's TTFT and TPOT split a request's time where its lumps
    arrived, not where the server made its tokens (docs/measurement.md); its E2E latency and throughput still hold.
    Fitted as they were, one such level decides the profile: on vLLM's CPU build (``tests/test_profile_real``)
    the 1-layer decode probe at c=1 read P50 TPOT 0.022 ms (every token of a request in one lump) beside 4.1-6.7 ms
    on the other decode probes. Its log ratio against the default model's 10 ms step was 6.1 where every other
    value's was at most 2.1, and the least squares drove ``step_latency_s``, ``cpu_step_s`` and
    ``eager_layer_latency_s`` to their lower bound, 0: the profiled model then predicted the real study's level at
    1.75x its throughput. Refitted
    with E2E latency in that level's place, the same probes gave those terms 1.3 ms each and the study's level
    1.23x. On GPUs no level has been flagged (at most 0.02% of gaps in bursts over the H200
    knee study's 22 levels, docs/measurement.md), so a fit there compares what it compared before."""
    if not m.completed or m.request_rate is not None:
        return {}
    keys = BURSTY_METRICS if "bursty-delivery" in m.flags else SERVED_METRICS
    return {k: float(v) for k in keys if (v := getattr(m, k)) is not None and v > 0}


def measured_samples(database: db.Database, study: str, job: TuningJob,
                     sources: Sequence[str] = ("measured",)) -> list[Sample]:
    """COMPLETE trials, and trials stopped mid-search (INTERRUPTED: a level measured is a level measured), whose
    levels come from ``sources`` — by default measured by ``vllm bench serve``, never the model's own predictions
    (a test may pass ``("simulated",)`` to fit a known ground truth)."""
    by_trial: dict[int, dict[int, dict[str, float]]] = {}
    sent: dict[int, dict[int, int]] = {}
    wave_out: dict[int, set[int]] = {}
    for lv in queries.measurements(database, study, states=MEASURED_STATES):
        m = lv.measurement
        if m.source not in sources:
            continue
        if vals := fitted_values(m):
            by_trial.setdefault(lv.trial_number, {})[m.concurrency] = vals
            sent.setdefault(lv.trial_number, {})[m.concurrency] = m.completed or 0
            if first_wave_left_out(m):
                wave_out.setdefault(lv.trial_number, set()).add(m.concurrency)
    configs = {t.number: t.config for t in queries.list_trials(database, study, states=MEASURED_STATES)}
    return [Sample(study, n, cfg, job, lv, sent.get(n, {}), frozenset(wave_out.get(n, ())))
            for n, lv in sorted(by_trial.items()) if (cfg := configs.get(n))]


def folds_of(samples: Sequence[Sample], k: int | None, seed: int) -> list[list[Sample]]:
    """Leave-one-trial-out up to 10 trials (or when ``k`` ≥ the trials), else ``k`` (default 5) seeded folds."""
    n = len(samples)
    k = n if (k is None and n <= 10) else min(k or 5, n)
    order = list(samples)
    random.Random(seed).shuffle(order)
    return [order[i::k] for i in range(k)]


# ---------------------------------------------------------------------------------------------- model
def _ratios(s: Sample, pred: dict[int, Any]) -> list[tuple[str, float]]:
    """(metric, log(predicted / measured)) of each measured value of ``s``, given its predicted levels by
    concurrency (Measurements, or the batch model's lazy levels)."""
    out: list[tuple[str, float]] = []
    for c, vals in s.measured.items():
        pm = pred.get(c)
        for k, v in vals.items():
            p = getattr(pm, k) if pm is not None else None
            # An unpredictable level counts as a 10x miss: the fit must not hide behind None.
            out.append((k, math.log(p / v) if p is not None and p > 0 else math.log(10.0)))
    return out


class Problem:
    """Log ratios predicted / measured of some samples as a function of the parameters: each level predicted by the
    steady closed-loop model, or (``as_sent``) as the benchmark sent it, step by step (``executors.perf.burst``:
    slower, and what a short lockstep level — a profile's probe — measures)."""

    def __init__(self, samples: Sequence[Sample], as_sent: bool = False) -> None:
        self.samples = list(samples)
        self.as_sent = as_sent
        self.topos = [place(s.config, s.job.cluster) for s in self.samples]
        self.models: list[ModelProfile] = [s.job.model_profile() for s in self.samples]
        self.levels = sum(len(s.measured) for s in self.samples)
        # the samples of each job, predicted together by the batch model (a study's samples share one job)
        by_job: dict[int, list[int]] = {}
        for i, s in enumerate(self.samples):
            by_job.setdefault(id(s.job), []).append(i)
        self._groups = [(idx, [(k, float(c)) for k, i in enumerate(idx) for c in self.samples[i].measured])
                        for idx in by_job.values()]

    def log_ratios(self, params: PerfParams) -> list[tuple[str, float]]:
        """(metric, log(predicted / measured)) for every measured value, in the samples' order: each job's samples
        predicted at once (``executors.perf.levels.Batch``) — a re-fit evaluates this hundreds of times, and one by
        one it was most of a guided study's tuner time."""
        if self.as_sent:
            return [r for i in range(len(self.samples)) for r in self.sample_log_ratios(i, params)]
        pred: list[dict[int, Any]] = [{} for _ in self.samples]
        for idx, asked in self._groups:
            first = self.samples[idx[0]]
            batch = Batch([self.topos[i] for i in idx], self.models[idx[0]], first.job.workload, params)
            for (k, c), level in zip(asked, batch.predict(asked, lazy=True), strict=True):
                pred[idx[k]][int(c)] = level
        return [r for s, p in zip(self.samples, pred, strict=True) for r in _ratios(s, p)]

    def sample_log_ratios(self, i: int, params: PerfParams) -> list[tuple[str, float]]:
        """``log_ratios`` of the i-th sample alone."""
        return _ratios(self.samples[i], self._predicted(i, params))

    def _predicted(self, i: int, params: PerfParams) -> dict[int, Measurement]:
        """The i-th sample's levels predicted one by one, at the concurrencies measured (knee-search levels differ
        from trial to trial and from the job's fixed levels; a job may have none)."""
        s = self.samples[i]
        loads = sorted(s.measured)
        if self.as_sent:
            from executors.perf.burst import predict_as_sent

            got = predict_as_sent(self.topos[i], self.models[i], s.job.workload, params, loads,
                                  [s.requests.get(c) or s.job.workload.num_prompts(c) for c in loads],
                                  [c in s.first_wave_out for c in loads])
            return dict(zip(loads, got, strict=True))
        return {m.concurrency: m for m in predict(self.topos[i], self.models[i], s.job.workload, params, loads)}

    def errors(self, params: PerfParams) -> Errors:
        return Errors.of(self.log_ratios(params), self.levels)


def _nudged(theta0: PerfParams, name: str) -> PerfParams:
    """``theta0`` with ``name`` moved by 5% of its range (down when up would leave it)."""
    lo, hi = dict(zip(CALIBRATABLE, PerfParams.bounds(), strict=True))[name]
    x, step = getattr(theta0, name), 0.05 * (hi - lo)
    return PerfParams.from_vector([x + step if x + step <= hi else x - step], base=theta0, names=[name])


class SensitivityMemo:
    """What each sample's log ratios do when one parameter of a fixed start is nudged, kept across calls.

    The guide checks sensitivity after every trial, from the same start, on a window of samples it has mostly
    checked before; with this memo only a new sample's nudged predictions are computed. The answer is the
    same as without it: a parameter's largest change over the window is the largest of its per-sample ones."""

    def __init__(self, theta0: PerfParams) -> None:
        self.theta0 = theta0
        self._per_sample: dict[int, tuple[Sample, dict[str, float]]] = {}

    def changes(self, problem: Problem, i: int, names: Sequence[str]) -> dict[str, float]:
        """Largest |Δ log ratio| of the i-th sample of ``problem`` for each nudged parameter of ``names``."""
        s = problem.samples[i]
        hit = self._per_sample.get(id(s))
        if hit is None or hit[0] is not s:
            hit = self._per_sample[id(s)] = (s, {})
        known = hit[1]
        missing = [n for n in names if n not in known]
        if missing:
            base = np.array([lr for _, lr in problem.sample_log_ratios(i, self.theta0)])
            for n in missing:
                nudged = np.array([lr for _, lr in problem.sample_log_ratios(i, _nudged(self.theta0, n))])
                known[n] = float(np.max(np.abs(nudged - base)))
        return {n: known[n] for n in names}


def sensitive(problem: Problem, theta0: PerfParams, candidates: Sequence[str],
              memo: SensitivityMemo | None = None) -> list[str]:
    """The parameters that move some prediction of ``problem`` when nudged by 5% of their range (``memo``: the
    per-sample answers of earlier calls from the same ``theta0``)."""
    if memo is None or memo.theta0 is not theta0:
        memo = SensitivityMemo(theta0)
    per_sample = [memo.changes(problem, i, candidates) for i in range(len(problem.samples))]
    return [n for n in candidates if max(ch[n] for ch in per_sample) >= MIN_SENSITIVITY]


def fit(problem: Problem, theta0: PerfParams, names: Sequence[str], ridge: float = RIDGE) -> PerfParams:
    """Bounded least squares on the log ratios plus the ridge towards ``theta0`` (``ridge`` per unit of a
    parameter's range), each parameter scaled to [0, 1] of its documented range."""
    from scipy.optimize import least_squares  # heavy import, only for this command

    if not names:
        return theta0
    bounds = dict(zip(CALIBRATABLE, PerfParams.bounds(), strict=True))
    lo = np.array([bounds[n][0] for n in names])
    span = np.array([bounds[n][1] - bounds[n][0] for n in names])
    z0 = (np.array([getattr(theta0, n) for n in names]) - lo) / span

    def params_at(z: np.ndarray) -> PerfParams:
        return PerfParams.from_vector(list(lo + np.clip(z, 0, 1) * span), base=theta0, names=list(names))

    def residuals(z: np.ndarray) -> np.ndarray:
        return np.concatenate([[lr for _, lr in problem.log_ratios(params_at(z))], ridge * (z - z0)])

    # One BLAS thread: the fit's matrices are a few hundred rows by tens of columns, where OpenBLAS's threads
    # spin more than they compute (a perturbed-truth guided study: 65.5 → 43.9 CPU s, wall 43.5 → 43.9 s).
    with threadpool_limits(limits=1, user_api="blas"):
        sol = least_squares(residuals, z0, bounds=(0.0, 1.0), x_scale="jac", max_nfev=200 * (len(names) + 1),
                            diff_step=DIFF_STEP)
    return params_at(sol.x)


def calibrate(samples: Sequence[Sample], *, folds: int | None = None, seed: int = 0,
              start: PerfParams | None = None, names: Sequence[str] | None = None,
              as_sent: bool = False, ridge: float = RIDGE) -> Calibration:
    """Fit on every sample; cross-validate the same procedure (sensitivity check included) by trial.
    ``as_sent``: levels predicted as the benchmark sent them (``Problem``); ``ridge``: the pull towards ``start``
    (``fit``)."""
    unknown = [n for n in names or () if n not in CALIBRATABLE]
    if unknown:
        raise BadInput(f"--params: unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(CALIBRATABLE)}")
    if not samples:
        raise BadInput("no complete trial has measured levels to calibrate against (simulated trials are "
                       "predictions, not measurements)")
    gpus = sorted({s.job.cluster.gpu for s in samples})
    if len(gpus) > 1:
        raise BadInput(f"studies: measured on different GPU kinds ({', '.join(gpus)}); calibrate one kind at a time")
    theta0 = start or default_params(gpus[0])
    candidates = list(names or CALIBRATABLE)
    every = Problem(samples, as_sent)
    memo = SensitivityMemo(theta0)  # every fold checks the same samples from the same start
    fitted = sensitive(every, theta0, candidates, memo)
    params = fit(every, theta0, fitted, ridge)
    cal = Calibration(
        studies=sorted({s.study for s in samples}), gpu=gpus[0], params=params, fitted=fitted,
        frozen=[n for n in CALIBRATABLE if n not in fitted], trials=[s.key for s in samples], folds=0,
        changes={n: (getattr(theta0, n), getattr(params, n)) for n in fitted}, ridge=ridge,
    )
    cal.before["in_sample"] = cal.before["held_out"] = every.errors(theta0)
    cal.after["in_sample"] = every.errors(params)
    if len(samples) >= 2:
        parts = folds_of(samples, folds, seed)
        ratios: list[tuple[str, float]] = []
        for i, test in enumerate(parts):
            train = Problem([s for j, part in enumerate(parts) if j != i for s in part], as_sent)
            p = fit(train, theta0, sensitive(train, theta0, candidates, memo), ridge)
            ratios += Problem(test, as_sent).log_ratios(p)
        cal.folds = len(parts)
        cal.after["held_out"] = Errors.of(ratios, every.levels)
    else:
        del cal.before["held_out"]
    return cal
