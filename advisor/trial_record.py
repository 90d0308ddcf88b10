"""How a trial's end reaches the two stores: our row first (``record``), then Optuna told from it (``tell_row``),
and the attributes the tuner writes on Optuna's side (for Optuna's own views; the tuner decides from our rows,
``advisor.proposers.ledger``).

Recording and telling are two transactions. The row is the truth: ``tell_row`` is the one writer of what Optuna
holds for a measured trial, run by the tuner right after the row and by a resuming tuner for a trial whose row a
tuner killed between the two wrote (``advisor.recovery``); telling again what was told changes nothing."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import optuna

import db
from advisor.job import TuningJob
from advisor.objectives import INFEASIBLE, Outcome, objective_names, score, worst
from executors import FailureKind, RunResult
from search_spaces import DeploymentConfig, TrialState

CONFIG_KEY_ATTR = "advisor_config_key"
#: Where a trial's constraint values live for Optuna's tools: the system attribute that samplers'
#: ``constraints_func`` writes (``optuna.samplers._base._CONSTRAINTS_KEY``), a list of floats, feasible when each
#: is ≤ 0. optuna-dashboard reads only this key; Optuna's ``FrozenTrial.constraints`` (best trial, Pareto front,
#: samplers, plots) reads it too. Ours holds one value: the SLO violation (``advisor.objectives.Outcome``).
#: optuna-dashboard's *best trial* is ``storage.get_best_trial``, which ranks values only: it is ``advisor best``
#: while some trial is feasible and out-measures every infeasible one's operating point (``tests/test_ledger.py``).
OPTUNA_CONSTRAINTS_KEY = "constraints"
STATE_ATTR = "advisor_state"
#: True on a trial whose deployment ran and whose result judges its configuration: the row's ``executed``.
EXECUTED_ATTR = "advisor_executed"
#: The config key a worker is about to run, written before it deploys (and before it re-checks the study): of two
#: workers holding the same configuration, at least one sees the other's key (``advisor.tune._taken_elsewhere``).
PICKED_ATTR = "advisor_picked_key"
#: "baseline" or "repeat": a measured trial outside the search (not counted in ``budget.trials``).
EXTRA_ATTR = "advisor_extra"
REPEAT_OF_ATTR = "advisor_repeat_of"
#: Set on a trial whose first attempt failed for the environment: that attempt's reason.
ENVIRONMENT_RETRY_ATTR = "advisor_environment_retry"
#: "environment" on a trial told FAIL because the cluster failed it twice (its configuration is unjudged).
FAILURE_ATTR = "advisor_failure"

log = logging.getLogger(__name__)


def one_line(text: str | None, limit: int = 300) -> str:
    """An executor's reason as a progress line can show it (reasons may carry a traceback's lines)."""
    line = " ".join((text or "no reason given").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def record(job: TuningJob, database: db.Database, tid: int, run: RunResult,
            first: RunResult | None = None) -> tuple[Outcome, db.Trial]:
    """Store ``run`` and return its outcome and the row as stored; ``first`` is an earlier attempt of the same
    trial the environment failed, whose reason stays in the trial's reason (and its log tail, when the retry left
    none) — the one place a user looks."""
    timings = _timings(run)
    retry = f"the first attempt failed for the environment ({one_line(first.reason)})" if first else None
    if run.ok and run.measurements:
        outcome = score(job, run.measurements)
        row = database.finish_trial(tid, TrialState.COMPLETE, measurements=run.measurements, timings=timings,
                                    objectives=outcome.as_dict(job), violation=outcome.violation,
                                    reason=f"retried on a fresh placement: {retry}" if retry else None,
                                    log_tail=first.log_tail if first else None, executed=True)
        return outcome, row
    outcome = worst(job)
    reason = run.reason or "the executor returned no measurements"
    if retry:
        reason += f" (retried on a fresh placement: {retry})"
    row = database.finish_trial(tid, TrialState.FAILED, measurements=run.measurements, timings=timings,
                                objectives=None, violation=INFEASIBLE,
                                failure_kind=run.failure.value if run.failure else "no_measurements",
                                reason=reason, log_tail=run.log_tail or (first.log_tail if first else None),
                                executed=run.failure is not FailureKind.ENVIRONMENT)
    return outcome, row


def record_interrupted(database: db.Database, tid: int, run: RunResult | None, why: str) -> db.Trial:
    """Close a trial stopped mid-run (Ctrl-C, SIGTERM, a wall-clock limit) as INTERRUPTED with the levels ``run``
    measured before the stop: a level measured is a level measured (calibration and the dashboard use it); no
    objective is scored from a knee search cut short."""
    levels = run.measurements if run is not None else []
    kept = f"; {len(levels)} level(s) measured before it kept" if levels else ""
    return database.finish_trial(tid, TrialState.INTERRUPTED, measurements=levels,
                                 timings=_timings(run) if run is not None else None,
                                 failure_kind=FailureKind.INTERRUPTED.value, reason=f"{why}{kept}")


def _timings(run: RunResult) -> dict[str, float]:
    return {k: getattr(run.timings, k) for k in ("deploy_s", "warmup_s", "measure_s", "teardown_s")}


def tell(study: optuna.Study, trial: optuna.Trial, cfg: DeploymentConfig | None, outcome: Outcome | None,
          state: TrialState, *, executed: bool = True) -> None:
    """Every outcome of a deployment reaches Optuna as COMPLETE with a constraint, so samplers learn from failures
    too. An invalid candidate (a rule removed it; the valid-space sampler steers around those) is told FAIL: it
    has no result, and Optuna's own views (optuna-dashboard) would show a COMPLETE one as a trial with values 0.

    Told at most once: a resuming tuner may have told this trial from its row already (``tell_row``); the values
    it told are these, so the second tell is dropped, not raised."""
    try:
        trial.set_user_attr(STATE_ATTR, state.value)
        trial.set_user_attr(EXECUTED_ATTR, executed and state in (TrialState.COMPLETE, TrialState.FAILED))
        if cfg is not None:
            trial.set_user_attr(CONFIG_KEY_ATTR, cfg.key())
        if state is TrialState.INVALID or outcome is None:  # no result, or none to tell (``told_outcome``)
            study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            return
        _set_constraint(study, trial, outcome.violation)  # the same value again after a killed tuner: harmless
        study.tell(trial, outcome.values, skip_if_finished=True)
    except optuna.exceptions.UpdateFinishedTrialError:
        log.info("trial %d was already told (by a resuming tuner)", trial.number)


def _set_constraint(study: optuna.Study, trial: optuna.Trial, violation: float) -> None:
    storage = trial.storage  # the study's storage, through its public methods
    tid = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name),
                                                          trial.number)
    storage.set_trial_system_attr(tid, OPTUNA_CONSTRAINTS_KEY, [float(violation)])


def tell_environment_failure(study: optuna.Study, trial: optuna.Trial) -> None:
    """FAIL, not COMPLETE-infeasible: the sampler must not learn that the configuration is bad, and may propose
    it again. No config key either (``_taken`` and the dedup read it as "measured")."""
    try:
        trial.set_user_attr(STATE_ATTR, TrialState.FAILED.value)
        trial.set_user_attr(EXECUTED_ATTR, False)
        trial.set_user_attr(FAILURE_ATTR, FailureKind.ENVIRONMENT.value)
        study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    except optuna.exceptions.UpdateFinishedTrialError:
        log.info("trial %d was already told (by a resuming tuner)", trial.number)


def tell_repeat_again(study: optuna.Study, trial: optuna.Trial, cfg: DeploymentConfig) -> None:
    """A measured configuration proposed a third time or more: told FAIL (ignored by the samplers), marked as
    a repeat; its measurements stand in the first trial that ran it."""
    trial.set_user_attr(CONFIG_KEY_ATTR, cfg.key())
    trial.set_user_attr(STATE_ATTR, TrialState.COMPLETE.value)
    trial.set_user_attr(FAILURE_ATTR, "repeat")
    trial.set_user_attr(EXECUTED_ATTR, False)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def tell_taken(study: optuna.Study, trial: optuna.Trial, other: int) -> None:
    """A pick another worker is measuring (trial ``other``) right now: not run twice. Told FAIL (not judged, not
    counted toward the budget, ignored by the samplers); nothing is recorded in our tables, since nothing ran."""
    trial.set_user_attr(STATE_ATTR, TrialState.COMPLETE.value)
    trial.set_user_attr(FAILURE_ATTR, f"taken: trial {other} is measuring this configuration")
    trial.set_user_attr(EXECUTED_ATTR, False)
    study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)


def tell_row(job: TuningJob, study: optuna.Study, trial: optuna.Trial, row: db.Trial) -> None:
    """Tell Optuna what our finished row holds: the recorded objectives in the job's objective order, the recorded
    violation, the user attributes. The tuner calls it right after the row; a resuming tuner for a row whose tell a
    killed tuner never made (then a live worker about to tell the same trial finds it told and drops its own)."""
    try:
        if row.state is TrialState.FAILED and row.failure_kind == FailureKind.ENVIRONMENT.value:
            tell_environment_failure(study, trial)
            return
        if row.state is TrialState.INTERRUPTED:
            study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            return
        outcome = told_outcome(job, row.state, row.objectives, row.violation)
        tell(study, trial, row.config, outcome, row.state, executed=row.executed)
    except optuna.exceptions.UpdateFinishedTrialError:
        log.info("trial %d was told by its own tuner meanwhile", trial.number)


def told_outcome(job: TuningJob, state: TrialState, objectives: Mapping[str, float | None] | None,
                 violation: float | None) -> Outcome | None:
    """What Optuna is told for a finished row (its state, objectives and violation): its recorded objectives in the
    job's order and its violation; a failed or invalid row, the job's worst outcome (what ``record`` and
    ``record_invalid`` stored it as).

    None — told FAIL — for a complete row that lacks an objective the job asks for (a study continued with another
    metric): no number is invented for it. A made-up value is a measurement to the samplers, and no fixed one is
    safe (0.0 is the worst throughput but the best latency); FAIL is the state samplers skip. The tuner's ledger
    reads the same outcomes (``advisor.proposers.ledger``), so what is told and what the loop decides from agree."""
    if state is TrialState.COMPLETE and objectives:
        values = [objectives.get(n) for n in objective_names(job)]
        if any(v is None for v in values):
            return None
        return Outcome([float(v) for v in values if v is not None], violation if violation is not None else 0.0,
                       None)
    return worst(job)
