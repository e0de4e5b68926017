"""memory syncs: the external memory provider's durable, ordered queue (and dead syncs)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 12:50:00

One row per finished turn of a person (or edit of their memory files, or end of a session),
written in the turn's own transaction when `memory.provider` is set, sent in `id` order per
person and deleted once the provider took it; past `memory.sync_max_age` it is kept as dead
(`dead_at`) for `herald memory status`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create `memory_syncs`."""
    op.create_table(
        "memory_syncs",
        sa.Column("id", _ID, nullable=False, autoincrement=True),
        sa.Column("person", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("session_key", sa.Text(), nullable=False),
        sa.Column("session_id", _ID, nullable=True),
        sa.Column("turn_id", _ID, nullable=True),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", _WHEN, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("sending_at", _WHEN, nullable=True),
        sa.Column("dead_at", _WHEN, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_memory_syncs"),
    )
    op.create_index("ix_memory_syncs_person_id", "memory_syncs", ["person", "id"])
    op.create_index(
        "ix_memory_syncs_dead_at_next_attempt_at", "memory_syncs", ["dead_at", "next_attempt_at"]
    )


def downgrade() -> None:
    """Drop `memory_syncs` (queued syncs are lost)."""
    op.drop_table("memory_syncs")
