"""delivery receipts: the platform's later report on a sent outbox chunk

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 23:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add `outbox.receipt` (delivered, failed, undelivered, read… as the platform reports),
    and an index to find a chunk by the platform's id of the sent message."""
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("receipt", sa.String(length=16), nullable=True))
    op.create_index(
        op.f("ix_outbox_platform_platform_message_id"),
        "outbox",
        ["platform", "platform_message_id"],
        unique=False,
    )


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_index(op.f("ix_outbox_platform_platform_message_id"), table_name="outbox")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("receipt")
