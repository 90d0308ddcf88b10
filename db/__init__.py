"""The results database: our ``advisor_*`` tables beside Optuna's, in one SQLite file or PostgreSQL database.

The only package that imports SQLAlchemy. Everything it hands back is a plain dataclass (``db.rows``) or a
``search_spaces`` model::

    db = connect("sqlite:///runs/advisor.db")           # migrates to the newest schema
    db.upsert_study("dsr1-8xh200", job)
    tid = db.start_trial("dsr1-8xh200", 0, params=trial.params, config=cfg, topology=topo, worker="w1")
    db.finish_trial(tid, TrialState.COMPLETE, measurements=levels, objectives={"throughput_per_gpu": 812.0})
    queries.best_under_slo(db, "dsr1-8xh200", slos)     # Best(trial, measurement) | None

Its parts: ``connection`` (URLs, engines, migrations, Optuna's storage), ``redaction`` (the one place a URL's
password is hidden), ``engine`` (the ``Database`` and its writes), ``mapping`` (rows to values and back),
``models`` (the tables), ``rows`` (what is handed back), the reads ``trial_queries`` and ``level_queries`` with
``ranking`` (directions, Pareto), and ``queries``, their public face and the named queries.

The public names below are loaded on first use (PEP 562, as ``executors`` does): ``import db`` imports neither
SQLAlchemy nor Alembic, so a command that fails on bad input before it opens a database starts in a fraction of
the time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name → the module that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["LOG_TAIL_MAX_CHARS", "SUPPORTED_BACKENDS", "Database", "connect", "normalize_url",
                     "optuna_storage"], "db.engine"),
    "DatabaseOutage": "db.outage",
    "require_folder": "db.connection",
    **dict.fromkeys(["redact_url", "scrub"], "db.redaction"),
    **dict.fromkeys(["NAMED_QUERIES", "NamedQuery", "QueryArg", "QueryError", "best_under_slo", "failures",
                     "get_study", "get_trial", "history", "list_studies", "list_trials", "measurements",
                     "pareto_front", "parse_slos", "run_query"], "db.queries"),
    **dict.fromkeys(["TIMING_KEYS", "Best", "DatabaseUnavailable", "Export", "ExternalPoint", "Failure",
                     "HardwareProfile",
                     "HistoryPoint", "Level", "Study", "Trial", "UnknownStudy", "UnknownTrial"], "db.rows"),
    "IllegalTransition": "search_spaces",
}
_SUBMODULES = ("queries",)

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(f"db.{name}")
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'db' has no attribute {name!r}")
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and IDEs see
    from db import queries  # noqa: F401
    from db.connection import require_folder  # noqa: F401
    from db.engine import (  # noqa: F401
        LOG_TAIL_MAX_CHARS,
        SUPPORTED_BACKENDS,
        Database,
        connect,
        normalize_url,
        optuna_storage,
    )
    from db.outage import DatabaseOutage  # noqa: F401
    from db.queries import (  # noqa: F401
        NAMED_QUERIES,
        NamedQuery,
        QueryArg,
        QueryError,
        best_under_slo,
        failures,
        get_study,
        get_trial,
        history,
        list_studies,
        list_trials,
        measurements,
        pareto_front,
        parse_slos,
        run_query,
    )
    from db.redaction import redact_url, scrub  # noqa: F401
    from db.rows import (  # noqa: F401
        TIMING_KEYS,
        Best,
        DatabaseUnavailable,
        Export,
        ExternalPoint,
        Failure,
        HardwareProfile,
        HistoryPoint,
        Level,
        Study,
        Trial,
        UnknownStudy,
        UnknownTrial,
    )
    from search_spaces import IllegalTransition  # noqa: F401
