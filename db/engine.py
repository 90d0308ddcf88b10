"""The ``Database``: our tables in one database, and every write to them.

``connect(url)`` opens the database (SQLite file or PostgreSQL; ``db.connection`` has the URLs, engines and
migrations), brings our ``advisor_*`` tables to the newest schema with Alembic, and returns a ``Database``.
Every write is one transaction: a trial is either finished with all its measurements or not at all. Reads are
``db.queries``; the conversion between rows and values is ``db.mapping``.

Concurrency: several tuner workers may share one database. On PostgreSQL the rows a write touches are locked
(``SELECT … FOR UPDATE``) and migrations run under an advisory lock; on SQLite every write transaction is
``BEGIN IMMEDIATE`` (one writer at a time, others wait up to ``SQLITE_BUSY_TIMEOUT_S``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from db.budget import budget_used
from db.connection import (
    SQLITE_BUSY_TIMEOUT_S,
    SUPPORTED_BACKENDS,
    make_engine,
    memory_copy,
    normalize_url,
    one_line,
    optuna_storage,
    schema_revisions,
    upgrade,
)
from db.mapping import (
    check_levels,
    check_objectives,
    check_timings,
    clip,
    measurement_row,
    nan_to_none,
    study_id,
    text,
    trial,
)
from db.models import ExportRow, ExternalMeasurementRow, HardwareProfileRow, MeasurementRow, StudyRow, TrialRow
from db.outage import retry_methods
from db.redaction import redact_url
from db.rows import DatabaseUnavailable, ExternalPoint, HardwareProfile, Trial, UnknownTrial
from search_spaces import DeploymentConfig, Measurement, TrialState, transition

#: A longer log tail is cut to its last this-many characters.
LOG_TAIL_MAX_CHARS = 64_000

__all__ = ["LOG_TAIL_MAX_CHARS", "SQLITE_BUSY_TIMEOUT_S", "SUPPORTED_BACKENDS", "Database", "connect", "normalize_url",
           "optuna_storage"]


def connect(url: str, *, echo: bool = False, read_only: bool = False) -> Database:
    """Open the database at ``url`` and migrate our tables to the newest schema (safe from several processes).

    ``read_only`` (the dashboard): never write, not even a migration. A database at the newest schema is read as
    it is; an older SQLite file is read from a migrated copy in memory (``Database.snapshot`` says so: the file
    stays byte-identical, and what is written to it afterwards is not seen); an older server database is still
    migrated (CI's empty PostgreSQL database must show "No studies").

    Raises ``DatabaseUnavailable`` (one line, no password) when it cannot: not a supported URL, server
    unreachable, refused login, a folder that cannot be created, or a schema newer than this code knows.
    """
    try:
        normalized = normalize_url(url)
        engine = make_engine(normalized, echo=echo)
    except ValueError as e:
        raise DatabaseUnavailable(str(e)) from None
    except OSError as e:
        raise DatabaseUnavailable(f"cannot create the database file: {e.strerror or e}") from e
    snapshot = None
    try:
        if not read_only:
            upgrade(engine)
        elif (revs := schema_revisions(engine))[0] != revs[1]:
            if engine.dialect.name != "sqlite":  # a server database cannot be copied cheaply: migrated as before
                upgrade(engine)
            else:
                old, engine = engine, memory_copy(engine)
                old.dispose()
                upgrade(engine)
                snapshot = f"a copy of a database at the older schema {revs[0] or '(none)'}, migrated in memory"
    except BaseException as e:
        from alembic.util import CommandError  # imported by ``upgrade`` already

        engine.dispose()
        if isinstance(e, DBAPIError):
            raise DatabaseUnavailable(one_line(e.orig, url)) from e
        if isinstance(e, CommandError):
            raise DatabaseUnavailable(
                f"its advisor_* schema is at a revision this deploy-advisor does not know ({one_line(e, None)}); "
                "use the deploy-advisor version that wrote it, or a newer one"
            ) from e
        raise
    return Database(engine, snapshot=snapshot)


class Database:
    """Our tables in one database. Build it with ``connect(url)``; ``close()`` when done (or use ``with``)."""

    def __init__(self, engine: Engine, snapshot: str | None = None) -> None:
        self._engine = engine
        self._writer = engine.execution_options(advisor_write=True)
        self.backend: str = engine.dialect.name
        #: Set when a read-only open reads a migrated copy, not the database itself (``connect``): what it is.
        self.snapshot = snapshot

    # -- identity

    @property
    def url(self) -> str:
        """The full URL, password included (hand it to Optuna's storage, never print it)."""
        return self._engine.url.render_as_string(hide_password=False)

    @property
    def url_for_display(self) -> str:
        """The URL with the password replaced by ``***``."""
        return redact_url(self.url)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database({self.url_for_display!r})"

    # -- sessions (package-private: ``db.queries`` reads through ``_read``)

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self._engine, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with Session(self._writer, expire_on_commit=False) as s, s.begin():
            yield s

    def _now(self, s: Session) -> datetime:
        """The database server's clock on PostgreSQL (one clock for every worker), this machine's on SQLite."""
        if self.backend == "postgresql":
            now = s.scalar(select(func.now()))
            assert now is not None
            return now.astimezone(UTC)
        return datetime.now(UTC)

    def _insert(self, table: Any) -> Any:
        """INSERT with the backend's ``ON CONFLICT`` (both backends have it)."""
        return (pg_insert if self.backend == "postgresql" else sqlite_insert)(table)

    @staticmethod
    def _locked_trial(s: Session, trial_id: int) -> TrialRow:
        row = s.get(TrialRow, trial_id, with_for_update=True)
        if row is None:
            raise UnknownTrial(f"no trial with id {trial_id}")
        return row

    # -- studies

    def upsert_study(
        self,
        name: str,
        job: Mapping[str, Any],
        *,
        description: str | None = None,
        executor: str | None = None,
        engine_version: str | None = None,
        hardware: str | None = None,
        optuna_study_name: str | None = None,
    ) -> int:
        """Create the study or update it (``job`` is replaced; a keyword left ``None`` keeps what is stored)."""
        if not name or not name.strip():
            raise ValueError("a study needs a non-empty name")
        if len(name) > 200:
            raise ValueError(f"a study name has at most 200 characters, got {len(name)}")
        optional = {
            "description": text(description),
            "executor": clip(executor, 32),
            "engine_version": clip(engine_version, 64),
            "hardware": clip(hardware, 200),
            "optuna_study_name": clip(optuna_study_name, 512),
        }
        with self._write() as s:
            now = self._now(s)
            ins = self._insert(StudyRow.__table__).values(name=name, job=dict(job), created_at=now, updated_at=now, **optional)
            changes = {"job": ins.excluded.job, "updated_at": ins.excluded.updated_at}
            changes.update({k: ins.excluded[k] for k, v in optional.items() if v is not None})
            s.execute(ins.on_conflict_do_update(index_elements=["name"], set_=changes))
            return study_id(s, name)

    # -- trials

    def start_trial(
        self,
        study: str,
        number: int,
        *,
        params: Mapping[str, Any],
        config: DeploymentConfig | None = None,
        topology: Mapping[str, Any] | None = None,
        worker: str | None = None,
        proposer: str | None = None,
        predicted: Mapping[str, float | None] | None = None,
        repeat_of: int | None = None,
        reused_from: int | None = None,
        baseline: bool = False,
    ) -> int:
        """Record trial ``number`` as RUNNING and return its id. Starting a trial that is already RUNNING returns
        its id (and refreshes its heartbeat); one that has finished raises ``IllegalTransition``.

        What the trial is, is said here, once: a repeat of trial ``repeat_of``, a reuse of trial
        ``reused_from``'s measurements, or vLLM's defaults (``baseline``); ``db.budget`` counts from these."""
        with self._write() as s:
            sid = study_id(s, study)
            now = self._now(s)
            s.execute(
                self._insert(TrialRow.__table__)
                .values(
                    study_id=sid,
                    number=number,
                    state=TrialState.RUNNING.value,
                    params=dict(params),
                    config=None if config is None else config.model_dump(mode="json"),
                    config_text=None if config is None else text(config.describe()),
                    topology=None if topology is None else dict(topology),
                    gpus=None if config is None else config.total_gpus,
                    worker=clip(worker, 200),
                    proposer=clip(proposer, 16),
                    predicted=check_objectives(predicted),
                    repeat_of=repeat_of,
                    reused_from=reused_from,
                    baseline=baseline,
                    started_at=now,
                    heartbeat_at=now,
                )
                .on_conflict_do_nothing(index_elements=["study_id", "number"])
            )
            row = s.execute(
                select(TrialRow).where(TrialRow.study_id == sid, TrialRow.number == number).with_for_update()
            ).scalar_one()
            state = TrialState(row.state)
            if state is not TrialState.RUNNING:
                transition(state, TrialState.RUNNING)  # raises: a finished trial does not run again
            row.heartbeat_at = now
            return row.id

    def record_invalid(
        self,
        study: str,
        number: int,
        *,
        params: Mapping[str, Any],
        config: DeploymentConfig | None = None,
        reason: str,
        failure_kind: str | None = None,
        proposer: str | None = None,
    ) -> int:
        """Record trial ``number`` as INVALID (broke a validity rule, never launched) and return its id.

        A RUNNING trial of that number becomes INVALID; recording an INVALID trial again returns its id;
        any other finished trial raises ``IllegalTransition``. ``failure_kind`` may name the rule.
        """
        with self._write() as s:
            sid = study_id(s, study)
            now = self._now(s)
            values = {
                "params": dict(params),
                "config": None if config is None else config.model_dump(mode="json"),
                "config_text": None if config is None else text(config.describe()),
                "gpus": None if config is None else config.total_gpus,
                "reason": text(reason),
                "failure_kind": clip(failure_kind, 64),
                "proposer": clip(proposer, 16),
                "finished_at": now,
            }
            inserted = s.scalar(
                self._insert(TrialRow.__table__)
                .values(study_id=sid, number=number, state=TrialState.INVALID.value, started_at=now, **values)
                .on_conflict_do_nothing(index_elements=["study_id", "number"])
                .returning(TrialRow.__table__.c.id)
            )
            row = s.execute(
                select(TrialRow).where(TrialRow.study_id == sid, TrialRow.number == number).with_for_update()
            ).scalar_one()
            if inserted is not None or row.state == TrialState.INVALID.value:
                return row.id
            row.state = transition(TrialState(row.state), TrialState.INVALID).value
            for k, v in values.items():
                setattr(row, k, v)
            return row.id

    def record_resources(self, trial_id: int, resources: Mapping[str, Any]) -> None:
        """Replace what the trial holds (process groups, placement groups, ports), for the cleanup after a crash."""
        with self._write() as s:
            self._locked_trial(s, trial_id).resources = dict(resources)

    def heartbeat(self, trial_id: int) -> bool:
        """Say the trial is still being worked on. False when it is no longer RUNNING (e.g. marked interrupted)."""
        with self._write() as s:
            now = self._now(s)
            result = s.execute(
                update(TrialRow)
                .where(TrialRow.id == trial_id, TrialRow.state == TrialState.RUNNING.value)
                .values(heartbeat_at=now)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount:  # type: ignore[attr-defined]
                return True
            if s.get(TrialRow, trial_id) is None:
                raise UnknownTrial(f"no trial with id {trial_id}")
            return False

    def finish_trial(
        self,
        trial_id: int,
        state: TrialState,
        *,
        measurements: Sequence[Measurement] = (),
        timings: Mapping[str, float | None] | None = None,
        objectives: Mapping[str, float | None] | None = None,
        violation: float | None = None,
        failure_kind: str | None = None,
        reason: str | None = None,
        log_tail: str | None = None,
        executed: bool = False,
    ) -> Trial:
        """Close a RUNNING trial with its outcome and every load level's measurement, in one transaction, and
        return the row as stored (without its measurements): what Optuna is then told from.
        ``executed``: the trial deployed its configuration and its result judges it (``TrialRow.executed``).

        Raises ``IllegalTransition`` when the trial is not RUNNING (e.g. finished twice) and ``ValueError`` for
        two measurements of one concurrency or an unknown timing key; nothing is written then.
        ``timings`` keys: ``deploy_s``, ``warmup_s``, ``measure_s``, ``teardown_s``. NaN is stored as ``None``.
        """
        new = TrialState(state)
        times = check_timings(timings)
        levels = check_levels(measurements)
        objs = check_objectives(objectives)
        with self._write() as s:
            row = self._locked_trial(s, trial_id)
            row.state = transition(TrialState(row.state), new).value
            row.finished_at = self._now(s)
            row.objectives = objs
            row.violation = nan_to_none(None if violation is None else float(violation))
            row.failure_kind = clip(failure_kind, 64)
            row.reason = text(reason)
            row.log_tail = text(log_tail, LOG_TAIL_MAX_CHARS)
            row.executed = executed
            for k, v in times.items():
                setattr(row, k, v)
            s.flush()
            self._add_levels(s, trial_id, levels)
            return trial(row, row.study.name)

    def add_levels(self, trial_id: int, measurements: Sequence[Measurement]) -> int:
        """Store load levels of a RUNNING trial as soon as they are measured (before its teardown), so that a
        tuner killed afterwards leaves them with the trial; ``finish_trial`` later stores only the levels not
        stored yet. Returns how many were new; a trial no longer RUNNING (closed by a cleanup) gets none."""
        levels = check_levels(measurements)
        with self._write() as s:
            if TrialState(self._locked_trial(s, trial_id).state) is not TrialState.RUNNING:
                return 0
            return self._add_levels(s, trial_id, levels)

    @staticmethod
    def _add_levels(s: Session, trial_id: int, levels: Sequence[Measurement]) -> int:
        """Insert the levels of ``levels`` the trial does not hold yet (one per concurrency and request rate)."""
        have = set(s.execute(select(MeasurementRow.concurrency, MeasurementRow.request_rate)
                             .where(MeasurementRow.trial_id == trial_id)).tuples())
        new = [m for m in levels if (m.concurrency, m.request_rate) not in have]
        for m in new:
            s.add(measurement_row(trial_id, m))
            s.flush()
        return len(new)

    def budget_used(self, study: str, *, in_flight: bool = False) -> int:
        """Trials of ``study`` the budget counts (``db.budget``); ``in_flight`` adds its search trials running now."""
        with self._read() as s:
            sid = study_id(s, study)
            return budget_used(s, [sid], in_flight=in_flight)[sid]

    def running_trials(self, study: str) -> list[Trial]:
        """Every RUNNING trial of ``study``, by number (stale or not)."""
        return self.stale_trials(study, older_than_s=-math.inf)

    def mark_interrupted(self, trial_id: int, reason: str) -> None:
        """Close a RUNNING trial whose worker died or was stopped (``IllegalTransition`` if it already finished)."""
        self.finish_trial(trial_id, TrialState.INTERRUPTED, failure_kind="interrupted", reason=reason)

    def stale_trials(self, study: str, older_than_s: float) -> list[Trial]:
        """RUNNING trials of ``study`` whose last heartbeat is more than ``older_than_s`` seconds old."""
        with self._read() as s:
            q = select(TrialRow).where(
                TrialRow.study_id == study_id(s, study), TrialRow.state == TrialState.RUNNING.value
            )
            if math.isfinite(older_than_s):
                cutoff = self._now(s) - timedelta(seconds=older_than_s)
                q = q.where(or_(TrialRow.heartbeat_at.is_(None), TrialRow.heartbeat_at < cutoff))
            elif older_than_s > 0:
                return []
            rows = s.scalars(q.order_by(TrialRow.number)).all()
            return [trial(r, study) for r in rows]

    # -- exports

    def record_export(self, trial_id: int, fmt: str, path: str, sha256: str) -> int:
        """Remember that trial ``trial_id`` was exported as ``fmt`` to ``path`` (file digest ``sha256``)."""
        digest = sha256.lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"sha256 must be 64 hex digits, got {sha256!r}")
        with self._write() as s:
            if s.get(TrialRow, trial_id) is None:
                raise UnknownTrial(f"no trial with id {trial_id}")
            row = ExportRow(
                trial_id=trial_id, format=clip(fmt, 32), path=text(str(path)), sha256=digest, created_at=self._now(s)
            )
            s.add(row)
            s.flush()
            return row.id

    # -- hardware profiles

    def add_profile(self, *, gpu: str, gpu_count: int, engine_version: str, shape_key: str, model_name: str,
                    shape: Mapping[str, Any], params: Mapping[str, Any], report: Mapping[str, Any],
                    probes: Sequence[Any]) -> HardwareProfile:
        """Store one profile run (all of it in one transaction: a profile is whole or absent)."""
        with self._write() as s:
            row = HardwareProfileRow(
                created_at=self._now(s), gpu=clip(gpu, 32), gpu_count=gpu_count, engine_version=clip(engine_version, 64),
                shape_key=clip(shape_key, 32), model_name=clip(model_name, 256), shape=dict(shape), params=dict(params),
                report=dict(report), probes=list(probes))
            s.add(row)
            s.flush()
            return _profile(row)

    def profiles(self, *, gpu: str | None = None, shape_key: str | None = None) -> list[HardwareProfile]:
        """Stored profiles, newest first, of one GPU kind and model shape where given."""
        q = select(HardwareProfileRow)
        if gpu is not None:
            q = q.where(HardwareProfileRow.gpu == gpu)
        if shape_key is not None:
            q = q.where(HardwareProfileRow.shape_key == shape_key)
        with self._read() as s:
            return [_profile(r) for r in s.scalars(q.order_by(HardwareProfileRow.id.desc())).all()]


    # -- external measurements

    def add_external(self, points: Sequence[ExternalPoint]) -> tuple[int, int]:
        """Store imported operating points, all in one transaction (an import is whole or absent); a point whose
        ``content_key`` is stored already is left as it is. Returns (added, already stored)."""
        rows = [_external_values(p) for p in points]
        added = 0
        with self._write() as s:
            now = self._now(s)
            for values in rows:
                res = s.execute(self._insert(ExternalMeasurementRow.__table__).values(**values, imported_at=now)
                                .on_conflict_do_nothing(index_elements=["content_key"]))
                added += max(0, res.rowcount or 0)
        return added, len(rows) - added

    def external_points(self, *, batch: str | None = None, model: str | None = None,
                        gpu: str | None = None) -> list[ExternalPoint]:
        """Imported operating points in the order they were imported, of one batch, model and GPU kind where
        given."""
        q = select(ExternalMeasurementRow)
        if batch is not None:
            q = q.where(ExternalMeasurementRow.batch == batch)
        if model is not None:
            q = q.where(ExternalMeasurementRow.model == model)
        if gpu is not None:
            q = q.where(ExternalMeasurementRow.gpu == gpu)
        with self._read() as s:
            return [_external(r) for r in s.scalars(q.order_by(ExternalMeasurementRow.id)).all()]

    def external_batches(self) -> list[tuple[str, int]]:
        """Each import batch's label with its number of points, by label."""
        with self._read() as s:
            q = (select(ExternalMeasurementRow.batch, func.count()).group_by(ExternalMeasurementRow.batch)
                 .order_by(ExternalMeasurementRow.batch))
            return [(b, int(n)) for b, n in s.execute(q).all()]


def _external_values(p: ExternalPoint) -> dict[str, Any]:
    """The columns of one point to store (text cut to its column, non-finite metrics as missing)."""
    if not p.batch or not p.batch.strip():
        raise ValueError("an import batch needs a non-empty label")
    metrics = {k: float(v) for k, v in p.metrics.items() if v is not None and math.isfinite(float(v))}
    words = p.deployment.describe() if p.deployment is not None else (p.layout or p.deployment_text or p.mode)
    return {"batch": clip(p.batch, 200), "content_key": clip(p.key, 64), "source": text(p.source),
            "engine": clip(p.engine, 64), "engine_version": clip(p.engine_version, 200), "model": clip(p.model, 256),
            "precision": clip(p.precision, 200), "gpu": clip(p.gpu, 32), "total_gpus": p.total_gpus,
            "mode": clip(p.mode, 16),
            "deployment": p.deployment.model_dump(mode="json") if p.deployment is not None else None,
            "deployment_text": text(words), "layout": text(p.layout), "mtp": p.mtp, "isl": p.isl, "osl": p.osl,
            "range_ratio": p.range_ratio, "concurrency": p.concurrency, "requests": p.requests, "metrics": metrics,
            "per_gpu_normalization": text(p.per_gpu_normalization), "notes": text(p.notes)}


def _external(r: ExternalMeasurementRow) -> ExternalPoint:
    deployment: DeploymentConfig | None = None
    if r.deployment is not None:
        try:
            deployment = DeploymentConfig.model_validate(r.deployment)
        except ValueError:  # pydantic's ValidationError: an older vocabulary; its words still say what it was
            deployment = None
    return ExternalPoint(batch=r.batch, key=r.content_key, source=r.source, engine=r.engine,
                         engine_version=r.engine_version, model=r.model, precision=r.precision, gpu=r.gpu,
                         total_gpus=r.total_gpus, mode=r.mode, deployment=deployment, layout=r.layout, mtp=r.mtp,
                         isl=r.isl, osl=r.osl, range_ratio=r.range_ratio, concurrency=r.concurrency,
                         metrics=dict(r.metrics), requests=r.requests,
                         per_gpu_normalization=r.per_gpu_normalization, notes=r.notes,
                         deployment_text=r.deployment_text, id=r.id, imported_at=r.imported_at)


def _profile(r: HardwareProfileRow) -> HardwareProfile:
    return HardwareProfile(id=r.id, created_at=r.created_at, gpu=r.gpu, gpu_count=r.gpu_count,
                           engine_version=r.engine_version, shape_key=r.shape_key, model_name=r.model_name,
                           shape=dict(r.shape), params=dict(r.params), report=dict(r.report), probes=list(r.probes))


# Every call into our tables outlasts a short outage (``db.outage``): the writes and reads a tuner makes.
retry_methods(Database, ["upsert_study", "start_trial", "record_invalid", "record_resources", "heartbeat",
                         "add_levels", "finish_trial", "budget_used", "running_trials", "stale_trials",
                         "record_export", "add_profile", "profiles", "add_external", "external_points",
                         "external_batches"])
