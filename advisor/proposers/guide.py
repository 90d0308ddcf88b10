"""Model-guided proposals: the performance model, re-fitted to the study's own measured trials, picks
every other candidate; TPE picks the rest and learns from both.

Why: blind TPE needed 0.26–0.51 of a shuffled grid's trials to come within 2% of the optimum, because it
locks onto the first moderate deployment it finds (aggregated, ≈0.58 of the optimum on the Qwen3 preset)
while every near-optimal candidate is disaggregated (docs/benchmarks.md). The project already owns a model
that ranks every candidate in microseconds, and ``advisor calibrate`` already fits that model to measured
levels. A guided study uses both, as Ax seeds its Bayesian optimisation with a prior and as operators do by
hand (start from what the roofline says, correct with what the run says):

1. The first model turns measure the model's best candidate of each deployment mode (aggregated, then
   disaggregated), so neither branch is left unexplored.
2. After each measured trial the model's efficiency parameters are re-fitted to every measured level so far
   (``advisor.calibrate.fit``: bounded least squares on log(predicted / measured), ridge towards the start).
3. From then on turns alternate: TPE proposes, then the re-fitted model proposes its best candidate not yet
   measured or running. TPE keeps the search honest where the model is structurally wrong (a wrong model
   can only cost every other trial); the model keeps TPE from locking in where it is right.
4. The model earns its turns. Every executed trial stores what the model predicted for it *before* it ran
   (``predicted``); the relative error of those predictions against the measured values is the model's
   out-of-sample ("prequential", forward-chaining cross-validated) error on this study. While its mean over
   the last ``JUDGE_WINDOW`` trials exceeds ``MAX_CV_ERROR`` (30%), model turns go to the sampler, and resume
   once re-fits predict well again. And a model pick it predicts worse than the best measured value is no
   pick at all: the turn goes to the sampler (on a real GPU the first two model picks were the study's worst).
5. Measure first where the model is not validated. A real study measures vLLM's defaults first, predicted
   before they ran. When that prediction misses by more than the error the model is held to (``bound``,
   ``MAX_CV_ERROR`` unless the study says otherwise), the guide yields at once (``yielding``): no model turn,
   and every next trial comes from a search around the measured best (``advisor.proposers.around_best``: TPE on
   the measured trials alone). The re-fit goes on with each measurement, and each trial is still predicted
   before it runs; once the last ``REENTRY_TRIALS`` of those held-out predictions are each within the bound,
   the model re-enters, judged from then on by those predictions and the ones after. Why not wait for the
   window of point 4: a model that misses the one deployment every user starts from picks the next trials from
   the same miss, and on a real GPU each of them costs minutes.

Candidates are ranked by the model's *knee* (the same knee search the executors run, on the model), so the
model is asked the question a trial answers.

Ranking is exhaustive on spaces of up to ``EXHAUSTIVE_MAX`` valid candidates; larger spaces are ranked on a
seeded sample drawn shape by shape (``advisor.proposers.shape_sample``: every shape is in it) plus hill-climbing
(one knob at a time) from the best candidate of each of the best few shapes, so on the 91,008-candidate GB300 space a
first model turn costs about half a CPU second and a later one ~0.15 s. In Pareto mode a turn maximises a random
Chebyshev weighting of the two predicted objectives (ParEGO), so successive turns spread along the front.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from advisor.calibrate import Problem, Sample, SensitivityMemo, fit, fitted_values, sensitive
from advisor.job import ObjectiveMode, TuningJob
from advisor.objectives import Outcome
from advisor.proposers.model_rank import predicted_outcomes
from advisor.proposers.shape_sample import best_of_each_shape, params_shape, shape_of, stratified
from executors.measuring.loop import MeasurePlan
from executors.perf import CALIBRATABLE, PerfParams, memo
from search_spaces import DeploymentConfig, Measurement, check

#: Spaces with at most this many valid candidates are ranked exhaustively on every model turn.
EXHAUSTIVE_MAX = 8_000
#: Larger spaces: this many seeded random valid candidates, then hill-climbing from the best few.
SAMPLE = 2_000
#: ... drawn shape by shape (``shape_sample.stratified``) where the valid space can be listed.
ENUMERATE_MAX = 200_000
CLIMB_STARTS = 6
#: A climb stops after this many moves.
CLIMB_STEPS = 50
#: After its first turn, the guide re-scores this many candidates per mode (best by their last prediction).
SHORTLIST = 100
#: ... and the best this many of every shape (mode, and per role instances × TP × DP × EP).
PER_SHAPE = 3
#: The re-fit sees at most this many measured trials (the most recent), which bounds its cost.
MAX_FIT_TRIALS = 24
#: What the re-fit may move: every parameter but the API server's time per prompt token, which only a wave of
#: prompts sent at once separates from ``request_latency_s`` (a profile's probes, fitted as sent); a study's levels,
#: fitted in the steady view at one prompt length, cannot tell the two apart, and on a replayed ~30B H200 study
#: the re-fit that could move it led trial 5's knee search to five levels where it took four. Nor the per-layer
#: step floor:
#: a study measures one depth, where it is ``step_latency_s`` by another name (the reference fit, over models of
#: other depths, is what sees it); freed, it moved that replayed study's trial 1 to five levels where it takes four.
REFIT = [n for n in CALIBRATABLE if n not in ("frontend_per_prompt_token_s", "layer_latency_s")]
#: Trial user attribute saying who proposed a trial ("model" or "sampler").
PROPOSER_ATTR = "advisor_proposer"
#: On a sampler's trial that took a model turn the model declined (it predicted nothing better).
DECLINED_ATTR = "advisor_model_declined"
#: Model turns yield to the sampler while the mean relative error of the last ``JUDGE_WINDOW`` predictions
#: exceeds this.
MAX_CV_ERROR = 0.30
JUDGE_WINDOW = 6
#: After yielding, the model re-enters once this many held-out predictions in a row are within its bound.
REENTRY_TRIALS = 2

Params = dict[str, Any]


class ModelGuide:
    """The model's side of a guided study: ``propose`` on a model turn, ``observe`` after each measurement."""

    def __init__(self, job: TuningJob, start: PerfParams, bound: float = MAX_CV_ERROR) -> None:
        self.job = job
        self.bound = bound  # the relative error the model is held to on the baseline and on re-entry
        self.start = start
        self.params = start
        self.model = job.model_profile()
        self.space = job.space
        self.samples: list[Sample] = []
        self._sensitivity = SensitivityMemo(start)  # each refit computes only the new trial's nudges
        self.errors: list[float] = []  # |predicted / measured − 1| of the first objective, trial by trial
        self.yielding = False  # the model missed the baseline by more than ``bound``: measured trials lead
        self.baseline_error: float | None = None
        self._judged_from = 0  # ``cv_error`` reads ``errors`` from here (where the model last re-entered)
        self.plan = MeasurePlan(tuple(job.slos))
        self.rng = random.Random(job.sampler.seed)
        self.turns = 0
        self._choices: dict[str, list[Any]] = {}
        self._pool: list[tuple[Params, DeploymentConfig]] | None = None
        self._exhaustive = False
        self._last: dict[str, Outcome] = {}  # config key → its outcome when last predicted (``_shortlist``)
        self._drawn: list[tuple[Params, DeploymentConfig]] | None = None  # the seeded sample of a large space
        self._keys: dict[tuple[int, ...], tuple[tuple[Any, ...], str]] = {}  # config keys: see ``_key``
        self._configs: dict[tuple[tuple[str, Any], ...], DeploymentConfig] = {}  # ``config_of``'s
        self._validity: dict[tuple[int, ...], tuple[tuple[Any, ...], bool]] = {}  # ``_valid``'s

    # ------------------------------------------------------------------------------------------ turns
    def wants_turn(self, executed: int) -> bool:
        """Model turns: one per deployment mode first, then every other trial, up to ``guided_trials`` — and
        none while the model's out-of-sample error exceeds ``MAX_CV_ERROR``."""
        if self.done or self.yielding or not self.trusted:
            return False
        lead = len(self.space.modes)
        return executed < lead or (executed - lead) % 2 == 1

    def judge(self, predicted: dict[str, float | None], measured: dict[str, float | None], *,
              baseline: bool = False) -> None:
        """Keep the model's error on one trial: its prediction made before the trial ran vs the measurement. The
        baseline's (vLLM's defaults, measured first) decides whether the guide yields; while it yields, each
        later trial's decides whether the model re-enters (see the module's docstring, 5)."""
        name = next(iter(measured), None)
        p, m = predicted.get(name) if name else None, measured.get(name) if name else None
        if p is None or not m:
            return
        self.errors.append(abs(p / m - 1.0))
        if baseline:
            self.baseline_error = self.errors[-1]
            if self.baseline_error > self.bound:
                self.yielding = True
                self._judged_from = len(self.errors)
        elif self.yielding:
            held = self.errors[self._judged_from:]
            if len(held) >= REENTRY_TRIALS and all(e <= self.bound for e in held[-REENTRY_TRIALS:]):
                self.yielding = False
                self._judged_from = len(self.errors) - REENTRY_TRIALS

    @property
    def cv_error(self) -> float | None:
        """Mean relative error of the last ``JUDGE_WINDOW`` out-of-sample predictions since the model last
        re-entered (None: fewer than two)."""
        recent = self.errors[self._judged_from:][-JUDGE_WINDOW:]
        return sum(recent) / len(recent) if len(recent) >= 2 else None

    @property
    def trusted(self) -> bool:
        err = self.cv_error
        return err is None or err <= MAX_CV_ERROR

    def propose(self, taken: set[str], best_measured: float | None = None) -> Params | None:
        """The parameters of the best candidate under the current parameters that is not in ``taken`` (config
        keys measured or running); a mode nobody has tried yet comes first. None when nothing is left, or
        (max_under_slo) when the best the model can offer is predicted no better than ``best_measured``."""
        self.turns += 1
        weight = self.rng.random() if self.job.objective.mode is ObjectiveMode.PARETO else 1.0
        tried_modes = {self._mode_of_key(k) for k in taken}
        cands = [(p, c) for p, c in self._candidates() if self._key(c) not in taken]
        if not cands:
            return None
        scored = self._shortlist(cands, weight) if self._last else self._scored(cands)
        self._last.update((self._key(c), o) for _, c, o in scored)
        fresh = [t for t in scored if t[1].mode.value not in tried_modes]
        pool = fresh or scored
        rank = self._ranker(weight, [o for _, _, o in pool])
        best = max(pool, key=lambda t: rank(t[2]))
        if not self._exhaustive:  # climb from the sample's best few, on the same ranking
            starts = best_of_each_shape(sorted(pool, key=lambda t: rank(t[2]), reverse=True))[:CLIMB_STARTS]
            modes = {best[1].mode} if fresh else None
            for cand in self._climbs(starts, rank, taken, modes):
                if rank(cand[2]) > rank(best[2]):
                    best = cand
        if (best_measured is not None and self.job.objective.mode is ObjectiveMode.MAX_UNDER_SLO
                and not fresh and (not best[2].feasible or best[2].values[0] <= best_measured)):
            return None  # the model expects nothing better than what is measured: the sampler explores
        return best[0]

    def _shortlist(self, cands: list[tuple[Params, DeploymentConfig]], weight: float,
                   ) -> list[tuple[Params, DeploymentConfig, Outcome]]:
        """The best ``SHORTLIST`` candidates of each mode and the best ``PER_SHAPE`` of every shape by their last
        predicted outcome, predicted again with the current parameters. Scoring every candidate on every turn
        (a knee search each, about 2 ms) cost seconds per turn on a space of thousands; a re-fit reorders
        shapes more than it reorders the batch sizes and kernels within one."""
        stale: list[tuple[Params, DeploymentConfig, Outcome, str]] = []
        new: list[tuple[Params, DeploymentConfig]] = []
        for p, c in cands:
            k = self._key(c)
            o = self._last.get(k)
            if o is None:
                new.append((p, c))
            else:
                stale.append((p, c, o, k))
        rank = self._ranker(weight, [t[2] for t in stale])
        picked: set[str] = set()
        best_of_shape: dict[tuple[Any, ...], int] = {}
        best_of_mode: dict[Any, int] = {}
        for _, c, _, k in sorted(stale, key=lambda t: rank(t[2]), reverse=True):  # one stable sort serves both
            shape = shape_of(c)
            n = best_of_shape.get(shape, 0)
            if n < PER_SHAPE:  # every shape's best few: a re-fit may move a whole shape up (TP4 → DEP4)
                best_of_shape[shape] = n + 1
                picked.add(k)
            n = best_of_mode.get(c.mode, 0)
            if n < SHORTLIST:
                best_of_mode[c.mode] = n + 1
                picked.add(k)
        return self._scored([*new, *((p, c) for p, c, _, k in stale if k in picked)])

    @property
    def done(self) -> bool:
        """All model turns are spent: nothing more to propose, so nothing more to fit."""
        return self.turns >= self.job.sampler.guided_trials

    def observe(self, config: DeploymentConfig, measurements: Sequence[Measurement], *, refit: bool = True) -> None:
        """Add one measured trial and re-fit the parameters the data can move (calibrate's own fit)."""
        if self.done:
            return
        measured = {m.concurrency: v for m in measurements if (v := fitted_values(m))}
        if not measured:
            return
        self.samples.append(Sample(self.job.name, len(self.samples), config, self.job, measured))
        if refit:
            self.refit()

    def refit(self) -> None:
        if not self.samples:
            return
        problem = Problem(self.samples[-MAX_FIT_TRIALS:])
        self.params = fit(problem, self.start,
                          sensitive(problem, self.start, REFIT, self._sensitivity))

    # ---------------------------------------------------------------------------------------- ranking
    def _scored(self, cands: list[tuple[Params, DeploymentConfig]]) -> list[tuple[Params, DeploymentConfig, Outcome]]:
        """Each candidate with its predicted outcome, the model answering all of them at once (the same outcomes as
        ``model_rank.predicted_outcome`` one by one, less the operating point: the guide ranks on values and
        violations, and building a Measurement for each candidate's point was a tenth of a ranking)."""
        outs = predicted_outcomes(self.job, [c for _, c in cands], self.params, self.plan, points=False)
        return [(p, c, o) for (p, c), o in zip(cands, outs, strict=True)]

    def _ranker(self, weight: float, outcomes: Iterable[Outcome]) -> Any:
        """A sort key over predicted outcomes: feasible first; then the objective (max_under_slo) or a
        Chebyshev scalarisation of both objectives, each scaled by its best predicted value (Pareto)."""
        if self.job.objective.mode is ObjectiveMode.PARETO:
            outs = list(outcomes)
            top = [max((o.values[i] for o in outs), default=1.0) or 1.0 for i in (0, 1)]

            def key(o: Outcome) -> tuple[bool, float]:
                v = min(weight * o.values[0] / top[0], (1 - weight) * o.values[1] / top[1])
                return (o.feasible, v if o.feasible else -o.violation)
        else:
            def key(o: Outcome) -> tuple[bool, float]:
                return (o.feasible, o.values[0] if o.feasible else -o.violation)
        return key

    def _climbs(self, starts: list[tuple[Params, DeploymentConfig, Outcome]], rank: Any, taken: set[str],
                modes: set[Any] | None) -> list[tuple[Params, DeploymentConfig, Outcome]]:
        """Greedy ascents over one-knob changes of valid, untaken candidates, one from each of ``starts``, each
        moving to its first neighbour (in ``_neighbours``' order) that ranks above it, at most ``CLIMB_STEPS``
        moves. The climbs run in lockstep so that each step predicts every climber's neighbours in one batch
        (and a candidate two climbs meet once): the same ascents as one climb at a time trying neighbours one
        by one, which cost the GB300 preset's model turns ~0.15 s each."""
        cur = list(starts)
        moving = list(range(len(cur)))
        known: dict[str, Outcome] = {}  # this turn's predictions, by config key
        for _ in range(CLIMB_STEPS):
            if not moving:
                break
            steps: dict[int, list[tuple[Params, DeploymentConfig, str]]] = {}
            new: dict[str, DeploymentConfig] = {}
            for i in moving:
                steps[i] = []
                for p in self._neighbours(cur[i][0]):
                    c = self.config_of(p)
                    k = self._key(c)
                    if k in taken or (modes and c.mode not in modes) or not self._valid(c):
                        continue
                    steps[i].append((p, c, k))
                    if k not in known:
                        new.setdefault(k, c)
            if new:
                known.update(zip(new, predicted_outcomes(self.job, list(new.values()), self.params, self.plan,
                                                         points=False), strict=True))
            still = []
            for i in moving:
                here = rank(cur[i][2])
                up = next(((p, c, known[k]) for p, c, k in steps[i] if rank(known[k]) > here), None)
                if up is not None:
                    cur[i] = up
                    still.append(i)
            moving = still
        return cur

    # ------------------------------------------------------------------------------------ candidates
    def _candidates(self) -> list[tuple[Params, DeploymentConfig]]:
        valid = self.job.valid_space()
        if self._pool is None:
            if valid is not None:  # the valid candidates, straight from the space (no rejection)
                if valid.valid <= EXHAUSTIVE_MAX:
                    self._pool = list(valid.iter_valid_configs())
                    self._exhaustive = True
            else:
                pool: list[tuple[Params, DeploymentConfig]] = []
                for p, c in self.space.enumerate():
                    if self._valid(c):
                        pool.append((p, c))
                    if len(pool) > EXHAUSTIVE_MAX:
                        break
                else:
                    self._exhaustive = True
                    self._pool = pool
        if self._exhaustive:
            assert self._pool is not None
            return self._pool
        return self._sample()

    def _sample(self) -> list[tuple[Params, DeploymentConfig]]:
        """A seeded sample of the valid candidates, drawn once (climbing explores beyond it)."""
        if self._drawn is None:
            self._drawn = self._draw()
        return self._drawn

    def _draw(self) -> list[tuple[Params, DeploymentConfig]]:
        valid = self.job.valid_space()
        if valid is not None and valid.valid <= ENUMERATE_MAX:
            chosen = stratified(valid.valid_shapes(params_shape), self.rng, SAMPLE)
            return [(p, self.config_of(p)) for p in valid.valid_at(chosen)]
        out: dict[str, tuple[Params, DeploymentConfig]] = {}
        for _ in range(SAMPLE * (2 if valid is not None else 20)):
            if valid is not None:
                drawn = valid.sample(self.rng, set())
                assert drawn is not None
                p, c = drawn, self.config_of(drawn)
            else:
                p = {}
                c = self.space.build(lambda n, ch: p.setdefault(n, self._record(n, ch)[self.rng.randrange(len(ch))]))
                if not self._valid(c):
                    continue
            out.setdefault(self._key(c), (p, c))
            if len(out) >= SAMPLE:
                break
        return list(out.values())

    def _record(self, name: str, choices: Sequence[Any]) -> list[Any]:
        self._choices[name] = list(choices)
        return self._choices[name]

    def config_of(self, params: Params) -> DeploymentConfig:
        """The candidate for ``params``; a dimension they lack (a branch just switched on) takes its first choice.
        Built once per parameters: the climbs of every model turn walk mostly the same neighbourhoods."""
        key = tuple(params.items())
        cfg = self._configs.get(key)
        if cfg is None:
            def choose(name: str, choices: Sequence[Any]) -> Any:
                self._record(name, choices)
                v = params.get(name)
                return v if v in choices else choices[0]
            if len(self._configs) > 8 * SAMPLE:
                self._configs.clear()
            cfg = self._configs[key] = self.space.build(choose)
        return cfg

    def _neighbours(self, params: Params) -> Iterable[Params]:
        for name, value in params.items():
            for alt in self._choices.get(name, ()):
                if alt != value:
                    yield {**params, name: alt}

    def _key(self, cfg: DeploymentConfig) -> str:
        """``cfg.key()``, serialised once per config object (``memo``, keyed by identity): a turn asks it of every
        candidate two or three times (taken? last outcome? shortlisted?), and the JSON dump was a fifth of a later
        turn's time."""
        return memo(self._keys, DeploymentConfig.key, cfg, limit=4 * EXHAUSTIVE_MAX + 4 * SAMPLE)

    def _valid(self, cfg: DeploymentConfig) -> bool:
        """No rule broken (``check``), asked once per config object (``memo``)."""
        return memo(self._validity, self._check, cfg, limit=8 * SAMPLE)

    def _check(self, cfg: DeploymentConfig) -> bool:
        return not check(cfg, self.model, self.job.cluster, self.job.workload.max_model_len)

    @staticmethod
    def _mode_of_key(key: str) -> str:
        return DeploymentConfig.model_validate_json(key).mode.value
