"""External measurements: operating points measured outside our studies, imported as evidence.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07

``advisor_external_measurements``: one row per imported operating point (``advisor import``) — a published
measurement or a user's own ``vllm bench serve`` result — with its source, engine, model, precision, GPU kind and
count, mode, the deployment (``DeploymentConfig`` JSON and its words; none for a prefill-only or decode-only
measurement) and the source's words for it, MTP draft tokens, the workload (ISL, OSL, range
ratio), the concurrency and the requests sent, the measured metrics (JSON, keyed by the published rows' metric names), how per-GPU figures
were normalised, notes, the import batch's label and when it was imported. ``content_key`` (unique) is the point's
identity (source, layout, workload, concurrency), so an import repeated adds nothing. These are never trials.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "advisor_external_measurements"


def upgrade() -> None:
    json = sa.JSON()
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch", sa.String(200), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("engine_version", sa.String(200), nullable=True),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("precision", sa.String(200), nullable=True),
        sa.Column("gpu", sa.String(32), nullable=False),
        sa.Column("total_gpus", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("deployment", json, nullable=True),
        sa.Column("deployment_text", sa.Text(), nullable=False),
        sa.Column("layout", sa.Text(), nullable=True),
        sa.Column("mtp", sa.Integer(), nullable=True),
        sa.Column("isl", sa.Integer(), nullable=True),
        sa.Column("osl", sa.Integer(), nullable=True),
        sa.Column("range_ratio", sa.Double(), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("requests", sa.Integer(), nullable=True),
        sa.Column("metrics", json, nullable=False),
        sa.Column("per_gpu_normalization", sa.Text(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("content_key", sa.String(64), nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{TABLE}"),
        sa.UniqueConstraint("content_key", name=f"uq_{TABLE}_content_key"),
    )
    for column in ("batch", "model", "gpu"):
        op.create_index(f"ix_{TABLE}_{column}", TABLE, [column])


def downgrade() -> None:
    for column in ("gpu", "model", "batch"):
        op.drop_index(f"ix_{TABLE}_{column}", table_name=TABLE)
    op.drop_table(TABLE)
