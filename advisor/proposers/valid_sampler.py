"""The study's sampler, made to see the valid space: no trial is spent on an invalid candidate or a repeat.

Optuna's samplers know nothing of our validity rules, so on a space where most candidates cannot run (a
large model on few GPUs) they keep proposing them, and once they have narrowed onto the few valid
deployments they keep proposing those again. ``ValidSpaceSampler`` wraps any of them and steers each
parameter as it is drawn: a value that leaves no valid, unmeasured candidate below it is replaced by the
nearest choice (by position in the job's list) that does. The sampler's preferences survive wherever they
are possible; the trial that comes out is always a candidate that may run and has not been measured (or is
being measured) in this study. Parameters drawn jointly (multivariate TPE, NSGA-II, GP) are steered in the
order ``SearchSpace.build`` asks for them, so every prefix stays completable.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Container, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from advisor.proposers.ledger import Ledger
from advisor.proposers.protocol import Exhausted
from search_spaces.valid_space import Params, ValidSpace, params_key


class _Stop(Exception):
    """The walk reached a parameter the joint proposal does not hold."""


def trial_key(t: FrozenTrial) -> str | None:
    """The ``params_key`` of a trial's candidate: its parameters, or the fixed ones an enqueued trial waits with."""
    params = t.params or t.system_attrs.get("fixed_params")
    return params_key(params) if params else None


def taken_keys(trials: Sequence[FrozenTrial], but: int | None = None) -> set[str]:
    """Candidates a study holds: measured, running, waiting, or told from a measurement. A trial told FAIL
    was never judged (the environment failed it, or its worker died): it may be proposed again."""
    out: set[str] = set()
    for t in trials:
        if t.number != but and t.state is not TrialState.FAIL and (k := trial_key(t)) is not None:
            out.add(k)
    return out


class _OneRead:
    """The study as the wrapped sampler sees it while one trial is drawn: its trials read once.

    Optuna 5's TPE keeps the constant liar on (right for several workers) and then reads every trial from
    storage once per parameter group — nine reads per trial on our space, most of the tuner's time at a
    thousand trials. Within one draw the trials do not change in any way the sampler could use."""

    def __init__(self, study: optuna.Study, trials: list[FrozenTrial]) -> None:
        self._study = study
        self._trials = trials

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        trials = self._trials if states is None else [t for t in self._trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states)


class ValidSpaceSampler(optuna.samplers.BaseSampler):
    def __init__(self, base: optuna.samplers.BaseSampler, space: ValidSpace, seed: int = 0) -> None:
        self.base = base
        self.space = space
        self._seed = seed
        self._taken: set[str] = set()
        self._view: _OneRead | None = None
        #: Proposals steered away from an invalid or measured choice (for the tuner's report and tests).
        self.steered = 0

    # ------------------------------------------------------------------------------ delegation
    def reseed_rng(self) -> None:
        self.base.reseed_rng()

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        trials = study.get_trials(deepcopy=False)
        self._taken = taken_keys(trials, but=trial.number)
        self._view = _OneRead(study, trials)
        self.base.before_trial(study, trial)

    def _seen(self, study: optuna.Study) -> Any:
        return self._view if self._view is not None and self._view._study is study else study

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(self._seen(study), trial)

    # ------------------------------------------------------------------------------ steering
    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        proposal = self.base.sample_relative(self._seen(study), trial, search_space)
        if not proposal:
            return proposal
        path: Params = dict(trial.params)
        steered: dict[str, Any] = {}

        def choose(name: str, choices: Sequence[Any]) -> Any:
            if name in path:
                return path[name]
            if name in proposal:
                value = steered[name] = self._steer(path, name, list(choices), proposal[name], trial.number)
            elif len(choices) == 1:
                value = choices[0]
            else:
                raise _Stop
            path[name] = value
            return value

        try:
            self.space.space.build(choose)
        except _Stop:
            pass  # the rest is drawn one by one (sample_independent), steered there
        return steered

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        value = self.base.sample_independent(self._seen(study), trial, param_name, param_distribution)
        if not isinstance(param_distribution, CategoricalDistribution):
            return value
        return self._steer(dict(trial.params), param_name, list(param_distribution.choices), value, trial.number)

    def _steer(self, prefix: Params, name: str, choices: list[Any], value: Any, number: int) -> Any:
        """``value`` if a valid, unmeasured candidate follows from it; else the nearest choice that has one."""
        if self.space.feasible({**prefix, name: value}, self._taken):
            return value
        ok = [i for i, c in enumerate(choices) if self.space.feasible({**prefix, name: c}, self._taken)]
        if not ok:
            return value  # nothing left below this prefix (the space is exhausted, or another worker raced)
        self.steered += 1
        at = next((i for i, c in enumerate(choices) if c == value and type(c) is type(value)), 0)
        best = min(abs(i - at) for i in ok)
        return choices[random.Random(f"{self._seed}:{number}:{name}").choice([i for i in ok if abs(i - at) == best])]


class SpaceUsedUp:
    """The chain's guard (a ``Proposer`` that never proposes): ``Exhausted`` once every valid candidate of an
    enumerable space is measured or being measured; passes otherwise."""

    name = "space-used-up"

    def __init__(self, valid: ValidSpace) -> None:
        self.valid = valid

    def propose(self, ledger: Ledger) -> None:
        if not self.valid.feasible({}, ledger.taken):
            raise Exhausted(f"space exhausted: each of its {self.valid.valid:,} valid candidates is measured (or "
                            "being measured by another worker)")
        return None
