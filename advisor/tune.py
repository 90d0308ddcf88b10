"""The tune loop: ask → suggest → validate → place → evaluate → record → tell.

Kept short on purpose; what a trial's outcome means for Optuna is in ``objectives``, what is stored is
in ``db``, and how a deployment runs is the executor's business. Nothing a trial does can stop the loop:
a failure is a recorded state, not an exception.
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from datetime import UTC, datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna

import db
from advisor.errors import BadInput
from advisor.executor_factory import make_executor, model_params
from advisor.guide import MAX_FIT_TRIALS, PROPOSER_ATTR, ModelGuide, enqueue_turn, make_guide
from advisor.job import SamplerKind, TuningJob
from advisor.objectives import INFEASIBLE, Outcome, score, worst
from advisor.study import open_study, redact_url
from executors import Executor, RunResult, place
from executors.cleanup import cleanup_resources
from search_spaces import DeploymentConfig, TrialState, check

CONFIG_KEY_ATTR = "advisor_config_key"
STATE_ATTR = "advisor_state"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0


@dataclass
class TrialReport:
    """What the CLI's progress line shows after each trial."""

    number: int
    state: TrialState
    config: DeploymentConfig | None
    outcome: Outcome | None
    reason: str | None = None
    executed: bool = False
    wall_s: float = 0.0


@dataclass
class TuneSummary:
    study: str
    storage: str
    executed: int = 0
    invalid: int = 0
    failed: int = 0
    repeats: int = 0
    interrupted_found: int = 0
    stopped_because: str = "budget reached"
    reports: list[TrialReport] = field(default_factory=list)


def _grid_points(job: TuningJob, study: optuna.Study) -> Iterator[dict[str, Any]]:
    """Valid grid points in a seeded shuffled order (the 'shuffled grid' baseline), minus those the study
    already holds — so a continued grid study picks up where it stopped."""
    model, wl = job.model_profile(), job.workload
    pts = [p for p, cfg in job.space.enumerate() if not check(cfg, model, job.cluster, wl.max_model_len)]
    random.Random(job.sampler.seed).shuffle(pts)
    done = {json.dumps(t.params, sort_keys=True, default=str) for t in study.get_trials(deepcopy=False)}
    yield from (p for p in pts if json.dumps(p, sort_keys=True, default=str) not in done)


class _Heartbeat:
    """Keeps a running trial's heartbeat fresh so another worker can tell it from a dead one."""

    def __init__(self, database: db.Database, trial_id: int) -> None:
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(database, trial_id), daemon=True)

    def _run(self, database: db.Database, trial_id: int) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                database.heartbeat(trial_id)
            except Exception:  # noqa: BLE001 — a missed beat is not worth a trial
                pass

    def __enter__(self) -> _Heartbeat:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(timeout=5)


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
    url = storage or job.storage
    name = study_name or job.name
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
        database.upsert_study(
            name, job.to_document(), description=job.description, executor=executor.kind,
            engine_version=executor.engine_version, hardware=job.cluster.describe(), optuna_study_name=name,
        )
        summary.interrupted_found = _close_stale(database, study, name, ray_address or job.executor.ray_address)
        _loop(job, study, database, executor, name, budget, summary, on_trial)
        return summary
    finally:
        database.close()
        if own_executor:
            executor.close()


