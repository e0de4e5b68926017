"""api: the Idempotency-Key of the API request a turn answers

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 15:40:00

`turns.idempotency_key` holds the `Idempotency-Key` header of the API request the turn
answers, so that a retry of that request returns or continues the same turn instead of
asking the question again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add `turns.idempotency_key` and its index."""
    op.add_column("turns", sa.Column("idempotency_key", sa.String(length=256), nullable=True))
    op.create_index(
        op.f("ix_turns_session_id_idempotency_key"),
        "turns",
        ["session_id", "idempotency_key"],
        unique=False,
    )


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_index(op.f("ix_turns_session_id_idempotency_key"), table_name="turns")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("idempotency_key")
