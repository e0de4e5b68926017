"""tool approvals: a tool call waiting for the person's yes is a row

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 12:30:00

A call of an MCP tool that needs approval writes a `tool_approvals` row before asking in the
chat; `/approve` and `/deny` decide it. A restart while it waits loses nothing: the turn runs
again, finds the row by its call key and asks again. The row keeps the turn and the decision.
The question's chunk carries buttons (`outbox.buttons`) where the platform has them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create `tool_approvals`; outbox chunks may carry buttons (approve, deny)."""
    op.create_table(
        "tool_approvals",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("session_key", sa.Text(), nullable=False),
        sa.Column("turn_id", _ID, nullable=True),
        sa.Column("call_key", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("requester", sa.Text(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("asked", sa.Integer(), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("expires_at", _WHEN, nullable=False),
        sa.Column("decided_at", _WHEN, nullable=True),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_approvals")),
    )
    op.create_index(
        op.f("ix_tool_approvals_session_key_status"),
        "tool_approvals",
        ["session_key", "status"],
        unique=False,
    )
    op.create_index(
        op.f("ix_tool_approvals_call_key"), "tool_approvals", ["call_key"], unique=False
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("buttons", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop `tool_approvals` and the outbox's buttons."""
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("buttons")
    op.drop_index(op.f("ix_tool_approvals_call_key"), table_name="tool_approvals")
    op.drop_index(op.f("ix_tool_approvals_session_key_status"), table_name="tool_approvals")
    op.drop_table("tool_approvals")
