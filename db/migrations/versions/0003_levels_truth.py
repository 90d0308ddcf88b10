"""Levels say what they are and how sure they are; trials say what the model predicted.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``advisor_measurements``: ``request_rate`` (rate levels), ``error_rate``, ``purpose`` (fixed / search / knee),
``intervals`` (bootstrap 95% intervals per metric) and ``flags`` (e.g. ``prefix-cache-reuse``) get columns,
so queries can filter on them. Rate levels of one trial may share a concurrency cap, so the uniqueness of
(trial, concurrency) is dropped (the recorder checks (concurrency, request rate) instead).
``advisor_trials``: ``predicted`` (the performance model's objective values before the trial ran) and
``repeat_of`` (the trial a repeat measures again). Rows recorded before keep NULL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("advisor_measurements") as batch:  # batch: SQLite cannot alter in place
        batch.drop_constraint("uq_advisor_measurements_trial_id_concurrency", type_="unique")
        batch.add_column(sa.Column("request_rate", sa.Double(), nullable=True))
        batch.add_column(sa.Column("error_rate", sa.Double(), nullable=True))
        batch.add_column(sa.Column("purpose", sa.String(16), nullable=True))
        batch.add_column(sa.Column("intervals", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("flags", sa.JSON(none_as_null=True), nullable=True))
        batch.create_index("ix_advisor_measurements_trial_id", ["trial_id"])
    with op.batch_alter_table("advisor_trials") as batch:
        batch.add_column(sa.Column("predicted", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("repeat_of", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("advisor_trials") as batch:
        batch.drop_column("repeat_of")
        batch.drop_column("predicted")
    with op.batch_alter_table("advisor_measurements") as batch:
        batch.drop_index("ix_advisor_measurements_trial_id")
        for c in ("flags", "intervals", "purpose", "error_rate", "request_rate"):
            batch.drop_column(c)
        batch.create_unique_constraint("uq_advisor_measurements_trial_id_concurrency", ["trial_id", "concurrency"])
