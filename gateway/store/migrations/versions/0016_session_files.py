"""files: a session's files that no inbound message carries

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29 03:10:00

Pictures sent over the HTTP API were files in the session's folder under `state_dir`; their
bytes are now in the blob store and `session_files` says which session holds them, so any
instance finds them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add `session_files`."""
    op.create_table(
        "session_files",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("session_key", sa.Text(), nullable=False),
        sa.Column("blob", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False),
        sa.Column("mime_type", sa.String(length=200), nullable=False),
        sa.Column("size", _ID, nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_files")),
    )
    op.create_index(op.f("ix_session_files_session_key_id"), "session_files", ["session_key", "id"])
    op.create_index(op.f("ix_session_files_created_at"), "session_files", ["created_at"])


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_index(op.f("ix_session_files_created_at"), table_name="session_files")
    op.drop_index(op.f("ix_session_files_session_key_id"), table_name="session_files")
    op.drop_table("session_files")
