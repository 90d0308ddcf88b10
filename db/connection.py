"""Opening a database and migrating it: URLs, SQLAlchemy engines, SQLite's settings, Alembic, Optuna's storage.

Kept apart from ``db.engine`` (the ``Database`` and its writes) so that what a backend needs to be opened safely
by several processes at once reads in one place: on PostgreSQL migrations and Optuna's table creation run under
one advisory lock; on SQLite they run under an exclusive lock on a file beside the database (``first_start_lock``:
Optuna creates its tables with plain ``CREATE TABLE`` statements, so two workers starting on a new file both saw
none and one failed with "table … already exists" or a duplicate ``alembic_version`` row), every write transaction
is ``BEGIN IMMEDIATE`` (one writer at a time, others wait up to ``SQLITE_BUSY_TIMEOUT_S``) and the file is in WAL
mode.
"""

from __future__ import annotations

import fcntl
import functools
import json
import math
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Engine, create_engine, event, func, make_url, select
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool, StaticPool

from db.outage import retry_methods
from db.redaction import redact_url, scrub

if TYPE_CHECKING:  # Alembic is imported when a database is opened: a command that never opens one skips ~1 s
    from alembic.config import Config

SUPPORTED_BACKENDS = ("sqlite", "postgresql")
SQLITE_BUSY_TIMEOUT_S = 60.0
#: Key of the PostgreSQL advisory lock held while migrating (the bytes of "advisor").
PG_MIGRATION_LOCK = int.from_bytes(b"advisor", "big")
_HERE = Path(__file__).resolve().parent


def normalize_url(url: str) -> str:
    """The URL our engine (and Optuna's storage, which should get the same string) uses.

    ``postgresql://`` gets the psycopg 3 driver (``postgresql+psycopg://``), the one this project installs.
    Raises ``ValueError`` with one line for what is not a URL of a supported backend.
    """
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):  # a port that is no number (a password's unencoded "@" or "/") is a ValueError
        raise ValueError(
            f"storage {redact_url(url)!r} is not a database URL; use sqlite:///PATH or "
            "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
        ) from None
    backend = u.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise ValueError(f"storage backend {backend!r} is not supported; allowed: {', '.join(SUPPORTED_BACKENDS)}")
    if u.drivername == "postgresql":
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def one_line(error: BaseException | None, url: str | None) -> str:
    """The first line of a driver's message, ``url`` and its password (should a driver echo them) hidden."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = lines[0] if lines else type(error).__name__
    return scrub(text, url) if url else text


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


def make_engine(url: str, *, echo: bool) -> Engine:
    """An engine for a normalized ``url``: PostgreSQL with pre-ping; SQLite with foreign keys, WAL, and
    transactions that begin for real (``BEGIN IMMEDIATE`` under the ``advisor_write`` execution option)."""
    u = make_url(url)
    if u.get_backend_name() == "postgresql":
        return create_engine(u, echo=echo, pool_pre_ping=True, json_serializer=_json_dumps)

    file = _sqlite_file(u)
    if file is None:
        engine = create_engine(
            u, echo=echo, json_serializer=_json_dumps, poolclass=StaticPool,
            connect_args={"check_same_thread": False},
        )
    else:
        file.parent.mkdir(parents=True, exist_ok=True)
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


def require_folder(url: str) -> None:
    """Raise ``ValueError`` (one line) when a SQLite file's folder does not exist. The commands check a URL the
    user typed with it before they open anything (a mistyped folder is the user's error, not a tree of folders
    made where nobody looks); ``connect`` itself creates the folder, for callers that name a fresh one. Not a
    URL at all: nothing raised here (``normalize_url`` says so, with the password hidden)."""
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return
    file = _sqlite_file(u) if u.get_backend_name() == "sqlite" else None
    if file is not None and not file.parent.is_dir():
        raise ValueError(f"the folder {str(file.parent)!r} of {redact_url(url)} does not exist; create it first, "
                         "or name a file in an existing folder")


def _sqlite_file(u: URL) -> Path | None:
    """The file of a SQLite URL; None for an in-memory database."""
    if u.database in (None, "", ":memory:") or u.query.get("mode") == "memory":
        return None
    return Path(str(u.database)).expanduser()


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
        with first_start_lock(url):
            storage = _retrying_storage_class()(url)
    else:
        # Optuna creates its tables on first use without a lock: workers starting together on a new database
        # would race (duplicate pg_type rows). Hold the migration lock while it does.
        lock_engine = create_engine(url, poolclass=NullPool)
        try:
            with lock_engine.connect() as conn:
                conn.execute(select(func.pg_advisory_lock(PG_MIGRATION_LOCK)))
                try:
                    storage = _retrying_storage_class()(url, engine_kwargs={"pool_pre_ping": True})
                finally:
                    conn.execute(select(func.pg_advisory_unlock(PG_MIGRATION_LOCK)))
                    conn.commit()
        finally:
            lock_engine.dispose()
    if sqlite:
        event.listen(storage.engine, "connect", _optuna_sqlite_connection)
        # Every transaction takes the write lock up front, reads too: Optuna's ``ask`` reads a WAITING (enqueued)
        # trial and then marks it RUNNING, with ``FOR UPDATE``, which SQLite ignores: two workers could both pop
        # one enqueued trial and run it under one number. Serialized, the second sees it RUNNING.
        event.listen(storage.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        storage.engine.dispose()  # connections made before the listeners get the settings on reconnect
    return storage


def _optuna_sqlite_connection(dbapi_connection: Any, _record: Any) -> None:
    """Optuna's SQLite connections: WAL like ours, and pysqlite's own transaction handling off (the engine's
    ``begin`` listener begins them)."""
    dbapi_connection.isolation_level = None
    sqlite_fast_sync(dbapi_connection)


@functools.cache
def _retrying_storage_class() -> type:
    """Optuna's ``RDBStorage`` whose every storage call outlasts a short outage (``db.outage``), like our own
    tables' (a subclass, so that Optuna still puts its cache in front of it)."""
    import optuna

    class RetryingRDBStorage(optuna.storages.RDBStorage):  # type: ignore[misc]
        pass

    public = [n for n, v in vars(optuna.storages.BaseStorage).items() if not n.startswith("_") and callable(v)]
    # and what Optuna's cache (``_CachedStorage``) calls on its backend besides the public storage API
    retry_methods(RetryingRDBStorage, sorted({*public, "_create_new_trial", "_set_trial_param", "_get_trials",
                                              "_get_best_trial_id", "record_heartbeat", "_get_stale_trial_ids"}))
    return RetryingRDBStorage


