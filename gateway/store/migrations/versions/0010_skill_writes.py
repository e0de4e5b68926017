"""skills: the skills index frozen into each session; every skill write recorded

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 12:40:00

`sessions.skills_snapshot` holds the skills index as it was when the session opened (like
the USER.md and MEMORY.md snapshots). `skill_writes` records every write to a skill — who
(agent, review, operator), when, which session and turn, the diff — and holds the writes that
wait for the operator's approval (`skills.write_approval`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add `sessions.skills_snapshot` and the `skill_writes` table."""
    # A plain ADD COLUMN (SQLite too): a batch copy of `sessions` would trip over its trigger.
    op.add_column(
        "sessions", sa.Column("skills_snapshot", sa.Text(), nullable=False, server_default="")
    )
    op.create_table(
        "skill_writes",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("skill", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("category", sa.String(length=64), nullable=True),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("file_path", sa.Text(), nullable=False),
        sa.Column("before", sa.Text(), nullable=True),
        sa.Column("after", sa.Text(), nullable=True),
        sa.Column("diff", sa.Text(), nullable=False),
        sa.Column("author", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("session_id", _ID, nullable=True),
        sa.Column("turn_id", _ID, nullable=True),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("decided_at", _WHEN, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_skill_writes")),
    )
    op.create_index(
        op.f("ix_skill_writes_status_id"), "skill_writes", ["status", "id"], unique=False
    )
    op.create_index(op.f("ix_skill_writes_skill_id"), "skill_writes", ["skill", "id"], unique=False)


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_index(op.f("ix_skill_writes_skill_id"), table_name="skill_writes")
    op.drop_index(op.f("ix_skill_writes_status_id"), table_name="skill_writes")
    op.drop_table("skill_writes")
    op.drop_column("sessions", "skills_snapshot")
