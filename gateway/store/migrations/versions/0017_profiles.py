"""profiles: the profile of each session and job, and the bindings `herald profiles bind` made

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29 09:00:00

`sessions.profile` is the profile that answered the session (a chat whose binding changes
starts a new session); `jobs.profile` the profile a job runs as; `profile_bindings` the
bindings stored from the command line (every instance reads them), "" for a key that
matches anything.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add `sessions.profile`, `jobs.profile` and `profile_bindings`."""
    # Plain ADD COLUMNs (SQLite too): a batch copy of `sessions` would trip over its trigger.
    op.add_column(
        "sessions",
        sa.Column("profile", sa.String(length=32), nullable=False, server_default="default"),
    )
    op.add_column(
        "jobs",
        sa.Column("profile", sa.String(length=32), nullable=False, server_default="default"),
    )
    op.create_table(
        "profile_bindings",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("profile", sa.String(length=32), nullable=False),
        sa.Column("platform", sa.String(length=32), nullable=False),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("chat", sa.Text(), nullable=False),
        sa.Column("thread", sa.Text(), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profile_bindings")),
        sa.UniqueConstraint(
            "platform",
            "account",
            "chat",
            "thread",
            name=op.f("uq_profile_bindings_platform_account_chat_thread"),
        ),
    )


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_table("profile_bindings")
    op.drop_column("jobs", "profile")
    op.drop_column("sessions", "profile")
