"""Levels say which expert routing the servers ran with.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

``advisor_measurements.expert_routing``: ``workload.expert_routing`` as the servers applied it — ``real`` (the
model's router) or vLLM's routing simulator (``uniform``, ``normal``, ``zipf 1.1``) — so a result measured
under simulated skew is never read as one under real traffic, and queries can filter on it. Rows recorded
before keep NULL (not recorded).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("advisor_measurements") as batch:  # batch: SQLite cannot alter in place
        batch.add_column(sa.Column("expert_routing", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("advisor_measurements") as batch:
        batch.drop_column("expert_routing")
