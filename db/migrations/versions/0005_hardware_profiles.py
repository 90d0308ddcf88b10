"""Hardware profiles: the model's shape measured on the user's GPUs before the first trial.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

``advisor_hardware_profiles``: one row per ``advisor profile`` run — the GPU kind and count, vLLM's version,
the model's shape (the widths that set a layer's cost, not its depth) and its key, the fitted performance-model
parameters with their report (errors before/after, cross-validated), and every probe level as measured. The
simulated executor, the guide and the knee search's start look a matching profile up here.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json = sa.JSON()
    op.create_table(
        "advisor_hardware_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu", sa.String(32), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("engine_version", sa.String(64), nullable=False),
        sa.Column("shape_key", sa.String(32), nullable=False),
        sa.Column("model_name", sa.String(256), nullable=False),
        sa.Column("shape", json, nullable=False),
        sa.Column("params", json, nullable=False),
        sa.Column("report", json, nullable=False),
        sa.Column("probes", json, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_advisor_hardware_profiles"),
    )
    op.create_index("ix_advisor_hardware_profiles_gpu", "advisor_hardware_profiles", ["gpu"])
    op.create_index("ix_advisor_hardware_profiles_shape_key", "advisor_hardware_profiles", ["shape_key"])


def downgrade() -> None:
    op.drop_index("ix_advisor_hardware_profiles_shape_key", table_name="advisor_hardware_profiles")
    op.drop_index("ix_advisor_hardware_profiles_gpu", table_name="advisor_hardware_profiles")
    op.drop_table("advisor_hardware_profiles")
