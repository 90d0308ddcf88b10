"""A study outlives its tuners: heartbeats while a trial runs, and, when a tuner starts, closing what a dead one
left RUNNING (cleaning up what its resources record names) and telling Optuna what the database already holds."""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import UTC, datetime

import optuna

import db
from advisor.job import TuningJob
from advisor.study import trial_by_number
from advisor.trial_record import tell_row
from executors.processes.cleanup import cleanup_resources
from search_spaces import IllegalTransition, TrialState

HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
#: Optuna user attribute: the worker (``host:pid``) that asked for the trial, written at once after the ask, so
#: that a trial asked by a tuner killed before it recorded anything is closed as soon as that worker is known dead.
WORKER_ATTR = "advisor_worker"
#: How long a resuming tuner waits before it closes an asked trial no worker has marked (``close_stale``).
UNMARKED_GRACE_S = 3.0


def ask(study: optuna.Study, worker: str) -> optuna.trial.Trial:
    """A new trial, the asking worker recorded on it (see ``WORKER_ATTR``) in the transaction that creates it.

    ``study.ask()`` then ``set_user_attr`` are two transactions: a database that stops between them (as
    tests/test_db_outage.py's outage past the window does) leaves a RUNNING trial with no worker and no record, which
    a resume seconds later can close only by age (``STALE_AFTER_S``). So a new trial is added whole
    (``Study.add_trial`` of a RUNNING trial carrying the attribute) and found again as the newest RUNNING trial of
    this worker. An enqueued trial (a baseline, a repeat, a proposer's point) is still taken by ``study.ask()``,
    which pops it, and then marked: a stop between those two leaves a trial without a worker, closed by age."""
    running = (optuna.trial.TrialState.RUNNING,)
    if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
        trial = study.ask()
        trial.set_user_attr(WORKER_ATTR, worker)
        return trial
    study.add_trial(optuna.trial.create_trial(state=running[0], user_attrs={WORKER_ATTR: worker}))
    mine = [t.number for t in study.get_trials(deepcopy=False, states=running)
            if t.user_attrs.get(WORKER_ATTR) == worker]
    return trial_by_number(study, max(mine))


class Heartbeat:
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

    def __enter__(self) -> Heartbeat:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(timeout=5)


def worker_dead(worker: str | None) -> bool:
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


def worker_alive(worker: str | None) -> bool:
    """A worker on this host whose process runs (and is not this one): its trial is its own, whatever its
    heartbeat says (a tuner busy in a long write, or ``advisor cleanup --stale-after 0``)."""
    host, _, pid = (worker or "").rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid() and not worker_dead(worker)


def close_interrupted(database: db.Database, name: str, *, stale_after_s: float = STALE_AFTER_S,
                      ray_address: str | None = None) -> list[tuple[int, list[str]]]:
    """Trials left RUNNING by a tuner that died (dead local pid, or no heartbeat for ``stale_after_s`` from a
    worker not known alive on this host): clean up what their resources record names, then mark them
    interrupted. Returns (trial, actions)."""
    stale = {t.id: t for t in database.stale_trials(name, stale_after_s) if not worker_alive(t.worker)}
    stale |= {t.id: t for t in database.running_trials(name) if worker_dead(t.worker)}
    out = []
    for t in sorted(stale.values(), key=lambda t: t.number):
        actions = cleanup_resources(t.resources or {}, ray_address=ray_address)
        why = "the tuner running this trial stopped (" + ("its process is gone" if worker_dead(t.worker)
                                                           else f"no heartbeat for {stale_after_s:g} s") + ")"
        try:
            database.mark_interrupted(t.id, why + (": " + "; ".join(actions) if actions else ""))
        except IllegalTransition:  # its tuner (alive after all) recorded it meanwhile: its row stands
            continue
        out.append((t.number, actions))
    return out


def tell_closed(job: TuningJob, database: db.Database, study: optuna.Study, name: str) -> None:
    """Tell Optuna every trial it holds RUNNING whose row is closed (by ``close_interrupted``, or recorded by a
    tuner killed before it told): recording and telling are two transactions, and the row is the truth."""
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        row = db.queries.get_trial(database, name, t.number)
        if row is not None and row.state is not TrialState.RUNNING:
            tell_row(job, study, trial_by_number(study, t.number), row)


def close_stale(job: TuningJob, database: db.Database, study: optuna.Study, name: str,
                 ray_address: str | None) -> int:
    """Close interrupted trials here and bring Optuna in line with the database, so the numbers and budget stay
    right: recording (our database) and telling (Optuna) are two transactions, and a tuner killed between them
    leaves an Optuna trial RUNNING whose result is already stored — it is told from the record here."""
    closed = {n for n, _ in close_interrupted(database, name, ray_address=ray_address)}
    tell_closed(job, database, study, name)
    now = datetime.now(UTC)
    unmarked = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        row = db.queries.get_trial(database, name, t.number)
        # asked but never recorded by a tuner that died at once: at once when the worker that asked is known
        # dead, else only once it is old (another worker's trial sits in this state for the milliseconds between
        # ask and start_trial)
        started = t.datetime_start.astimezone(UTC) if t.datetime_start else None  # Optuna: naive local time
        old = started is not None and (now - started).total_seconds() > STALE_AFTER_S
        if row is None and (old or worker_dead(t.user_attrs.get(WORKER_ATTR))):
            study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        elif row is None and WORKER_ATTR not in t.user_attrs:
            unmarked.append(t.number)
    if unmarked:
        # an enqueued trial popped by a tuner killed before it marked the trial as its own: a live worker marks
        # its trial milliseconds after the ask, so one still unmarked and unrecorded after a pause is orphaned
        time.sleep(UNMARKED_GRACE_S)
        for n in unmarked:
            t = study.get_trials(deepcopy=False)[n]
            if t.state is optuna.trial.TrialState.RUNNING and WORKER_ATTR not in t.user_attrs and \
                    db.queries.get_trial(database, name, n) is None:
                study.tell(n, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    return len(closed)
