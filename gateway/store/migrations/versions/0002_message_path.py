"""message path: inbox queue fields, outbox edits, pairing, grants, settings

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the queue columns of the inbox and outbox, and the access tables."""
    with op.batch_alter_table("inbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_id", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column("is_direct", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch_op.add_column(
            sa.Column("kind", sa.String(length=16), nullable=False, server_default="message")
        )
        batch_op.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(
            sa.Column("steer", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("kind", sa.String(length=16), nullable=False, server_default="reply")
        )
        batch_op.add_column(sa.Column("edit_of", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("inbox_id", _ID, nullable=True))
    op.create_table(
        "pairings",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("code", sa.String(length=16), nullable=False),
        sa.Column("platform", sa.String(length=32), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=False),
        sa.Column("chat_id", sa.Text(), nullable=False),
        sa.Column("display_name", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("expires_at", _WHEN, nullable=False),
        sa.Column("decided_at", _WHEN, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pairings")),
        sa.UniqueConstraint("code", name=op.f("uq_pairings_code")),
    )
    op.create_index(
        op.f("ix_pairings_platform_status"), "pairings", ["platform", "status"], unique=False
    )
    op.create_index(
        op.f("ix_pairings_platform_external_id"),
        "pairings",
        ["platform", "external_id"],
        unique=False,
    )
    op.create_table(
        "grants",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("platform", sa.String(length=32), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=False),
        sa.Column("granted_at", _WHEN, nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_grants")),
        sa.UniqueConstraint("platform", "external_id", name=op.f("uq_grants_platform_external_id")),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", _WHEN, nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_settings")),
    )


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_table("settings")
    op.drop_table("grants")
    op.drop_index(op.f("ix_pairings_platform_external_id"), table_name="pairings")
    op.drop_index(op.f("ix_pairings_platform_status"), table_name="pairings")
    op.drop_table("pairings")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("inbox_id")
        batch_op.drop_column("edit_of")
        batch_op.drop_column("kind")
    with op.batch_alter_table("inbox", schema=None) as batch_op:
        batch_op.drop_column("attempts")
        batch_op.drop_column("steer")
        batch_op.drop_column("priority")
        batch_op.drop_column("kind")
        batch_op.drop_column("is_direct")
        batch_op.drop_column("user_id")
