"""triggers: a row per accepted delivery of a signed webhook (`POST /hooks/<name>`)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 03:00:00

`trigger_runs` is the claim on a delivery id (UNIQUE trigger + delivery id: a redelivery
runs nothing; UNIQUE trigger + content key: a replay under a new delivery id neither) and
the run the delivery became.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_WHEN = sa.DateTime(timezone=True)
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Add the `trigger_runs` table."""
    op.create_table(
        "trigger_runs",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("trigger", sa.String(length=64), nullable=False),
        sa.Column("delivery_id", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("event", sa.Text(), nullable=True),
        sa.Column("headers", sa.JSON(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("received_at", _WHEN, nullable=False),
        sa.Column("started_at", _WHEN, nullable=True),
        sa.Column("finished_at", _WHEN, nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("session_id", _ID, nullable=True),
        sa.Column("turn_id", _ID, nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("delivery_status", sa.String(length=16), nullable=True),
        sa.Column("content_key", sa.String(length=80), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trigger_runs")),
        sa.UniqueConstraint(
            "trigger", "delivery_id", name=op.f("uq_trigger_runs_trigger_delivery_id")
        ),
        sa.UniqueConstraint(
            "trigger", "content_key", name=op.f("uq_trigger_runs_trigger_content_key")
        ),
    )
    op.create_index(
        op.f("ix_trigger_runs_status_id"), "trigger_runs", ["status", "id"], unique=False
    )
    op.create_index(
        op.f("ix_trigger_runs_trigger_id"), "trigger_runs", ["trigger", "id"], unique=False
    )


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_index(op.f("ix_trigger_runs_trigger_id"), table_name="trigger_runs")
    op.drop_index(op.f("ix_trigger_runs_status_id"), table_name="trigger_runs")
    op.drop_table("trigger_runs")
