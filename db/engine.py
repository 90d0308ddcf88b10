"""Connecting, migrating, and writing trials.

``connect(url)`` opens the database (SQLite file or PostgreSQL), brings our ``advisor_*`` tables to the newest
schema with Alembic, and returns a ``Database``. Every write is one transaction: a trial is either finished
with all its measurements or not at all.

Concurrency: several tuner workers may share one database. On PostgreSQL the rows a write touches are locked
(``SELECT … FOR UPDATE``) and migrations run under an advisory lock; on SQLite every write transaction is
``BEGIN IMMEDIATE`` (one writer at a time, others wait up to ``SQLITE_BUSY_TIMEOUT_S``).
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from pydantic import ValidationError
from sqlalchemy import Engine, create_engine, event, func, make_url, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool, StaticPool

from db.models import MEASUREMENT_COLUMNS, ExportRow, MeasurementRow, StudyRow, TrialRow
from db.rows import TIMING_KEYS, DatabaseUnavailable, Export, Trial, UnknownStudy, UnknownTrial
from search_spaces import DeploymentConfig, Measurement, TrialState, transition

SUPPORTED_BACKENDS = ("sqlite", "postgresql")
SQLITE_BUSY_TIMEOUT_S = 60.0
#: A longer log tail is cut to its last this-many characters.
LOG_TAIL_MAX_CHARS = 64_000
#: Key of the PostgreSQL advisory lock held while migrating (the bytes of "advisor").
_PG_MIGRATION_LOCK = int.from_bytes(b"advisor", "big")
_HERE = Path(__file__).resolve().parent
#: ``Measurement`` fields without a column of their own travel in ``raw`` under this key.
_UNMAPPED = "__unmapped__"


# ---------------------------------------------------------------------------------------------- connecting


def normalize_url(url: str) -> str:
    """The URL our engine (and Optuna's storage, which should get the same string) uses.

    ``postgresql://`` gets the psycopg 3 driver (``postgresql+psycopg://``), the one this project installs.
    Raises ``ValueError`` with one line for what is not a URL of a supported backend.
    """
    try:
        u = make_url(url)
    except ArgumentError:
        raise ValueError(
            f"storage {url!r} is not a database URL; use sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
        ) from None
    backend = u.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise ValueError(f"storage backend {backend!r} is not supported; allowed: {', '.join(SUPPORTED_BACKENDS)}")
    if u.drivername == "postgresql":
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def connect(url: str, *, echo: bool = False) -> Database:
    """Open the database at ``url`` and migrate our tables to the newest schema (safe from several processes).

    Raises ``DatabaseUnavailable`` (one line, no password) when it cannot: not a supported URL, server
    unreachable, refused login, a folder that cannot be created, or a schema newer than this code knows.
    """
    try:
        normalized = normalize_url(url)
        engine = _make_engine(normalized, echo=echo)
    except ValueError as e:
        raise DatabaseUnavailable(str(e)) from None
    except OSError as e:
        raise DatabaseUnavailable(f"cannot create the database file: {e.strerror or e}") from e
    try:
        _upgrade(engine)
    except BaseException as e:
        engine.dispose()
        if isinstance(e, DBAPIError):
            raise DatabaseUnavailable(_one_line(e.orig, engine.url.password)) from e
        if isinstance(e, CommandError):
            raise DatabaseUnavailable(
                f"its advisor_* schema is at a revision this deploy-advisor does not know ({_one_line(e, None)}); "
                "use the deploy-advisor version that wrote it, or a newer one"
            ) from e
        raise
    return Database(engine)


def _one_line(error: BaseException | None, password: str | None) -> str:
    """The first line of a driver's message, the password (should a driver echo it) replaced."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = lines[0] if lines else type(error).__name__
    return text.replace(password, "***") if password else text


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _json_dumps(value: Any) -> str:
    """JSON has no NaN/Infinity (PostgreSQL refuses them): a non-finite number is stored as null."""
    return json.dumps(_json_safe(value), allow_nan=False)


def _make_engine(url: str, *, echo: bool) -> Engine:
    u = make_url(url)
    if u.get_backend_name() == "postgresql":
        return create_engine(u, echo=echo, pool_pre_ping=True, json_serializer=_json_dumps)

    memory = u.database in (None, "", ":memory:") or u.query.get("mode") == "memory"
    if memory:
        engine = create_engine(
            u, echo=echo, json_serializer=_json_dumps, poolclass=StaticPool,
            connect_args={"check_same_thread": False},
        )
    else:
        assert u.database is not None
        Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            u, echo=echo, json_serializer=_json_dumps, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S}
        )

    # pysqlite's own transaction handling begins late (not before SELECT or DDL); take it over, as SQLAlchemy's
    # docs recommend, so that a transaction is a real one and writers can ask for the write lock up front.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()
        sqlite_fast_sync(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("advisor_write") else "BEGIN")

    return engine


