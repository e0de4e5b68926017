"""console: a row per console login, so that logging out ends it on every instance

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 15:30:00

The console's session cookie is signed, and a signature cannot be taken back: the login is
now a row of `console_sessions` (keyed by a hash of the cookie's random part), deleted at
logout. Logins made before this revision have no row and must log in again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the `console_sessions` table."""
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("expires_at", _WHEN, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_sessions")),
    )
    op.create_index(
        op.f("ix_console_sessions_expires_at"), "console_sessions", ["expires_at"], unique=False
    )


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_index(op.f("ix_console_sessions_expires_at"), table_name="console_sessions")
    op.drop_table("console_sessions")
