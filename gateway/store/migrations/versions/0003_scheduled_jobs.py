"""scheduled jobs: job owner, timeout and failure streak; run trigger, owner and delivery

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the columns the cron scheduler keeps on jobs, runs and report chunks."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("timeout", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("anchor_at", _WHEN, nullable=True))
        batch_op.add_column(
            sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("failure_notified", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("job_runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("trigger", sa.String(length=16), nullable=False, server_default="schedule")
        )
        batch_op.add_column(sa.Column("owner", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("delivery_detail", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("session_id", _ID, nullable=True))
        batch_op.add_column(sa.Column("turn_id", _ID, nullable=True))
        batch_op.create_index(batch_op.f("ix_job_runs_status"), ["status"], unique=False)
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_run_id", _ID, nullable=True))


def downgrade() -> None:
    """Drop what `upgrade` added."""
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("job_run_id")
    with op.batch_alter_table("job_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_runs_status"))
        batch_op.drop_column("turn_id")
        batch_op.drop_column("session_id")
        batch_op.drop_column("delivery_detail")
        batch_op.drop_column("owner")
        batch_op.drop_column("trigger")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("failure_notified")
        batch_op.drop_column("consecutive_failures")
        batch_op.drop_column("anchor_at")
        batch_op.drop_column("timeout")
        batch_op.drop_column("user_id")
