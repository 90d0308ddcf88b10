"""The tune loop: read the ledger → ask the proposer chain → ask Optuna → validate → run (or reuse) → record → tell.

Kept short on purpose. Every decision reads the study's ledger — our rows (``advisor.proposers.ledger``); Optuna is
written from those rows and read only for the workers' claims (``_claim``). Where a candidate comes from is the
proposers' business (``advisor.proposers.protocol``: one protocol, an ordered chain), what a trial's outcome means
for Optuna is in ``objectives``, what is stored is in ``db``, and how a deployment runs is the executor's. Nothing
a trial does can stop the loop: a failure is a recorded state, not an exception. Recording and telling are
``advisor.trial_record``; heartbeats and closing what a dead tuner left are ``advisor.recovery``.
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

import optuna

import db
from advisor.errors import BadInput
from advisor.baseline import baseline_config
from advisor.executor_factory import make_executor
from advisor.profile import ModelParams
from advisor.proposers.grid import Grid
from advisor.proposers.guide import DECLINED_ATTR, PROPOSER_ATTR, ModelGuide
from advisor.proposers.guide_turns import ModelTurns, resume_guide
from advisor.proposers.ledger import Ledger, Measured, Row
from advisor.proposers.names import MODEL_DECLINED, PROGRESS, SAMPLER
from advisor.proposers.progress import Progress
from advisor.proposers.protocol import Exhausted, Proposal, Proposer, Sampler, next_proposal
from advisor.proposers.valid_sampler import SpaceUsedUp
from advisor.job import ExecutorKind, SamplerKind, TuningJob, check_study_name
from advisor.objectives import Outcome, score, worst
from advisor.study import open_study
from db import redact_url
from executors import Executor, FailureKind, RunResult, Topology, place
from executors.measuring.loop import MeasurePlan, WallTimeReached, knee_of
from executors.perf import PerfParams
from executors.processes.procs import interrupt_of
from executors.perf.burst import AS_SENT, STEADY
from executors.simulated.executor import SimulatedExecutor, model_levels, predicted_plan
from search_spaces import DeploymentConfig, IllegalTransition, TrialState, check
from search_spaces.valid_space import params_key
from advisor.tune_summary import TrialReport, TuneSummary
from advisor.recovery import Heartbeat, ask, close_stale
from advisor.trial_record import (
    CONFIG_KEY_ATTR, ENVIRONMENT_RETRY_ATTR, EXECUTED_ATTR, EXTRA_ATTR, PICKED_ATTR, REPEAT_OF_ATTR, STATE_ATTR,
    one_line, record, record_interrupted, tell, tell_repeat_again, tell_row, tell_taken,
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
                       resume_guide(job, database, name, model.params), model)
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


@dataclass
class _Streaks:
    """What the loop counts from one proposal to the next."""

    asks: int = 0
    stale: int = 0  # proposals in a row that measured nothing new (invalid, reused, or taken elsewhere)
    failures: int = 0  # trials in a row that failed
    environment_failures: int = 0  # trials in a row the environment failed (each after its retry)
    told_again: set[str] = field(default_factory=set)  # reused configurations told once with their values


def _loop(ctx: _Context, budget: int) -> None:
    """Until the budget is spent or a stop says why: read the ledger, take the first proposal of the chain, and
    run it as one trial. Every decision reads our rows (the ledger); Optuna is only told."""
    streaks = _Streaks()
    chain = _proposers(ctx, streaks)
    while True:
        ledger = Ledger.read(ctx.job, ctx.database, ctx.name)
        if ledger.budget_used >= budget:  # several workers: stop together
            return
        if why := _why_stop(ctx, streaks, budget):
            ctx.summary.stopped_because = why
            return
        try:
            proposal = next_proposal(chain, ledger)
        except Exhausted as e:
            ctx.summary.stopped_because, ctx.summary.exhausted = str(e), e.exhausted
            return
        if proposal.proposer == PROGRESS:
            streaks.stale = 0
        streaks.asks += 1
        if why := _trial(ctx, streaks, proposal):
            ctx.summary.stopped_because = why
            return


def _proposers(ctx: _Context, streaks: _Streaks) -> list[Proposer]:
    """The chain the loop asks, in order: the grid alone for ``sampler.kind: grid``; else a stop once the valid
    space is used up, the model's turns, the tuner's own draw when the sampler stalls, and the sampler."""
    job = ctx.job
    if job.sampler.kind is SamplerKind.GRID:
        return [Grid(job)]
    valid = job.valid_space()
    rng = random.Random(f"{job.sampler.seed}:progress")
    return [*([SpaceUsedUp(valid)] if valid is not None else []),
            *([ModelTurns(ctx.guide)] if ctx.guide is not None else []),
            Progress(job, ctx.guide, valid, rng, lambda: streaks.stale), Sampler()]


def _why_stop(ctx: _Context, streaks: _Streaks, budget: int) -> str | None:
    """Why no further trial may start, besides the budget: the wall time, or proposals without end."""
    if why := ctx.out_of_time():
        return f"{why}: no further trial started"
    if streaks.asks >= 50 * budget:
        return f"{streaks.asks} proposals without reaching the budget (space mostly invalid?)"
    return None


def _trial(ctx: _Context, streaks: _Streaks, proposal: Proposal) -> str | None:
    """One proposal as one trial: invalid (recorded, never run), taken by another worker, a configuration measured
    already (its measurements reused), or run. Returns why the study stops, if it must."""
    t0 = time.monotonic()
    trial, proposer = _ask(ctx, proposal)
    cfg = ctx.job.space.suggest(trial)
    if proposal.params is not None and params_key(trial.params) != params_key(proposal.params):
        proposer = SAMPLER if proposer != "grid" else proposer  # another worker's queued proposal (they race)
    violations = check(cfg, ctx.job.model_profile(), ctx.job.cluster, ctx.job.workload.max_model_len)
    if violations:
        _invalid(ctx, trial, cfg, proposer, "; ".join(map(str, violations)), t0)
        streaks.stale += 1
        return None
    key = cfg.key()
    running = _claim(ctx.study, trial, key)
    measured = Ledger.read(ctx.job, ctx.database, ctx.name).measured  # after the claim: another worker's too
    if key in measured:
        _reuse(ctx, streaks, trial, cfg, proposer, measured[key], t0)
        streaks.stale += 1
        return None
    if running is not None:  # another worker is measuring it right now
        tell_taken(ctx.study, trial, running)
        ctx.summary.taken_elsewhere += 1
        streaks.stale += 1
        return None
    state, _, run = _run_trial(ctx, trial, cfg, proposer)
    return _count(ctx, streaks, state, run)


def _ask(ctx: _Context, proposal: Proposal) -> tuple[optuna.Trial, str]:
    """Ask Optuna for the trial of ``proposal``: its parameters enqueued first (the proposer written on the trial
    for Optuna's own views), or the sampler's draw."""
    if proposal.params is not None:  # not skip_if_exists: Optuna would skip a point the environment failed
        ctx.study.enqueue_trial(proposal.params, user_attrs={PROPOSER_ATTR: proposal.proposer})
    trial = ask(ctx.study, ctx.worker)
    if proposal.proposer == MODEL_DECLINED:
        trial.set_user_attr(DECLINED_ATTR, True)
    return trial, proposal.proposer


def _invalid(ctx: _Context, trial: optuna.Trial, cfg: DeploymentConfig, proposer: str, reason: str,
             t0: float) -> None:
    """A candidate a rule removes: recorded with the reason, told FAIL, never run."""
    ctx.database.record_invalid(ctx.name, trial.number, params=trial.params, config=cfg, reason=reason,
                                proposer=proposer)
    tell(ctx.study, trial, cfg, worst(ctx.job), TrialState.INVALID)
    ctx.summary.invalid += 1
    _report(ctx.summary, ctx.on_trial, TrialReport(trial.number, TrialState.INVALID, cfg, None, reason,
                                                   wall_s=time.monotonic() - t0))


def _reuse(ctx: _Context, streaks: _Streaks, trial: optuna.Trial, cfg: DeploymentConfig, proposer: str,
           prev: Measured, t0: float) -> None:
    """A configuration measured already: its measurements stand (a row that reuses them); Optuna is told its
    values once, and FAIL for every later proposal of it (the sampler must not learn one point thrice)."""
    job, key = ctx.job, cfg.key()
    outcome = Outcome(list(prev.values), prev.violation, None)
    reason = f"same configuration as trial {prev.number}; its measurements stand"
    tid = ctx.database.start_trial(ctx.name, trial.number, params=trial.params, config=cfg, topology=None,
                                   worker=ctx.worker, proposer=proposer, reused_from=prev.number)
    row = ctx.database.finish_trial(tid, TrialState.COMPLETE, objectives=outcome.as_dict(job),
                                    violation=outcome.violation, reason=reason)
    if key in streaks.told_again:
        tell_repeat_again(ctx.study, trial, cfg)
    else:
        tell_row(job, ctx.study, trial, row)
        streaks.told_again.add(key)
    ctx.summary.repeats += 1
    _report(ctx.summary, ctx.on_trial, TrialReport(trial.number, TrialState.COMPLETE, cfg, outcome, reason,
                                                   wall_s=time.monotonic() - t0))


def _count(ctx: _Context, streaks: _Streaks, state: TrialState, run: RunResult) -> str | None:
    """Count a trial that ran: a failure streak or an environment one may stop the study (said why)."""
    summary = ctx.summary
    if _is_environment_failure(state, run):  # not a configuration measured: no budget, no failure streak
        streaks.environment_failures += 1
        summary.environment_failed += 1
        if streaks.environment_failures >= ENVIRONMENT_FAILURES_TO_STOP:
            summary.environment_broken = True
            return (f"the environment keeps failing: {one_line(run.reason)} ({streaks.environment_failures} trials "
                    "in a row, each retried once; fix the cluster, then run the same command again)")
        return None
    streaks.environment_failures = streaks.stale = 0
    summary.executed += 1
    streaks.failures = 0 if state is TrialState.COMPLETE else streaks.failures + 1
    if state is not TrialState.COMPLETE:
        summary.failed += 1
    if streaks.failures >= ctx.job.budget.max_consecutive_failures:
        return (f"{streaks.failures} trials failed in a row (budget.max_consecutive_failures); last: {run.reason}")
    return None


def _claim(study: optuna.Study, trial: optuna.Trial, key: str) -> int | None:
    """Claim a configuration right before running it, against the other workers of the study: our key is written on
    the trial first, then the running trials' claims read; of two workers holding one configuration, the later
    reader sees the other and yields (both may yield; neither runs it twice). Returns the number of another
    worker's running trial that claimed it. The one read of Optuna's side: a claim must be visible before the
    trial's row exists (the row is written once the trial is placed and predicted), and the claims are a lock
    between workers, not results — what the study measured is read from our rows."""
    trial.set_user_attr(PICKED_ATTR, key)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if t.number != trial.number and t.user_attrs.get(PICKED_ATTR) == key:
            return t.number
    return None


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
    except Exception as e:  # noqa: BLE001 — a prediction is advice: without it the search starts at the fixed levels
        if (stop := interrupt_of(e)) is not None:
            raise stop from None
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
    except Exception as e:  # noqa: BLE001 — the curve is advice too: without it the search steps as before
        if (stop := interrupt_of(e)) is not None:
            raise stop from None
        return steps, predicted


def _view(ctx: _Context) -> str:
    """The view a trial's levels are predicted in: the one its parameters were fitted in. A hardware profile is
    fitted as sent (``advisor.profile``), and a real trial's levels are sent that way, so its knee search starts and
    aims by levels predicted as sent: over the 15 trials of two ~30B H200 studies the knee predicted as sent by
    the stored profile's probes fitted as sent was off the measured one by a median |log ratio| of 0.14,
    the steady fit's steady knee by 0.16 and the as-sent fit's steady knee by 0.40 (``research/level_views.py``;
    its levels under the knees: 7.2–12.5% as sent, 19.4–27.6% for the steady fit). Steady where the executor is the
    model itself (its levels are the steady state), where the levels start steady (``workload.level_start``: their
    first requests spread over a request's lifetime, so no burst to predict; the parameters still describe the
    hardware) and once the guide has re-fitted the parameters on the study's own levels (in the steady view)."""
    if ctx.executor.simulated or ctx.job.workload.level_start == "steady" or \
            (ctx.guide is not None and ctx.guide.samples):
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
    except Exception as e:  # a stop that landed inside a pydantic dump (``interrupt_of``); anything else goes on
        if (stop := interrupt_of(e)) is None:
            raise
        raise _stopped(ctx, trial, tid, stop) from None
    except KeyboardInterrupt as e:
        raise _stopped(ctx, trial, tid, e) from None
    note = None
    try:
        outcome, row = record(job, database, tid, run, first)
    except IllegalTransition:  # `advisor cleanup` closed the trial while it ran (and stopped its processes)
        outcome, row = worst(job), _closed_meanwhile(ctx, trial)
        note = (f"trial {trial.number} was closed while it ran ({one_line(row.reason)}); its result is not "
                "recorded")
    except Exception as e:
        if (stop := interrupt_of(e)) is None:
            raise
        stop.run = run  # type: ignore[attr-defined]  # what was measured is kept, as for a stop mid-level
        raise _stopped(ctx, trial, tid, stop) from None
    except KeyboardInterrupt as e:
        e.run = run  # type: ignore[attr-defined]
        raise _stopped(ctx, trial, tid, e) from None
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


def _stopped(ctx: _Context, trial: optuna.Trial, tid: int, e: KeyboardInterrupt) -> KeyboardInterrupt:
    """Close the trial a stop (Ctrl-C, SIGTERM, the wall time) cut short as interrupted, the levels it measured
    kept (``e.run``), and say why the run ended; the stop is returned for the caller to raise on."""
    job = ctx.job
    limit = f"wall time of {job.budget.wall_time_s:g} s reached" if isinstance(e, WallTimeReached) else None
    why = f"interrupted ({'; '.join(filter(None, (limit, str(e))))})" if limit or str(e) else \
        "interrupted (Ctrl-C or SIGTERM)"
    stopped = getattr(e, "run", None)
    try:
        stopped_row = record_interrupted(ctx.database, tid, stopped, why)
    except IllegalTransition:  # closed meanwhile by `advisor cleanup`: its row stands
        stopped_row = _closed_meanwhile(ctx, trial)
    tell_row(job, ctx.study, trial, stopped_row)
    kept = len(stopped.measurements) if stopped is not None else 0
    ctx.summary.stopped_because = (
        f"{limit}: trial {trial.number} {e} ({kept} measured level(s) kept, the trial marked interrupted); run "
        "the same command again to continue" if limit else "interrupted (Ctrl-C); run the same command again to "
        "continue")
    return e


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
    if _measured_extras(ctx, baseline=True) or ctx.out_of_time():
        return
    cfg = baseline_config(ctx.job)
    if cfg is None:
        return
    trial = ask(ctx.study, ctx.worker)  # no parameters: the baseline need not lie in the search space
    ctx.summary.baseline = trial.number
    _run_trial(ctx, trial, cfg, "baseline", extra="baseline")


def _measured_extras(ctx: _Context, *, baseline: bool) -> list[Row]:
    """The measured baseline trials (``baseline``), else the measured repeats, from the ledger."""
    rows = Ledger.read(ctx.job, ctx.database, ctx.name).measured_rows()
    return [r for r in rows if (r.baseline and r.repeat_of is None if baseline else r.repeat_of is not None)]


def _repeats(ctx: _Context) -> None:
    """Deploy the best ``budget.repeat_top`` deployments and the baseline again (fresh deploys, fresh prompts):
    ``advisor best`` reports the run-to-run spread from these. Each is repeated once per study."""
    study, job = ctx.study, ctx.job
    done = {r.repeat_of for r in _measured_extras(ctx, baseline=False)}
    search = [r for r in Ledger.read(job, ctx.database, ctx.name).measured_rows()
              if not r.baseline and r.repeat_of is None and r.state is TrialState.COMPLETE
              and r.told is not None and r.told.feasible]
    top = sorted(search, key=lambda r: r.told.values[0] if r.told else 0.0, reverse=True)[: job.budget.repeat_top]
    todo = [r for r in [*top, *_measured_extras(ctx, baseline=True)] if r.number not in done]
    for original in todo:
        if why := ctx.out_of_time():  # a later run repeats what is left
            ctx.summary.stopped_because = f"budget reached; {why}: not every repeat ran (run the same command " \
                "again to repeat the rest)"
            return
        row = db.queries.get_trial(ctx.database, ctx.name, original.number)
        if row is None or row.config is None:
            continue
        if original.params:
            study.enqueue_trial(dict(original.params), user_attrs={PROPOSER_ATTR: "repeat"})
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