def _executed(study: optuna.Study) -> int:
    """Trials that ran (or are running, in any worker): the study's budget counts them, so several
    workers sharing a study stop together instead of each running a whole budget."""
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
    ran = sum(1 for t in study.get_trials(deepcopy=False, states=done) if t.user_attrs.get("advisor_executed"))
    return ran + len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def _loop(
    job: TuningJob, study: optuna.Study, database: db.Database, executor: Executor, name: str, budget: int,
    summary: TuneSummary, on_trial: Callable[[TrialReport], None] | None,
) -> None:
    model, cluster, wl = job.model_profile(), job.cluster, job.workload
    seen = {
        t.user_attrs[CONFIG_KEY_ATTR]: t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if CONFIG_KEY_ATTR in t.user_attrs and t.user_attrs.get("advisor_executed")
    }
    grid = _grid_points(job, study) if job.sampler.kind is SamplerKind.GRID else None
    guide = _resume_guide(job, study, database, name)
    started = time.monotonic()
    asks, max_asks = 0, 50 * budget
    consecutive_failures = 0
    worker = f"{socket.gethostname()}:{os.getpid()}"
    while (executed := _executed(study)) < budget:
        if job.budget.wall_time_s and time.monotonic() - started > job.budget.wall_time_s:
            summary.stopped_because = f"wall time of {job.budget.wall_time_s:g} s reached"
            return
        if asks >= max_asks:
            summary.stopped_because = f"{asks} proposals without reaching the budget (space mostly invalid?)"
            return
        if grid is not None:
            point = next(grid, None)
            if point is None:
                summary.stopped_because = "grid exhausted"
                return
            study.enqueue_trial(point, skip_if_exists=True)
        else:
            enqueue_turn(guide, study, executed, lambda: _taken(guide, study))
        asks += 1
        t0 = time.monotonic()
        trial = study.ask()
        proposer = trial.user_attrs.get(PROPOSER_ATTR) or ("grid" if grid is not None else "sampler")
        cfg = job.space.suggest(trial)
        violations = check(cfg, model, cluster, wl.max_model_len)
        if violations:
            reason = "; ".join(map(str, violations))
            database.record_invalid(name, trial.number, params=trial.params, config=cfg, reason=reason,
                                    proposer=proposer)
            _tell(study, trial, cfg, worst(job), TrialState.INVALID)
            summary.invalid += 1
            _report(summary, on_trial, TrialReport(trial.number, TrialState.INVALID, cfg, None, reason,
                                                   wall_s=time.monotonic() - t0))
            continue
        key = cfg.key()
        if key in seen:
            prev = seen[key]
            outcome = Outcome(list(prev.values), _constraint(prev), None)
            reason = f"same configuration as trial {prev.number}; its measurements stand"
            tid = database.start_trial(name, trial.number, params=trial.params, config=cfg, topology=None,
                                       worker=worker, proposer=proposer)
            database.finish_trial(tid, TrialState.COMPLETE, objectives=outcome.as_dict(job),
                                  violation=outcome.violation, reason=reason)
            _tell(study, trial, cfg, outcome, TrialState.COMPLETE, executed=False)
            summary.repeats += 1
            _report(summary, on_trial, TrialReport(trial.number, TrialState.COMPLETE, cfg, outcome, reason,
                                                   wall_s=time.monotonic() - t0))
            continue
        topo = place(cfg, cluster)
        tid = database.start_trial(name, trial.number, params=trial.params, config=cfg,
                                   topology=topo.to_dict(), worker=worker, proposer=proposer)
        try:
            with _Heartbeat(database, tid):
                run = executor.evaluate(topo, wl, on_started=lambda res, tid=tid: database.record_resources(tid, res))
        except KeyboardInterrupt:
            database.finish_trial(tid, TrialState.INTERRUPTED, reason="interrupted by the user (Ctrl-C)")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            summary.stopped_because = "interrupted (Ctrl-C); run the same command again to continue"
            raise
        state, outcome = _record(job, database, tid, run)
        _tell(study, trial, cfg, outcome, state)
        summary.executed += 1
        if state is TrialState.COMPLETE:
            seen[key] = _frozen(study, trial.number)
            consecutive_failures = 0
            if guide is not None:
                guide.observe(cfg, run.measurements)
        else:
            summary.failed += 1
            consecutive_failures += 1
        _report(summary, on_trial, TrialReport(trial.number, state, cfg, outcome, run.reason, executed=True,
                                               wall_s=time.monotonic() - t0))
        if consecutive_failures >= job.budget.max_consecutive_failures:
            summary.stopped_because = (
                f"{consecutive_failures} trials failed in a row (budget.max_consecutive_failures); "
                f"last: {run.reason}"
            )
            return


def _resume_guide(job: TuningJob, study: optuna.Study, database: db.Database, name: str) -> ModelGuide | None:
    """The model guide of a guided study, re-fitted to what the study has measured so far (a continued study
    picks up its calibration and its count of model turns)."""
    guide = make_guide(job, model_params(job))
    if guide is None:
        return None
    trials = study.get_trials(deepcopy=False)
    guide.turns = sum(1 for t in trials if t.user_attrs.get(PROPOSER_ATTR) == "model")
    done = [t.number for t in trials if t.state is optuna.trial.TrialState.COMPLETE
            and t.user_attrs.get("advisor_executed") and t.user_attrs.get(STATE_ATTR) == TrialState.COMPLETE.value]
    for number in done[-MAX_FIT_TRIALS:]:
        t = db.queries.get_trial(database, name, number)
        if t is not None and t.config is not None:
            guide.observe(t.config, list(t.measurements), refit=False)
    guide.refit()
    return guide


