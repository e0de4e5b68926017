"""several instances on one database: instances, session lanes, who sends a chunk or runs a command

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 15:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add `instances` (heartbeats), `lanes` (which instance runs a session's turns) and
    `outbox.claimed_by` and `inbox.claimed_by`."""
    op.create_table(
        "instances",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.Column("incarnation", _ID, nullable=False),
        sa.Column("started_at", _WHEN, nullable=False),
        sa.Column("heartbeat_at", _WHEN, nullable=False),
        sa.Column("stopped_at", _WHEN, nullable=True),
        sa.Column("holds", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
    )
    op.create_table(
        "lanes",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("token", _ID, nullable=False),
        sa.Column("turn_id", _ID, nullable=True),
        sa.Column("cancel", sa.Text(), nullable=True),
        sa.Column("claimed_at", _WHEN, nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_lanes")),
    )
    op.create_index(op.f("ix_lanes_owner"), "lanes", ["owner"], unique=False)
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claimed_by", sa.String(length=128), nullable=True))
    with op.batch_alter_table("inbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claimed_by", sa.String(length=128), nullable=True))


def downgrade() -> None:
    """Drop what `upgrade` added."""
    with op.batch_alter_table("inbox", schema=None) as batch_op:
        batch_op.drop_column("claimed_by")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("claimed_by")
    op.drop_index(op.f("ix_lanes_owner"), table_name="lanes")
    op.drop_table("lanes")
    op.drop_table("instances")
