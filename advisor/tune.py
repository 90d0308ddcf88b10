"""The tune loop: ask → suggest → validate → place → evaluate → record → tell.

Kept short on purpose; what a trial's outcome means for Optuna is in ``objectives``, what is stored is
in ``db``, and how a deployment runs is the executor's business. Nothing a trial does can stop the loop:
a failure is a recorded state, not an exception. Recording and telling are ``advisor.trial_record``;
heartbeats and closing what a dead tuner left are ``advisor.recovery``; the shuffled grid is ``advisor.proposers.grid``.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import optuna

import db
from advisor.errors import BadInput
from advisor.baseline import baseline_config
from advisor.executor_factory import make_executor
from advisor.profile import ModelParams
from advisor.proposers.grid import grid_points
from advisor.proposers.guide import DECLINED_ATTR, PROPOSER_ATTR, ModelGuide
from advisor.proposers.guide_turns import enqueue_turn, resume_guide, study_taken, study_turns
from advisor.proposers.progress import PROGRESS_DRAWS, STALE_PROPOSALS, enqueue_progress
from advisor.proposers.valid_sampler import taken_keys
from advisor.job import ExecutorKind, SamplerKind, TuningJob, check_study_name
from advisor.objectives import Outcome, score, worst
from advisor.study import open_study
from db import redact_url
from executors import Executor, FailureKind, RunResult, Topology, place
from executors.measure import MeasurePlan, WallTimeReached, knee_of
from executors.perf import PerfParams
from executors.perf.burst import AS_SENT, STEADY
from executors.simulated import SimulatedExecutor, model_levels, predicted_plan
from search_spaces import DeploymentConfig, IllegalTransition, TrialState, check
from advisor.tune_summary import TrialReport, TuneSummary
from advisor.recovery import Heartbeat, ask, close_stale
from advisor.trial_record import (
    CONFIG_KEY_ATTR, ENVIRONMENT_RETRY_ATTR, EXECUTED_ATTR, EXTRA_ATTR, REPEAT_OF_ATTR, STATE_ATTR, best_value,
    constraint_of, PICKED_ATTR, extras, one_line, record, record_interrupted, tell, tell_repeat_again, tell_row,
    tell_taken,
)

#: Seconds between an environment failure and the retry on a fresh placement: long enough for a port in
#: TIME_WAIT or a placement group being removed to clear, short against a deploy.
ENVIRONMENT_RETRY_PAUSE_S = 5.0
#: Trials in a row that failed for the environment (each after its retry) before the study stops: by then the
#: cluster, not the search, needs a person.
ENVIRONMENT_FAILURES_TO_STOP = 3

log = logging.getLogger(__name__)


def tune(
    job: TuningJob,
    *,
    trials: int | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    executor: Executor | None = None,
    on_trial: Callable[[TrialReport], None] | None = None,
    ray_address: str | None = None,
) -> TuneSummary:
    started = time.monotonic()
    url = storage or job.storage
    name = check_study_name(study_name, "--study") if study_name is not None else job.name
    budget = trials or job.budget.trials
    own_executor = executor is None
    executor = executor or make_executor(job, ray_address=ray_address)  # bad executor input: before any write
    try:
        database = db.connect(url)
    except db.DatabaseUnavailable as e:
        if own_executor:
            executor.close()
        raise BadInput(f"storage: {e}") from None
    try:
        study = open_study(job, url, name)
        summary = TuneSummary(study=name, storage=redact_url(url))
        # the study's budget is what this run was asked for (``--trials``): its screens then count against it
        stored = job if trials is None else job.model_copy(
            update={"budget": job.budget.model_copy(update={"trials": budget})})
        database.upsert_study(
            name, stored.to_document(), description=job.description, executor=executor.kind,
            engine_version=executor.engine_version, hardware=job.cluster.describe(), optuna_study_name=name,
        )
        summary.interrupted_found = close_stale(job, database, study, name,
                                                 ray_address or job.executor.ray_address)
        real = not executor.simulated  # the model (reserving GPUs or not) needs no baseline
        model = _model_params(job, database, executor, summary, real)
        ctx = _Context(job, study, database, executor, name, summary, on_trial,
                       resume_guide(job, study, database, name, model.params), model)
        ctx.started = started  # the wall time counts from the command's start, a profile made first included
        try:
            if real and job.baseline.enabled:
                _baseline(ctx)
            _loop(ctx, budget)
            if real and job.budget.repeat_top and (summary.exhausted or
                                                   summary.stopped_because in ("budget reached", "grid exhausted")):
                _repeats(ctx)
        except WallTimeReached:
            pass  # the trial it stopped is recorded and the reason said (``_run_trial``): the run ends as at a budget
        return summary
    finally:
        database.close()
        if own_executor:
            executor.close()


class _Measured(NamedTuple):
    """A configuration measured in this study: the trial that ran it and what Optuna was told."""

    number: int
    values: list[float]
    violation: float

    @classmethod
    def of(cls, t: optuna.trial.FrozenTrial) -> _Measured:
        return cls(t.number, list(t.values), constraint_of(t))


@dataclass
class _Context:
    """What one tuner run carries through its trials."""

    job: TuningJob
    study: optuna.Study
    database: db.Database
    executor: Executor
    name: str
    summary: TuneSummary
    on_trial: Callable[[TrialReport], None] | None
    guide: ModelGuide | None
    model: ModelParams
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    started: float = field(default_factory=time.monotonic)
    trial_walls: list[float] = field(default_factory=list)  # wall seconds of this run's trials that ran to the end

    def time_left(self) -> float | None:
        """Seconds until ``budget.wall_time_s`` since this run started; None without a wall time."""
        wall = self.job.budget.wall_time_s
        return None if not wall else wall - (time.monotonic() - self.started)

    def out_of_time(self) -> str | None:
        """Why no trial may start now, if none may: the wall time has passed, or what is left of it is shorter
        than this run's median trial — a trial that would be stopped at the wall time scores nothing, so the GPU
        time it would take is better left unspent (the user's next call continues the study)."""
        left = self.time_left()
        if left is None:
            return None
        wall = self.job.budget.wall_time_s
        if left <= 0.0:
            return f"wall time of {wall:g} s reached"
        typical = statistics.median(self.trial_walls) if self.trial_walls else 0.0
        if left < typical:
            return f"wall time of {wall:g} s: {left:.0f} s left, less than this run's median trial ({typical:.0f} s)"
        return None

    @property
    def params(self) -> PerfParams:
        """The model's current parameters: the guide's re-fit, else what the study started from (a hardware
        profile, a parameter file, or the defaults)."""
        return self.guide.params if self.guide is not None else self.model.params


def _model_params(job: TuningJob, database: db.Database, executor: Executor, summary: TuneSummary,
                  real: bool) -> ModelParams:
    """What the study's model starts from: a parameter file, else the stored profile of this model shape on this
    GPU kind (for a real study, one measured with this vLLM — profiled here first when there is none and
    ``executor.profile`` is ``auto``), else the defaults. The simulated executor predicts with the same."""
    from advisor.profile import resolve_params, run_profile

    version = executor.engine_version if real else None
    model = resolve_params(job, database, version)
    # The local executor only: a Ray study's executor holds its Ray connection for the whole study, and the
    # profile's own deployments would need a second one (run `advisor profile` first; the study then finds it).
    if (real and job.executor.kind is ExecutorKind.LOCAL and model.profile_id is None and not job.executor.perf_params
            and job.executor.profile == "auto"):
        made = run_profile(job, database)
        summary.profiled = made.profile.label
        model = resolve_params(job, database, version)
    if isinstance(executor, SimulatedExecutor) and executor.params is None:
        executor.params = model.params
        executor.params_source = model.source
    summary.model_params = model.source + (f", fitted with levels predicted {model.view}: a trial predicts its levels "
                                           f"so until the guide re-fits" if real and model.view == AS_SENT else "")
    return model


def _loop(ctx: _Context, budget: int) -> None:
    job, study, database, name, summary = ctx.job, ctx.study, ctx.database, ctx.name, ctx.summary
    model, cluster, wl = job.model_profile(), job.cluster, job.workload
    seen = {
        t.user_attrs[CONFIG_KEY_ATTR]: _Measured.of(t)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if CONFIG_KEY_ATTR in t.user_attrs and t.user_attrs.get(EXECUTED_ATTR)
    }
    told_again: set[str] = set()  # measured configurations proposed again and told once with their values
    grid = grid_points(job, study) if job.sampler.kind is SamplerKind.GRID else None
    guide = ctx.guide
    turn: bool | None = False
    valid = job.valid_space() if grid is None else None
    rng = random.Random(f"{job.sampler.seed}:progress")
    asks, max_asks = 0, 50 * budget
    stale = 0  # proposals in a row that were invalid or already measured
    consecutive_failures = environment_failures = 0
    while True:
        trials = study.get_trials(deepcopy=False)
        if (executed := database.budget_used(name, in_flight=True)) >= budget:  # several workers: stop together
            return
        if why := ctx.out_of_time():
            summary.stopped_because = f"{why}: no further trial started"
            return
        if asks >= max_asks:
            summary.stopped_because = f"{asks} proposals without reaching the budget (space mostly invalid?)"
            return
        if grid is not None:
            point = next(grid, None)
            if point is None:
                summary.stopped_because = "grid exhausted"
                return
            # not skip_if_exists: Optuna would skip a point whose only trial the environment failed
            study.enqueue_trial(point)
        else:
            taken = taken_keys(trials)
            if valid is not None and not valid.feasible({}, taken):
                summary.stopped_because = (f"space exhausted: each of its {valid.valid:,} valid candidates is "
                                           "measured (or being measured by another worker)")
                summary.exhausted = True
                return
            if guide is not None:  # turns are the study's, not this worker's (several workers share a study)
                guide.turns = study_turns(trials)
            turn = enqueue_turn(guide, study, executed, lambda: study_taken(guide, study), best_value(trials))
            if not turn and stale >= STALE_PROPOSALS:
                if not enqueue_progress(job, study, guide, valid, taken, rng):
                    summary.stopped_because = ("space exhausted: no unmeasured valid candidate in "
                                               f"{PROGRESS_DRAWS} random draws after {stale} proposals in a row "
                                               "that measured nothing new")
                    summary.exhausted = True
                    return
                stale = 0
        asks += 1
        t0 = time.monotonic()
        trial = ask(study, ctx.worker)
        proposer = trial.user_attrs.get(PROPOSER_ATTR) or ("grid" if grid is not None else "sampler")
        if turn is None:
            trial.set_user_attr(DECLINED_ATTR, True)
        cfg = job.space.suggest(trial)
        violations = check(cfg, model, cluster, wl.max_model_len)
        if violations:
            reason = "; ".join(map(str, violations))
            database.record_invalid(name, trial.number, params=trial.params, config=cfg, reason=reason,
                                    proposer=proposer)
            tell(study, trial, cfg, worst(job), TrialState.INVALID)
            summary.invalid += 1
            stale += 1
            _report(summary, ctx.on_trial, TrialReport(trial.number, TrialState.INVALID, cfg, None, reason,
                                                       wall_s=time.monotonic() - t0))
            continue
        key = cfg.key()
        other = _taken_elsewhere(study, trial, key, seen)
        if other is not None and key not in seen:  # another worker is measuring it right now
            tell_taken(study, trial, other)
            summary.taken_elsewhere += 1
            stale += 1
            continue
        if key in seen:
            prev = seen[key]
            outcome = Outcome(list(prev.values), prev.violation, None)
            reason = f"same configuration as trial {prev.number}; its measurements stand"
            tid = database.start_trial(name, trial.number, params=trial.params, config=cfg, topology=None,
                                       worker=ctx.worker, proposer=proposer, reused_from=prev.number)
            row = database.finish_trial(tid, TrialState.COMPLETE, objectives=outcome.as_dict(job),
                                        violation=outcome.violation, reason=reason)
            if key in told_again:  # told once already: the sampler must not learn the same point twice more
                tell_repeat_again(study, trial, cfg)
            else:
                tell_row(job, study, trial, row)
                told_again.add(key)
            summary.repeats += 1
            stale += 1
            _report(summary, ctx.on_trial, TrialReport(trial.number, TrialState.COMPLETE, cfg, outcome, reason,
                                                       wall_s=time.monotonic() - t0))
            continue
        state, outcome, run = _run_trial(ctx, trial, cfg, proposer)
        if _is_environment_failure(state, run):  # not a configuration measured: no budget, no failure streak
            environment_failures += 1
            summary.environment_failed += 1
            if environment_failures >= ENVIRONMENT_FAILURES_TO_STOP:
                summary.stopped_because = f"the environment keeps failing: {one_line(run.reason)} " \
                    f"({environment_failures} trials in a row, each retried once; fix the cluster, then run the " \
                    "same command again)"
                summary.environment_broken = True
                return
            continue
        environment_failures = 0
        stale = 0
        summary.executed += 1
        if state is TrialState.COMPLETE:
            seen[key] = _Measured(trial.number, list(outcome.values), outcome.violation)
            consecutive_failures = 0
        else:
            summary.failed += 1
            consecutive_failures += 1
        if consecutive_failures >= job.budget.max_consecutive_failures:
            summary.stopped_because = (
                f"{consecutive_failures} trials failed in a row (budget.max_consecutive_failures); "
                f"last: {run.reason}"
            )
            return


def _taken_elsewhere(study: optuna.Study, trial: optuna.Trial, key: str,
                     seen: dict[str, _Measured]) -> int | None:
    """Re-check a pick against every worker's trials right before running it: several workers share a study and
    two of them can take the same configuration (both model turns picking it, or the sampler's draw racing
    another worker's). Our key is written first, then the study read: of two workers holding one
    configuration, the later reader sees the other and yields (both may yield; neither runs it twice).
    A configuration another worker has measured joins ``seen`` (its measurements stand); one another worker is
    running returns that trial's number."""
    trial.set_user_attr(PICKED_ATTR, key)
    running = None
    for t in study.get_trials(deepcopy=False):
        if t.number == trial.number:
            continue
        if (t.state is optuna.trial.TrialState.COMPLETE and t.user_attrs.get(CONFIG_KEY_ATTR) == key
                and t.user_attrs.get(EXECUTED_ATTR) and key not in seen):
            seen[key] = _Measured.of(t)
        elif t.state is optuna.trial.TrialState.RUNNING and t.user_attrs.get(PICKED_ATTR) == key:
            running = t.number
    return running


def _predict(ctx: _Context, topo: Topology) -> tuple[MeasurePlan, dict[str, float] | None]:
    """The measure plan of one trial (its SLOs, the knee the model predicts, where the search starts, and where
    ``_aims`` the model's curve the search aims by) and
    the model's objective values for it (stored with the trial: the guide's honest, out-of-sample error), on
    the placement the trial deploys."""
    job = ctx.job
    plan = MeasurePlan(tuple(job.slos))
    as_sent = _view(ctx) == AS_SENT
    try:
        levels = model_levels(topo, job.model_profile(), job.workload, plan, ctx.params, as_sent=as_sent)
    except Exception:  # noqa: BLE001 — a prediction is advice: without it the search starts at the fixed levels
        return plan, None
    outcome = score(job, levels)
    predicted = outcome.as_dict(job) if outcome.feasible else None
    knee = knee_of(levels)
    steps = MeasurePlan(plan.slos, knee.load if knee is not None else None)
    if not _aims(ctx):
        return steps, predicted
    try:
        return predicted_plan(topo, job.model_profile(), job.workload, plan.slos, ctx.params, levels,
                              as_sent), predicted
    except Exception:  # noqa: BLE001 — the curve is advice too: without it the search steps as before
        return steps, predicted


def _view(ctx: _Context) -> str:
    """The view a trial's levels are predicted in: the one its parameters were fitted in. A hardware profile is
    fitted as sent (``advisor.profile``), and a real trial's levels are sent that way, so its knee search starts and
    aims by levels predicted as sent: over the 15 trials of two ~30B H200 studies the knee predicted as sent by
    the stored profile's probes fitted as sent was off the measured one by a median |log ratio| of 0.14,
    the steady fit's steady knee by 0.16 and the as-sent fit's steady knee by 0.40 (``research/level_views.py``;
    its levels under the knees: 7.2–12.5% as sent, 19.4–27.6% for the steady fit). Steady where the executor is the
    model itself (its levels are the steady state) and once the guide has re-fitted the parameters on the study's
    own levels (in the steady view)."""
    if ctx.executor.simulated or (ctx.guide is not None and ctx.guide.samples):
        return STEADY
    return ctx.model.view


#: A guided study's trials are aimed by the model's curve once the model's out-of-sample error on the study
#: (``ModelGuide.cv_error``) is at most this.
AIM_MAX_ERROR = 0.10


def _aims(ctx: _Context) -> bool:
    """Whether this trial's knee search is aimed by the model's curve (``MeasurePlan.curve``), not only started
    at its knee: when the model's parameters rest on a measurement of this machine — a hardware profile, a
    parameter file (``advisor calibrate``) — or the guide's re-fit predicts the study's recent trials within
    ``AIM_MAX_ERROR``. Why not always: on the simulated unknown machine (``tests/test_guide.py``, the defaults
    against perturbed truth seed 0) aiming every trial from the unmeasured defaults left the guided study at
    0.71–0.73 of the optimum for sampler seeds 2 and 1, against 1.0 with the widening steps (docs/benchmarks.md,
    "Knee search"). Not because the aimed levels are worse to re-fit on (replayed on the same 16 candidates they
    were not): with the model 20–40% off, the aim puts each knee elsewhere within the tolerance, the re-fits and
    then the picks diverge, and that study never measured the optimum's family. The aim's gain (3–4 full-length
    levels per knee instead of 6, ``benchmarks/knee_search.py``) is kept wherever the model is known to be close."""
    if ctx.model.profile_id is not None or ctx.job.executor.perf_params:
        return True
    err = ctx.guide.cv_error if ctx.guide is not None else None
    return err is not None and err <= AIM_MAX_ERROR


def _run_trial(ctx: _Context, trial: optuna.Trial, cfg: DeploymentConfig, proposer: str, *,
               extra: str | None = None, repeat_of: int | None = None,
               start: float | None = None) -> tuple[TrialState, Outcome, RunResult]:
    """Deploy, measure (knee search from the model's prediction, or from ``start``), tear down, record, tell.

    A run the environment failed (``FailureKind.ENVIRONMENT``) says nothing about ``cfg``: it is deployed once
    more, fresh, in the same trial; failing the environment again, the trial is told FAIL (not infeasible)."""
    t0 = time.monotonic()
    job, database = ctx.job, ctx.database
    if extra:
        trial.set_user_attr(EXTRA_ATTR, extra)
    if repeat_of is not None:
        trial.set_user_attr(REPEAT_OF_ATTR, repeat_of)
    topo = place(cfg, job.cluster)  # placed once: predicted on, stored, deployed and exported (advisor.exports)
    plan, predicted = _predict(ctx, topo)
    if start is not None:
        plan = replace(plan, start=start)
    if job.budget.wall_time_s:  # the levels stop at the wall time (``MeasurePlan.deadline``)
        plan = replace(plan, deadline=ctx.started + job.budget.wall_time_s)
    tid = database.start_trial(ctx.name, trial.number, params=trial.params, config=cfg, topology=topo.to_dict(),
                               worker=ctx.worker, proposer=proposer, predicted=predicted, repeat_of=repeat_of,
                               baseline=extra == "baseline")
    first: RunResult | None = None  # the attempt the environment failed, when there was one

    def evaluate() -> RunResult:
        return ctx.executor.evaluate(topo, job.workload, plan=plan,
                                     on_started=lambda res, tid=tid: database.record_resources(tid, res),
                                     on_measured=lambda levels, tid=tid: database.add_levels(tid, levels))

    try:
        with Heartbeat(database, tid):
            run = evaluate()
            if run.failure is FailureKind.ENVIRONMENT:
                first = run
                trial.set_user_attr(ENVIRONMENT_RETRY_ATTR, one_line(run.reason))
                _notify(ctx, TrialReport(
                    trial.number, TrialState.RUNNING, cfg, None, run.reason,
                    note=f"trial {trial.number}: environment failure ({one_line(run.reason)}): retrying on a fresh "
                         f"placement in {ENVIRONMENT_RETRY_PAUSE_S:g} s"))
                time.sleep(ENVIRONMENT_RETRY_PAUSE_S)
                run = evaluate()
    except KeyboardInterrupt as e:
        limit = f"wall time of {job.budget.wall_time_s:g} s reached" if isinstance(e, WallTimeReached) else None
        why = f"interrupted ({'; '.join(filter(None, (limit, str(e))))})" if limit or str(e) else \
            "interrupted (Ctrl-C or SIGTERM)"
        stopped = getattr(e, "run", None)
        try:
            stopped_row = record_interrupted(database, tid, stopped, why)
        except IllegalTransition:  # closed meanwhile by `advisor cleanup`: its row stands
            stopped_row = _closed_meanwhile(ctx, trial)
        tell_row(job, ctx.study, trial, stopped_row)
        kept = len(stopped.measurements) if stopped is not None else 0
        ctx.summary.stopped_because = (
            f"{limit}: trial {trial.number} {e} ({kept} measured level(s) kept, the trial marked interrupted); run "
            "the same command again to continue" if limit else "interrupted (Ctrl-C); run the same command again to "
            "continue")
        raise
    note = None
    try:
        outcome, row = record(job, database, tid, run, first)
    except IllegalTransition:  # `advisor cleanup` closed the trial while it ran (and stopped its processes)
        outcome, row = worst(job), _closed_meanwhile(ctx, trial)
        note = (f"trial {trial.number} was closed while it ran ({one_line(row.reason)}); its result is not "
                "recorded")
    state = row.state
    tell_row(job, ctx.study, trial, row)  # our row first, then Optuna told from it
    if state is TrialState.COMPLETE:
        ctx.trial_walls.append(time.monotonic() - t0)
    if _is_environment_failure(state, run):
        note = (f"trial {trial.number}: environment failure again ({one_line(run.reason)}): recorded as "
                "failed: environment; its configuration is not judged and the budget does not count it")
    if ctx.guide is not None and state is TrialState.COMPLETE:
        if predicted and outcome.feasible:
            ctx.guide.judge(predicted, outcome.as_dict(job), baseline=extra == "baseline")
        ctx.guide.observe(cfg, run.measurements)
    executed = extra is None and not _is_environment_failure(state, run)
    _report(ctx.summary, ctx.on_trial, TrialReport(trial.number, state, cfg, outcome, run.reason,
                                                   executed=executed, wall_s=time.monotonic() - t0, note=note))
    return state, outcome, run


def _closed_meanwhile(ctx: _Context, trial: optuna.Trial) -> db.Trial:
    """The row of a trial another process (``advisor cleanup``) closed while this tuner ran it."""
    row = db.queries.get_trial(ctx.database, ctx.name, trial.number)
    assert row is not None and row.state is not TrialState.RUNNING, trial.number
    return row


def _is_environment_failure(state: TrialState, run: RunResult) -> bool:
    return state is TrialState.FAILED and run.failure is FailureKind.ENVIRONMENT


def _notify(ctx: _Context, r: TrialReport) -> None:
    """Show a report now without counting it among the trials' results (the trial is still running)."""
    log.info("%s", r.note)
    if ctx.on_trial is not None:
        ctx.on_trial(r)


def _baseline(ctx: _Context) -> None:
    """Measure vLLM's defaults on the deployment a user would start with, once per study, before the search."""
    if extras(ctx.study, "baseline") or ctx.out_of_time():
        return
    cfg = baseline_config(ctx.job)
    if cfg is None:
        return
    trial = ask(ctx.study, ctx.worker)  # no parameters: the baseline need not lie in the search space
    ctx.summary.baseline = trial.number
    _run_trial(ctx, trial, cfg, "baseline", extra="baseline")


def _repeats(ctx: _Context) -> None:
    """Deploy the best ``budget.repeat_top`` deployments and the baseline again (fresh deploys, fresh prompts):
    ``advisor best`` reports the run-to-run spread from these. Each is repeated once per study."""
    study, job = ctx.study, ctx.job
    done = {t.user_attrs.get(REPEAT_OF_ATTR) for t in extras(study, "repeat")}
    search = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
              if t.user_attrs.get(EXECUTED_ATTR) and not t.user_attrs.get(EXTRA_ATTR)
              and t.user_attrs.get(STATE_ATTR) == TrialState.COMPLETE.value and constraint_of(t) <= 0]
    top = sorted(search, key=lambda t: t.values[0], reverse=True)[: job.budget.repeat_top]
    todo = [t for t in [*top, *extras(study, "baseline")] if t.number not in done]
    for original in todo:
        if why := ctx.out_of_time():  # a later run repeats what is left
            ctx.summary.stopped_because = f"budget reached; {why}: not every repeat ran (run the same command " \
                "again to repeat the rest)"
            return
        row = db.queries.get_trial(ctx.database, ctx.name, original.number)
        if row is None or row.config is None:
            continue
        if original.params:
            study.enqueue_trial(original.params, user_attrs={PROPOSER_ATTR: "repeat"})
        trial = ask(study, ctx.worker)
        cfg = job.space.suggest(trial) if original.params else row.config
        if cfg.key() != row.config.key():  # the space changed since: measure what was measured
            cfg = row.config
        ctx.summary.repeated.append(trial.number)
        knee = knee_of(list(row.measurements))  # the repeat starts where the first run found the knee
        _run_trial(ctx, trial, cfg, "repeat", extra="repeat", repeat_of=original.number,
                   start=knee.load if knee is not None else None)


def _report(summary: TuneSummary, cb: Callable[[TrialReport], None] | None, r: TrialReport) -> None:
    summary.reports.append(r)
    if cb is not None:
        cb(r)


# CONFIG_KEY_ATTR, EXECUTED_ATTR and STATE_ATTR: what a trial carries on the Optuna side (``advisor.trial_record``)
__all__ = ["BadInput", "CONFIG_KEY_ATTR", "EXECUTED_ATTR", "STATE_ATTR", "TrialReport", "TuneSummary", "tune"]
