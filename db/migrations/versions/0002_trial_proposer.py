"""advisor_trials.proposer: who proposed the candidate — the performance model, the sampler, or the grid.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

A guided study alternates model-proposed and sampler-proposed trials (``advisor.proposers.guide``); readers of the
results must be able to tell which is which. Trials recorded before this revision keep NULL (unknown).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("advisor_trials") as batch:  # batch: SQLite cannot alter in place
        batch.add_column(sa.Column("proposer", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("advisor_trials") as batch:
        batch.drop_column("proposer")
