"""A database outage: retried with backoff for a bounded time, then one clear error.

A PostgreSQL server that stops or restarts mid-study breaks every pooled connection: the next statement fails
(``AdminShutdown``, "server closed the connection", "connection refused" while it is down), and Optuna reports it
as "invalid data in the commit". A tuner is hours of deployments; an outage of a few seconds must not end it. So
every call into the database — our ``Database``'s methods and Optuna's storage — goes through ``retry_outage``:
a call that failed for the connection is run again (a fresh connection from a pool SQLAlchemy has invalidated)
with backoff, for at most ``outage_window_s()`` seconds in all; then ``DatabaseOutage`` ends the command with one
line (the tuner exits 3: nothing is lost, its trial in flight is closed by the resume).

Only the outermost call retries (a storage method calling another does not stack windows). A call's transaction
either committed or did not; one that committed just as the connection broke is run again, which every write
the tuner makes tolerates except Optuna's ``create_new_trial`` (an extra trial, closed by the resume) — a window
of a few microseconds per outage.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar


#: Seconds an outage is retried (in all, per call) before the command gives up: a restart, a failover or a
#: network blip fits; a server that is down needs a person. ``DEPLOY_ADVISOR_DB_OUTAGE_S`` overrides it.
OUTAGE_WINDOW_S = 120.0
#: The first pause, doubled after every failed attempt up to ``MAX_PAUSE_S``.
FIRST_PAUSE_S = 0.2
MAX_PAUSE_S = 5.0

F = TypeVar("F", bound=Callable[..., Any])
_inside = threading.local()


class DatabaseOutage(Exception):
    """The database stayed unreachable for the whole retry window; the message is one line, no password."""


def outage_window_s() -> float:
    """``OUTAGE_WINDOW_S``, or ``DEPLOY_ADVISOR_DB_OUTAGE_S`` where set (a number of seconds)."""
    raw = os.environ.get("DEPLOY_ADVISOR_DB_OUTAGE_S")
    try:
        return max(0.0, float(raw)) if raw else OUTAGE_WINDOW_S
    except ValueError:
        return OUTAGE_WINDOW_S


def is_outage(error: BaseException) -> bool:
    """The error (or one it was raised from) is a lost or refused connection, not a wrong statement: SQLAlchemy
    saw the connection invalidated, or the driver raised its ``OperationalError``/``InterfaceError`` (psycopg:
    server shut down, connection closed or refused). SQLite's "locked" waits in its own busy handler instead."""
    try:  # a driver that is not installed raised nothing of its own (the GPU image has SQLite only)
        import psycopg
    except ImportError:
        psycopg = None
    from sqlalchemy.exc import DBAPIError  # here: ``DatabaseOutage`` is imported by commands that open no database

    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DBAPIError) and (e.connection_invalidated or _driver_outage(e.orig, psycopg)):
            return True
        if _driver_outage(e, psycopg):
            return True
        e = e.__cause__ or e.__context__
    return False


def _driver_outage(e: BaseException | None, psycopg: Any) -> bool:
    return psycopg is not None and isinstance(e, psycopg.OperationalError | psycopg.InterfaceError)


def retry_outage(fn: F) -> F:
    """``fn``, run again with backoff while it fails for an outage, for at most ``outage_window_s()``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "depth", 0):
            return fn(*args, **kwargs)
        _inside.depth = 1
        try:
            return _with_retries(fn, args, kwargs)
        finally:
            _inside.depth = 0

    return wrapper  # type: ignore[return-value]


def _with_retries(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    deadline: float | None = None
    pause = FIRST_PAUSE_S
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not is_outage(e):
                raise
            now = time.monotonic()
            window = outage_window_s()
            deadline = now + window if deadline is None else deadline
            if now >= deadline:
                raise DatabaseOutage(f"the database is unreachable ({_first_line(e)}); retried for {window:g} s "
                                     "(DEPLOY_ADVISOR_DB_OUTAGE_S); nothing is lost: when it is back, run the same "
                                     "command again to continue") from None
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, MAX_PAUSE_S)


def _first_line(e: BaseException) -> str:
    """The driver's own words, first line (psycopg names host and port, never the password)."""
    orig = getattr(e, "orig", None) or e.__cause__ or e
    lines = [ln.strip() for ln in str(orig).splitlines() if ln.strip()]
    return lines[0] if lines else type(orig).__name__


def retry_methods(cls: type, names: list[str]) -> None:
    """Wrap each named method of ``cls`` in ``retry_outage`` (in place)."""
    for name in names:
        setattr(cls, name, retry_outage(getattr(cls, name)))
