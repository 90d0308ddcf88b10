"""The model guide inside a study: who gets a turn (``ModelTurns``, a ``Proposer``): the model's pick, or — while the
guide yields — the search around the measured best's; and the guide a continued study resumes with, re-fitted to
what it measured (``resume_guide``). Everything is read from the study's ledger (our rows), so the turns and the
measured trials are the study's, whichever worker made them."""

from __future__ import annotations

from collections.abc import Callable

import optuna

import db
from advisor.executor_factory import model_params
from advisor.job import SamplerKind, TuningJob
from advisor.proposers.around_best import AroundBest
from advisor.proposers.guide import MAX_FIT_TRIALS, PROPOSER_ATTR, ModelGuide
from advisor.proposers.ledger import Ledger
from advisor.proposers.names import AROUND_BEST, MODEL, MODEL_DECLINED
from advisor.proposers.protocol import Proposal
from executors.perf import PerfParams
from search_spaces import TrialState


def make_guide(job: TuningJob, start: PerfParams) -> ModelGuide | None:
    """A guide for the default sampler (TPE with ``sampler.guide``); None for the baselines."""
    if job.sampler.kind is not SamplerKind.TPE or not job.sampler.guide or job.sampler.guided_trials == 0:
        return None
    return ModelGuide(job, start)


class ModelTurns:
    """The guide's turns: on a model turn the model's pick (``model``), or the sampler's draw where the model
    declines (``model-declined``: it predicts nothing better than the measured best; the turn still counts); while
    the guide yields, the search around the measured best (where the space can be listed and something is
    measured). Passes otherwise."""

    name = MODEL

    def __init__(self, guide: ModelGuide) -> None:
        self.guide = guide
        self._around: AroundBest | None | bool = False  # made the first time the guide yields

    def propose(self, ledger: Ledger) -> Proposal | None:
        guide = self.guide
        guide.turns = ledger.turns  # the study's turns, not this worker's (several workers share a study)
        if guide.yielding:
            around = self._around_best()
            params = around.propose(ledger) if around is not None else None
            return Proposal(params, AROUND_BEST) if params is not None else None
        if not guide.wants_turn(ledger.budget_used):
            return None
        params = guide.propose(ledger.config_keys, ledger.best_value)
        return Proposal(params, MODEL) if params is not None else Proposal(None, MODEL_DECLINED)

    def _around_best(self) -> AroundBest | None:
        if self._around is False:
            valid = self.guide.job.valid_space()
            self._around = AroundBest(self.guide.job, valid) if valid is not None else None
        assert not isinstance(self._around, bool)
        return self._around


def enqueue_turn(guide: ModelGuide | None, study: optuna.Study, executed: int,
                 taken: Callable[[], set[str]], best_measured: float | None = None) -> bool | None:
    """For a study driven outside the tune loop (``benchmarks/search_efficiency.py``): on a model turn, enqueue the
    model's pick so that the next ``study.ask()`` returns it (True), None where the model declined, False when it
    was not a model turn."""
    if guide is None or guide.yielding or not guide.wants_turn(executed):
        return False
    params = guide.propose(taken(), best_measured)
    if params is None:
        return None
    study.enqueue_trial(params, user_attrs={PROPOSER_ATTR: MODEL})
    return True


def resume_guide(job: TuningJob, database: db.Database, name: str,
                 start: PerfParams | None = None) -> ModelGuide | None:
    """The model guide of a guided study, re-fitted to what the study has measured so far (a continued study
    picks up its calibration and its count of model turns). ``start``: what the model starts from (a hardware
    profile; default the job's parameter file or the GPU kind's defaults)."""
    guide = make_guide(job, start if start is not None else model_params(job))
    if guide is None:
        return None
    ledger = Ledger.read(job, database, name)
    guide.turns = ledger.turns
    done = [r.number for r in ledger.measured_rows() if r.state is TrialState.COMPLETE]
    for number in done[-MAX_FIT_TRIALS:]:
        t = db.queries.get_trial(database, name, number)
        if t is not None and t.config is not None:
            guide.observe(t.config, list(t.measurements), refit=False)
            if t.predicted and t.objectives and (t.violation or 0.0) <= 0:
                guide.judge(t.predicted, t.objectives, baseline=t.baseline and t.repeat_of is None)
    guide.refit()
    return guide
