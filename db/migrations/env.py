"""Alembic environment for the ``advisor_*`` tables.

``db.connect()`` hands in a connection that already holds the migration lock (``config.attributes
["connection"]``) and commits when the upgrade is done. Run from the ``alembic`` command line, the URL comes
from ``DEPLOY_ADVISOR_DB_URL`` or the ini's ``sqlalchemy.url``.
"""

from __future__ import annotations

import os
from typing import Any

from alembic import context
from sqlalchemy import Connection

from db.models import TABLE_PREFIX, VERSION_TABLE, Base

config = context.config


def _ours(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate looks only at our tables: Optuna's live in the same database."""
    if type_ == "table":
        return bool(name and name.startswith(TABLE_PREFIX))
    return True


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=_ours,
        render_as_batch=True,  # SQLite alters tables by copying them
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _offline() -> None:
    context.configure(
        url=os.environ.get("DEPLOY_ADVISOR_DB_URL") or config.get_main_option("sqlalchemy.url"),
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
        return
    from db.connection import make_engine, normalize_url

    url = os.environ.get("DEPLOY_ADVISOR_DB_URL") or config.get_main_option("sqlalchemy.url")
    assert url, "set DEPLOY_ADVISOR_DB_URL"
    if config.config_file_name:
        from logging.config import fileConfig

        fileConfig(config.config_file_name, disable_existing_loggers=False)
    engine = make_engine(normalize_url(url), echo=False)
    try:
        with engine.execution_options(advisor_write=True).connect() as connection, connection.begin():
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    _offline()
else:
    _online()
