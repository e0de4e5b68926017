"""state: memory files, skills, job outputs and file bytes in the database

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29 03:00:00

What another instance may read leaves `state_dir` for SQL: `memory_docs` (SOUL.md, USER.md,
MEMORY.md), `skill_files` (every file of every skill), and `blobs` with
`blob_chunks` (file bytes by content hash; with an S3 bucket the row only records the
object). `state_dir` becomes a cache. `herald state import` moves an older install's files in.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the four tables."""
    op.create_table(
        "memory_docs",
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", _WHEN, nullable=False),
        sa.PrimaryKeyConstraint("owner", "name", name=op.f("pk_memory_docs")),
    )
    op.create_table(
        "skill_files",
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("folder", sa.String(length=200), nullable=False),
        sa.Column("path", sa.String(length=400), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("mode", sa.Integer(), nullable=False),
        sa.Column("updated_at", _WHEN, nullable=False),
        sa.PrimaryKeyConstraint("owner", "folder", "path", name=op.f("pk_skill_files")),
    )
    op.create_table(
        "blobs",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("size", _ID, nullable=False),
        sa.Column("media_type", sa.String(length=200), nullable=False),
        sa.Column("store", sa.String(length=16), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("used_at", _WHEN, nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_blobs")),
    )
    op.create_index(op.f("ix_blobs_used_at"), "blobs", ["used_at"])
    op.create_table(
        "blob_chunks",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("key", "seq", name=op.f("pk_blob_chunks")),
    )


def downgrade() -> None:
    """Drop what `upgrade` added."""
    op.drop_table("blob_chunks")
    op.drop_index(op.f("ix_blobs_used_at"), table_name="blobs")
    op.drop_table("blobs")
    op.drop_table("skill_files")
    op.drop_table("memory_docs")
