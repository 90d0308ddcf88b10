"""A trial says what it was in columns: executed, reused-from, baseline.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``advisor_trials`` gets ``executed`` (the trial deployed its configuration and its result judges it),
``reused_from`` (the trial whose measurements a re-proposed configuration reuses) and ``baseline`` (vLLM's
defaults, measured before the search). ``repeat_of`` (0003) and the ``interrupted`` state were columns already.

Before this revision a reused trial was known only by its reason text (``same configuration as trial N; its
measurements stand``, as ``advisor.tune`` wrote it) and the baseline by its proposer. The upgrade reads those
once, here, to fill the columns of the rows already stored; nothing else parses reasons.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The reason ``advisor.tune`` wrote on a reused trial before 0006.
_REUSED_REASON = re.compile(r"^same configuration as trial (\d+)\s*(?:;|$)")


def upgrade() -> None:
    # ALTER TABLE … ADD COLUMN in place, never a copy of the table: SQLite's batch mode recreates a table it cannot
    # alter (a default that is an expression, e.g. sa.false()), and dropping the old advisor_trials cascaded to
    # every advisor_measurements row (ON DELETE CASCADE; seen on the committed H200 study: all levels gone).
    with op.batch_alter_table("advisor_trials", recreate="never") as batch:
        batch.add_column(sa.Column("executed", sa.Boolean(), nullable=False, server_default=sa.text("false")))
        batch.add_column(sa.Column("reused_from", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("baseline", sa.Boolean(), nullable=False, server_default=sa.text("false")))
    trials = sa.table("advisor_trials", sa.column("id", sa.Integer()), sa.column("state", sa.String()),
                      sa.column("reason", sa.Text()), sa.column("proposer", sa.String()),
                      sa.column("failure_kind", sa.String()), sa.column("executed", sa.Boolean()),
                      sa.column("reused_from", sa.Integer()), sa.column("baseline", sa.Boolean()))
    bind = op.get_bind()
    rows = bind.execute(sa.select(trials.c.id, trials.c.state, trials.c.reason, trials.c.proposer,
                                  trials.c.failure_kind)).all()
    for tid, state, reason, proposer, failure_kind in rows:
        reused = _REUSED_REASON.match(reason or "") if state == "complete" else None
        reused_from = int(reused.group(1)) if reused else None
        executed = state in ("complete", "failed") and reused_from is None and failure_kind != "environment"
        baseline = proposer == "baseline"
        if executed or reused_from is not None or baseline:
            bind.execute(trials.update().where(trials.c.id == tid)
                         .values(executed=executed, reused_from=reused_from, baseline=baseline))


def downgrade() -> None:
    for column in ("baseline", "reused_from", "executed"):  # in place (SQLite ≥ 3.35), for the reason above
        op.execute(f"ALTER TABLE advisor_trials DROP COLUMN {column}")