def sqlite_fast_sync(dbapi_connection: Any) -> None:
    """WAL + synchronous=NORMAL: one fsync per checkpoint instead of per commit. A crash can lose the last
    commits but never corrupts the file; a simulated study writes thousands of small rows and was I/O-bound."""
    cursor = dbapi_connection.cursor()
    # Switching a new file to WAL needs it to itself, and SQLite answers "database is locked" at once — without
    # its busy handler — while another process is migrating it (workers starting together): wait and retry.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def optuna_storage(url: str) -> Any:
    """Optuna's RDB storage on the same URL (and the same driver) as our tables, with the same SQLite settings."""
    import optuna

    url = normalize_url(url)
    sqlite = url.startswith("sqlite")
    if sqlite:
        storage = optuna.storages.RDBStorage(url)
    else:
        # Optuna creates its tables on first use without a lock: workers starting together on a new database
        # would race (duplicate pg_type rows). Hold the migration lock while it does.
        lock_engine = create_engine(url, poolclass=NullPool)
        try:
            with lock_engine.connect() as conn:
                conn.execute(select(func.pg_advisory_lock(_PG_MIGRATION_LOCK)))
                try:
                    storage = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
                finally:
                    conn.execute(select(func.pg_advisory_unlock(_PG_MIGRATION_LOCK)))
                    conn.commit()
        finally:
            lock_engine.dispose()
    if sqlite:
        event.listen(storage.engine, "connect", lambda conn, _rec: sqlite_fast_sync(conn))  # type: ignore[union-attr]
        storage.engine.dispose()  # connections made before the listener get the settings on reconnect
    return storage


def _alembic_config() -> Config:
    ini = _HERE / "alembic.ini"
    cfg = Config(str(ini)) if ini.exists() else Config()
    cfg.set_main_option("script_location", str(_HERE / "migrations").replace("%", "%%"))
    return cfg


