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
"""

from db import queries
from db.engine import LOG_TAIL_MAX_CHARS, SUPPORTED_BACKENDS, Database, connect, normalize_url, optuna_storage
from db.outage import DatabaseOutage
from db.redaction import redact_url, scrub
from db.queries import (
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
from db.rows import (
    TIMING_KEYS,
    Best,
    DatabaseUnavailable,
    Export,
    Failure,
    HardwareProfile,
    HistoryPoint,
    Level,
    Study,
    Trial,
    UnknownStudy,
    UnknownTrial,
)
from search_spaces import IllegalTransition

__all__ = [
    "Best", "Database", "DatabaseOutage", "DatabaseUnavailable", "Export", "Failure", "HardwareProfile", "HistoryPoint", "IllegalTransition", "LOG_TAIL_MAX_CHARS", "Level",
    "NAMED_QUERIES", "NamedQuery", "QueryArg", "QueryError", "SUPPORTED_BACKENDS", "Study", "TIMING_KEYS", "Trial",
    "UnknownStudy", "UnknownTrial", "best_under_slo", "connect", "failures", "get_study", "get_trial", "history",
    "list_studies", "list_trials", "measurements", "normalize_url", "optuna_storage", "pareto_front", "parse_slos", "queries",
    "redact_url", "run_query", "scrub",
]
