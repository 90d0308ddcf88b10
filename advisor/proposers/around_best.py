"""Measure first where the model is not validated: while the guide has yielded (``ModelGuide.yielding``), a
study's next candidates come from TPE fitted on the study's measured trials alone, with no random start-up.

Why: a model that missed vLLM's defaults by more than it is held to ranks candidates by an error larger than the
gaps between them; its picks are then guesses, and the study's own sampler, left to its ``n_startup_trials``
random draws, is guesses too. What the study does know is what it measured. TPE's density of the best measured
trials against the rest puts its draws near the best measured deployment — one or two knobs away, where the
measurements say the better values lie — and away from what measured badly; the valid-space steering
(``ValidSpaceSampler``) keeps each draw a candidate that may run and was not measured. The search is rebuilt for
every proposal from the trials as they stand (a few dozen at most), so it learns from each new measurement and
from every worker's.

vLLM's defaults (the baseline) are asked for without parameters — they need not lie in the space —, so where they
do lie in it their parameters are found once by their configuration and they count as a measured trial too: with
nothing else measured yet, the first search is around the defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY

from advisor.job import TuningJob
from advisor.objectives import objective_names
from advisor.proposers.ledger import Ledger, Row
from advisor.proposers.names import AROUND_BEST
from advisor.proposers.valid_sampler import ValidSpaceSampler
from search_spaces import DeploymentConfig, TrialState, higher_is_better
from search_spaces.valid_space import Params, ValidSpace

__all__ = ["AROUND_BEST", "AroundBest"]


class AroundBest:
    """TPE on a study's measured trials (its ledger), asked afresh for each proposal (``propose``)."""

    def __init__(self, job: TuningJob, valid: ValidSpace) -> None:
        self.job = job
        self.valid = valid
        self._params_of: dict[str, Params | None] = {}  # config key → its parameters in the space (None: not in it)

    def propose(self, ledger: Ledger) -> Params | None:
        """The parameters of the next candidate, or None when nothing is measured yet (nothing to search around)."""
        seen = [ft for r in ledger.measured_rows() if (ft := self._frozen(r)) is not None]
        if not seen:
            return None
        seed = self.job.sampler.seed * 1_000_003 + len(ledger.rows)
        directions = ["maximize" if higher_is_better(n) else "minimize" for n in objective_names(self.job)]
        tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=0, multivariate=True, group=True)
        local = optuna.create_study(directions=directions,
                                    sampler=ValidSpaceSampler(tpe, self.valid, seed))
        local.add_trials(seen)
        for r in ledger.rows:  # what is running elsewhere is taken too
            if r.state is TrialState.RUNNING and r.params and (dists := self._distributions(dict(r.params))):
                local.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING,
                                                          params=dict(r.params), distributions=dists))
        trial = local.ask()
        self.job.space.suggest(trial)
        return dict(trial.params)

    def _frozen(self, r: Row) -> optuna.trial.FrozenTrial | None:
        params = dict(r.params) or self._lookup(r.config)
        if not params or r.told is None:
            return None
        dists = self._distributions(params)
        if dists is None:
            return None
        return optuna.trial.create_trial(params=params, distributions=dists, values=r.told.values,
                                         system_attrs={_CONSTRAINTS_KEY: [float(r.told.violation)]})

    def _distributions(self, params: Params) -> dict[str, CategoricalDistribution] | None:
        """Each parameter's choices, as ``SearchSpace.build`` asks for them on this candidate's path; None for
        parameters of another space (the job's space changed since they were measured)."""
        out: dict[str, CategoricalDistribution] = {}

        def choose(name: str, choices: Sequence[Any]) -> Any:
            out[name] = CategoricalDistribution(list(choices))
            return params[name] if params.get(name) in choices else choices[0]

        self.job.space.build(choose)
        if set(out) != set(params) or any(v not in out[k].choices for k, v in params.items()):
            return None
        return out

    def _lookup(self, cfg: DeploymentConfig | None) -> Params | None:
        """The parameters of a configuration measured without them (the baseline), where it lies in the space."""
        if cfg is None:
            return None
        key = cfg.key()
        if key not in self._params_of:
            self._params_of[key] = next((p for p, c in self.valid.iter_valid_configs() if c == cfg), None)
        return self._params_of[key]