def _upgrade(engine: Engine) -> None:
    """``alembic upgrade head`` in one transaction that only one process at a time can hold."""
    cfg = _alembic_config()
    postgres = engine.dialect.name == "postgresql"
    with engine.execution_options(advisor_write=True).connect() as conn, conn.begin():
        if postgres:
            conn.execute(select(func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


# ---------------------------------------------------------------------------------------------- conversions


def _nan_to_none(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _text(value: str | None, limit: int | None = None) -> str | None:
    """PostgreSQL text cannot hold NUL bytes (process output sometimes does); keep the tail of long text."""
    if value is None:
        return None
    value = str(value).replace("\x00", "\ufffd")
    return value[-limit:] if limit is not None and len(value) > limit else value


def _clip(value: str | None, limit: int) -> str | None:
    """Short labels (worker, failure kind, hardware, …) are cut to their column's width, the same on every backend
    (PostgreSQL would refuse a longer one and lose the whole write)."""
    return None if value is None else _text(value)[:limit]  # type: ignore[index]


def _measurement_row(trial_id: int, m: Measurement) -> MeasurementRow:
    data = m.model_dump(exclude={"raw"})
    raw: dict[str, Any] = dict(m.model_dump(mode="json", include={"raw"})["raw"])
    unmapped = {k: data.pop(k) for k in list(data) if k not in MEASUREMENT_COLUMNS}
    if unmapped:
        raw[_UNMAPPED] = unmapped
    data["source"] = _clip(data["source"], 32)
    return MeasurementRow(trial_id=trial_id, raw=raw, **{k: _nan_to_none(v) for k, v in data.items()})


def _measurement(r: MeasurementRow) -> Measurement:
    fields = Measurement.model_fields
    raw = dict(r.raw or {})
    data: dict[str, Any] = {k: getattr(r, k) for k in MEASUREMENT_COLUMNS if k in fields}
    data.update({k: v for k, v in raw.pop(_UNMAPPED, {}).items() if k in fields})
    try:
        return Measurement.model_validate({**data, "raw": raw})
    except ValidationError:  # stored under an older vocabulary: show what there is
        return Measurement.model_construct(**data, raw=raw)


def _config(data: dict[str, Any] | None) -> DeploymentConfig | None:
    if data is None:
        return None
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError:
        return None


def _export(r: ExportRow) -> Export:
    return Export(id=r.id, trial_id=r.trial_id, format=r.format, path=r.path, sha256=r.sha256, created_at=r.created_at)


def _trial(r: TrialRow, study: str, *, measurements: Sequence[Measurement] = (), exports: Sequence[Export] = ()) -> Trial:
    return Trial(
        id=r.id,
        study=study,
        number=r.number,
        state=TrialState(r.state),
        params=dict(r.params or {}),
        config=_config(r.config),
        config_json=r.config,
        config_text=r.config_text,
        topology=r.topology,
        gpus=r.gpus,
        objectives=r.objectives,
        violation=r.violation,
        failure_kind=r.failure_kind,
        reason=r.reason,
        log_tail=r.log_tail,
        deploy_s=r.deploy_s,
        warmup_s=r.warmup_s,
        measure_s=r.measure_s,
        teardown_s=r.teardown_s,
        resources=r.resources,
        heartbeat_at=r.heartbeat_at,
        worker=r.worker,
        proposer=r.proposer,
        predicted=r.predicted,
        repeat_of=r.repeat_of,
        started_at=r.started_at,
        finished_at=r.finished_at,
        measurements=tuple(measurements),
        exports=tuple(exports),
    )


def _check_timings(timings: Mapping[str, float | None] | None) -> dict[str, float | None]:
    if not timings:
        return {}
    unknown = sorted(set(timings) - set(TIMING_KEYS))
    if unknown:
        raise ValueError(f"unknown timing {', '.join(unknown)}; allowed: {', '.join(TIMING_KEYS)}")
    return {k: None if v is None else _nan_to_none(float(v)) for k, v in timings.items()}


def _check_objectives(objectives: Mapping[str, float | None] | None) -> dict[str, float | None] | None:
    if objectives is None:
        return None
    return {str(k): None if v is None else float(v) for k, v in objectives.items()}


def _check_levels(measurements: Sequence[Measurement]) -> list[Measurement]:
    levels = list(measurements)
    seen: set[tuple[int, float | None]] = set()
    for m in levels:
        if not isinstance(m, Measurement):
            raise TypeError(f"measurements must be search_spaces.Measurement, got {type(m).__name__}")
        key = (m.concurrency, m.request_rate)
        if key in seen:
            raise ValueError(f"two measurements for {m.label()}; one load level is one Measurement")
        seen.add(key)
    return levels


# ---------------------------------------------------------------------------------------------- the database


class Database:
    """Our tables in one database. Build it with ``connect(url)``; ``close()`` when done (or use ``with``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = engine.execution_options(advisor_write=True)
        self.backend: str = engine.dialect.name

    # -- identity

    @property
    def url(self) -> str:
        """The full URL, password included (hand it to Optuna's storage, never print it)."""
        return self._engine.url.render_as_string(hide_password=False)

    @property
    def url_for_display(self) -> str:
        """The URL with the password replaced by ``***``."""
        return self._engine.url.render_as_string(hide_password=True)

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
    def _study_id(s: Session, name: str) -> int:
        sid = s.scalar(select(StudyRow.id).where(StudyRow.name == name))
        if sid is None:
            known = s.scalars(select(StudyRow.name).order_by(StudyRow.name).limit(20)).all()
            raise UnknownStudy(f"no study named {name!r}; known: {', '.join(known) if known else '(none)'}")
        return sid

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
            "description": _text(description),
            "executor": _clip(executor, 32),
            "engine_version": _clip(engine_version, 64),
            "hardware": _clip(hardware, 200),
            "optuna_study_name": _clip(optuna_study_name, 512),
        }
        with self._write() as s:
            now = self._now(s)
            ins = self._insert(StudyRow.__table__).values(name=name, job=dict(job), created_at=now, updated_at=now, **optional)
            changes = {"job": ins.excluded.job, "updated_at": ins.excluded.updated_at}
            changes.update({k: ins.excluded[k] for k, v in optional.items() if v is not None})
            s.execute(ins.on_conflict_do_update(index_elements=["name"], set_=changes))
            return self._study_id(s, name)

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
    ) -> int:
        """Record trial ``number`` as RUNNING and return its id. Starting a trial that is already RUNNING returns
        its id (and refreshes its heartbeat); one that has finished raises ``IllegalTransition``."""
        with self._write() as s:
            sid = self._study_id(s, study)
            now = self._now(s)
            s.execute(
                self._insert(TrialRow.__table__)
                .values(
                    study_id=sid,
                    number=number,
                    state=TrialState.RUNNING.value,
                    params=dict(params),
                    config=None if config is None else config.model_dump(mode="json"),
                    config_text=None if config is None else _text(config.describe()),
                    topology=None if topology is None else dict(topology),
                    gpus=None if config is None else config.total_gpus,
                    worker=_clip(worker, 200),
                    proposer=_clip(proposer, 16),
                    predicted=_check_objectives(predicted),
                    repeat_of=repeat_of,
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
            sid = self._study_id(s, study)
            now = self._now(s)
            values = {
                "params": dict(params),
                "config": None if config is None else config.model_dump(mode="json"),
                "config_text": None if config is None else _text(config.describe()),
                "gpus": None if config is None else config.total_gpus,
                "reason": _text(reason),
                "failure_kind": _clip(failure_kind, 64),
                "proposer": _clip(proposer, 16),
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
    ) -> None:
        """Close a RUNNING trial with its outcome and every load level's measurement, in one transaction.

        Raises ``IllegalTransition`` when the trial is not RUNNING (e.g. finished twice) and ``ValueError`` for
        two measurements of one concurrency or an unknown timing key; nothing is written then.
        ``timings`` keys: ``deploy_s``, ``warmup_s``, ``measure_s``, ``teardown_s``. NaN is stored as ``None``.
        """
        new = TrialState(state)
        times = _check_timings(timings)
        levels = _check_levels(measurements)
        objs = _check_objectives(objectives)
        with self._write() as s:
            row = self._locked_trial(s, trial_id)
            row.state = transition(TrialState(row.state), new).value
            row.finished_at = self._now(s)
            row.objectives = objs
            row.violation = _nan_to_none(None if violation is None else float(violation))
            row.failure_kind = _clip(failure_kind, 64)
            row.reason = _text(reason)
            row.log_tail = _text(log_tail, LOG_TAIL_MAX_CHARS)
            for k, v in times.items():
                setattr(row, k, v)
            s.flush()
            for m in levels:
                s.add(_measurement_row(trial_id, m))
                s.flush()

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
                TrialRow.study_id == self._study_id(s, study), TrialRow.state == TrialState.RUNNING.value
            )
            if math.isfinite(older_than_s):
                cutoff = self._now(s) - timedelta(seconds=older_than_s)
                q = q.where(or_(TrialRow.heartbeat_at.is_(None), TrialRow.heartbeat_at < cutoff))
            elif older_than_s > 0:
                return []
            rows = s.scalars(q.order_by(TrialRow.number)).all()
            return [_trial(r, study) for r in rows]

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
                trial_id=trial_id, format=_clip(fmt, 32), path=_text(str(path)), sha256=digest, created_at=self._now(s)
            )
            s.add(row)
            s.flush()
            return row.id
