"""The advisor_* tables: studies, trials, measurements, exports.

Revision ID: 0001
Revises:
Create Date: 2026-12-01

Written out by hand (not imported from ``db.models``) so that this revision stays what it was when the models
move on. ``tests/test_db.py`` checks that models and migrations agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "advisor_studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("job", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("executor", sa.String(32), nullable=True),
        sa.Column("engine_version", sa.String(64), nullable=True),
        sa.Column("hardware", sa.String(200), nullable=True),
        sa.Column("optuna_study_name", sa.String(512), nullable=True),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("updated_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_advisor_studies"),
        sa.UniqueConstraint("name", name="uq_advisor_studies_name"),
    )
    op.create_table(
        "advisor_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=True),
        sa.Column("config_text", sa.Text(), nullable=True),
        sa.Column("topology", sa.JSON(), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=True),
        sa.Column("objectives", sa.JSON(), nullable=True),
        sa.Column("violation", sa.Double(), nullable=True),
        sa.Column("failure_kind", sa.String(64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.Column("deploy_s", sa.Double(), nullable=True),
        sa.Column("warmup_s", sa.Double(), nullable=True),
        sa.Column("measure_s", sa.Double(), nullable=True),
        sa.Column("teardown_s", sa.Double(), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=True),
        sa.Column("heartbeat_at", _ts(), nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("started_at", _ts(), nullable=False),
        sa.Column("finished_at", _ts(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_advisor_trials"),
        sa.ForeignKeyConstraint(
            ["study_id"], ["advisor_studies.id"],
            name="fk_advisor_trials_study_id_advisor_studies", ondelete="CASCADE",
        ),
        sa.UniqueConstraint("study_id", "number", name="uq_advisor_trials_study_id_number"),
    )
    op.create_index("ix_advisor_trials_study_id_state", "advisor_trials", ["study_id", "state"])
    op.create_table(
        "advisor_measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("num_requests", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.Column("input_tokens", sa.BigInteger(), nullable=True),
        sa.Column("output_tokens", sa.BigInteger(), nullable=True),
        sa.Column("throughput_per_gpu", sa.Double(), nullable=True),
        sa.Column("output_throughput_per_gpu", sa.Double(), nullable=True),
        sa.Column("request_throughput", sa.Double(), nullable=True),
        sa.Column("p50_tokens_per_s_per_user", sa.Double(), nullable=True),
        sa.Column("p90_tokens_per_s_per_user", sa.Double(), nullable=True),
        sa.Column("p99_tokens_per_s_per_user", sa.Double(), nullable=True),
        sa.Column("p50_ttft_ms", sa.Double(), nullable=True),
        sa.Column("p90_ttft_ms", sa.Double(), nullable=True),
        sa.Column("p99_ttft_ms", sa.Double(), nullable=True),
        sa.Column("p50_tpot_ms", sa.Double(), nullable=True),
        sa.Column("p90_tpot_ms", sa.Double(), nullable=True),
        sa.Column("p99_tpot_ms", sa.Double(), nullable=True),
        sa.Column("p50_itl_ms", sa.Double(), nullable=True),
        sa.Column("p90_itl_ms", sa.Double(), nullable=True),
        sa.Column("p99_itl_ms", sa.Double(), nullable=True),
        sa.Column("p50_e2el_ms", sa.Double(), nullable=True),
        sa.Column("p90_e2el_ms", sa.Double(), nullable=True),
        sa.Column("p99_e2el_ms", sa.Double(), nullable=True),
        sa.Column("achieved_concurrency", sa.Double(), nullable=True),
        sa.Column("client_saturated", sa.Boolean(), nullable=False),
        sa.Column("dp_imbalance", sa.Double(), nullable=True),
        sa.Column("prefix_cache_hit_rate", sa.Double(), nullable=True),
        sa.Column("kv_transfer_tokens", sa.Double(), nullable=True),
        sa.Column("preemptions", sa.Double(), nullable=True),
        sa.Column("eplb_balancedness", sa.Double(), nullable=True),
        sa.Column("raw", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_advisor_measurements"),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["advisor_trials.id"],
            name="fk_advisor_measurements_trial_id_advisor_trials", ondelete="CASCADE",
        ),
        sa.UniqueConstraint("trial_id", "concurrency", name="uq_advisor_measurements_trial_id_concurrency"),
    )
    op.create_table(
        "advisor_exports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_advisor_exports"),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["advisor_trials.id"],
            name="fk_advisor_exports_trial_id_advisor_trials", ondelete="CASCADE",
        ),
    )
    op.create_index("ix_advisor_exports_trial_id", "advisor_exports", ["trial_id"])


def downgrade() -> None:
    op.drop_index("ix_advisor_exports_trial_id", table_name="advisor_exports")
    op.drop_table("advisor_exports")
    op.drop_table("advisor_measurements")
    op.drop_index("ix_advisor_trials_study_id_state", table_name="advisor_trials")
    op.drop_table("advisor_trials")
    op.drop_table("advisor_studies")