def alembic_config() -> Config:
    """Alembic's configuration for our ``advisor_*`` tables (``db/alembic.ini``, scripts in ``db/migrations``)."""
    from alembic.config import Config

    ini = _HERE / "alembic.ini"
    cfg = Config(str(ini)) if ini.exists() else Config()
    cfg.set_main_option("script_location", str(_HERE / "migrations").replace("%", "%%"))
    return cfg


@contextmanager
def first_start_lock(url: str) -> Iterator[None]:
    """Held while a process creates or migrates tables in a SQLite file: an exclusive ``flock`` on
    ``<file>.lock`` beside it, so workers starting together on a new file create the tables one after another.

    A file lock and not a transaction: Optuna's storage opens its own connections to create its tables, which
    would wait on a transaction of ours holding the write lock. No-op for other backends and in-memory SQLite.
    """
    u = make_url(url)
    path = _sqlite_file(u) if u.get_backend_name() == "sqlite" else None
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file is closed, also by a process that dies
        yield


def schema_revisions(engine: Engine) -> tuple[str | None, str | None]:
    """(the ``advisor_*`` schema's revision in the database, the newest this code knows); reads only."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from db.models import VERSION_TABLE

    with engine.connect() as conn:
        current = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    return current, ScriptDirectory.from_config(alembic_config()).get_current_head()


def memory_copy(engine: Engine) -> Engine:
    """A private in-memory copy of a SQLite database (sqlite3's backup API), to migrate without touching the file."""
    copy = make_engine("sqlite://", echo=False)
    src, dst = engine.raw_connection(), copy.raw_connection()
    try:
        src.driver_connection.backup(dst.driver_connection)  # type: ignore[union-attr]
    finally:
        src.close()
        dst.close()
    return copy


def upgrade(engine: Engine) -> None:
    """``alembic upgrade head`` in one transaction that only one process at a time can hold."""
    from alembic import command

    cfg = alembic_config()
    postgres = engine.dialect.name == "postgresql"
    with first_start_lock(engine.url.render_as_string(hide_password=False)), \
            engine.execution_options(advisor_write=True).connect() as conn, conn.begin():
        if postgres:
            conn.execute(select(func.pg_advisory_xact_lock(PG_MIGRATION_LOCK)))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