def _taken(guide: ModelGuide, study: optuna.Study) -> set[str]:
    """Config keys the model must not propose: measured, failed, or asked by a worker and not yet told."""
    taken = set()
    for t in study.get_trials(deepcopy=False):
        if CONFIG_KEY_ATTR in t.user_attrs:
            taken.add(t.user_attrs[CONFIG_KEY_ATTR])
        elif t.state in (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING) and t.params:
            try:
                taken.add(guide.config_of(t.params).key())
            except ValueError:
                continue
    return taken


def _frozen(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    return study._storage.get_trial(study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number))


def _constraint(t: optuna.trial.FrozenTrial) -> float:
    return max((v for k, v in t.system_attrs.items() if k.startswith("constraints")), default=0.0)


def _record(job: TuningJob, database: db.Database, tid: int, run: RunResult) -> tuple[TrialState, Outcome]:
    timings = {k: getattr(run.timings, k) for k in ("deploy_s", "warmup_s", "measure_s", "teardown_s")}
    if run.ok and run.measurements:
        outcome = score(job, run.measurements)
        database.finish_trial(tid, TrialState.COMPLETE, measurements=run.measurements, timings=timings,
                              objectives=outcome.as_dict(job), violation=outcome.violation)
        return TrialState.COMPLETE, outcome
    outcome = worst(job)
    database.finish_trial(tid, TrialState.FAILED, measurements=run.measurements, timings=timings,
                          objectives=None, violation=INFEASIBLE,
                          failure_kind=run.failure.value if run.failure else "no_measurements",
                          reason=run.reason or "the executor returned no measurements", log_tail=run.log_tail)
    return TrialState.FAILED, outcome


def _tell(study: optuna.Study, trial: optuna.Trial, cfg: DeploymentConfig, outcome: Outcome, state: TrialState,
          *, executed: bool = True) -> None:
    """Every outcome reaches Optuna as COMPLETE with a constraint, so samplers learn from failures too."""
    trial.set_user_attr(STATE_ATTR, state.value)
    trial.set_user_attr("advisor_executed", executed and state in (TrialState.COMPLETE, TrialState.FAILED))
    trial.set_user_attr(CONFIG_KEY_ATTR, cfg.key())
    trial.set_constraint("slo", outcome.violation)
    study.tell(trial, outcome.values)


def _worker_dead(worker: str | None) -> bool:
    """A worker on this host whose process is gone (``host:pid``); other hosts are judged by heartbeat."""
    host, _, pid = (worker or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return int(pid) == os.getpid()  # a record of our own pid is from a previous life of this pid


def close_interrupted(database: db.Database, name: str, *, stale_after_s: float = STALE_AFTER_S,
                      ray_address: str | None = None) -> list[tuple[int, list[str]]]:
    """Trials left RUNNING by a tuner that died (dead local pid, or no heartbeat for ``stale_after_s``):
    clean up what their resources record names, then mark them interrupted. Returns (trial, actions)."""
    stale = {t.id: t for t in database.stale_trials(name, stale_after_s)}
    stale |= {t.id: t for t in database.running_trials(name) if _worker_dead(t.worker)}
    out = []
    for t in sorted(stale.values(), key=lambda t: t.number):
        actions = cleanup_resources(t.resources or {}, ray_address=ray_address)
        why = "the tuner running this trial stopped (" + ("its process is gone" if _worker_dead(t.worker)
                                                           else f"no heartbeat for {stale_after_s:g} s") + ")"
        database.mark_interrupted(t.id, why + (": " + "; ".join(actions) if actions else ""))
        out.append((t.number, actions))
    return out


def _close_stale(database: db.Database, study: optuna.Study, name: str, ray_address: str | None) -> int:
    """Close interrupted trials here and tell Optuna they failed, so the numbers and budget stay right."""
    closed = {n for n, _ in close_interrupted(database, name, ray_address=ray_address)}
    now = datetime.now(UTC)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        # asked but never recorded by a tuner that died at once: only once it is old (another worker's trial
        # sits in this state for the milliseconds between ask and start_trial)
        started = t.datetime_start.astimezone(UTC) if t.datetime_start else None  # Optuna: naive local time
        orphan = started is not None and (now - started).total_seconds() > STALE_AFTER_S and \
            db.queries.get_trial(database, name, t.number) is None
        if t.number in closed or orphan:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    return len(closed)


def _report(summary: TuneSummary, cb: Callable[[TrialReport], None] | None, r: TrialReport) -> None:
    summary.reports.append(r)
    if cb is not None:
        cb(r)


__all__ = ["BadInput", "TrialReport", "TuneSummary", "tune"]
