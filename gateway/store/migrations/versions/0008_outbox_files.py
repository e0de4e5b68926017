"""outbox files: a chunk may carry one file (`send_file`), each file its own row

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 12:40:00

`outbox.attachment` holds the file a chunk delivers (path under the state directory, MIME
type, size, the name the person sees); NULL for text chunks. Each file of a reply is its own
row with its own idempotency key, so a retry never resends text that went out already.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add `outbox.attachment`."""
    op.add_column("outbox", sa.Column("attachment", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop `outbox.attachment`."""
    op.drop_column("outbox", "attachment")
