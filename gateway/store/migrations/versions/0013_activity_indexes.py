"""console: time indexes for the overview's charts

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 00:30:00

The console's charts read the last hour or day of inbound messages, outbox rows and turns
by time: `inbox.received_at`, `outbox.created_at` and `turns.started_at` are indexed so
that read stays small on a database that holds months.
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

INDEXES = (
    ("inbox", "received_at"),
    ("outbox", "created_at"),
    ("turns", "started_at"),
)


def upgrade() -> None:
    """Add the three time indexes."""
    for table, column in INDEXES:
        op.create_index(op.f(f"ix_{table}_{column}"), table, [column], unique=False)


def downgrade() -> None:
    """Drop what `upgrade` added."""
    for table, column in INDEXES:
        op.drop_index(op.f(f"ix_{table}_{column}"), table_name=table)
