"""search by owner: each message carries its session's user, in the full-text index too

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 18:40:00

A user's search used to walk every match of every user and join each to its session to keep
the user's own; for a common word that was hundreds of thousands of rows. Now the full-text
index holds one owner token per message (`messages.owner`: the hex of the UTF-8 user id, one
token for any tokenizer, so no id can be split or stemmed into another's), and the index
intersects the words with the owner before a row is read.

`messages.owner` follows `sessions.user_id` through a trigger on `sessions` (identity linking,
a user's deletion), and the store sets it on insert. Upgrading rebuilds the full-text index:
about 5 s per million messages on SQLite and 20 s on PostgreSQL, measured here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_SQLITE_OWNER = "CASE WHEN {0}.user_id IS NULL THEN NULL ELSE lower(hex({0}.user_id)) END"
_PG_OWNER = (
    "CASE WHEN {0}.user_id IS NULL THEN NULL "
    "ELSE encode(convert_to({0}.user_id, 'UTF8'), 'hex') END"
)


def upgrade() -> None:
    """Add `messages.owner`, fill it from the sessions, and index it with the words."""
    op.add_column("messages", sa.Column("owner", sa.Text(), nullable=True))
    if op.get_bind().dialect.name == "sqlite":
        _drop_sqlite_fulltext()
        op.execute(
            "UPDATE messages SET owner = (SELECT "
            + _SQLITE_OWNER.format("s")
            + " FROM sessions s WHERE s.id = messages.session_id)"
        )
        _create_sqlite_fulltext(("content", "owner"))
        op.execute(
            "CREATE TRIGGER sessions_owner AFTER UPDATE OF user_id ON sessions "
            "WHEN old.user_id IS NOT new.user_id BEGIN "
            "UPDATE messages SET owner = "
            + _SQLITE_OWNER.format("new")
            + " WHERE session_id = new.id; END"
        )
    else:
        op.execute("DROP INDEX IF EXISTS ix_messages_search")
        op.execute("ALTER TABLE messages DROP COLUMN IF EXISTS search")
        op.execute(
            "UPDATE messages m SET owner = "
            + _PG_OWNER.format("s")
            + " FROM sessions s WHERE s.id = m.session_id AND s.user_id IS NOT NULL"
        )
        # '@' keeps the owner apart from every word: the parser never starts a lexeme with it.
        _create_pg_fulltext(
            "to_tsvector('english', content) || CASE WHEN owner IS NULL THEN ''::tsvector "
            "ELSE array_to_tsvector(ARRAY['@' || owner]) END"
        )
        op.execute(
            "CREATE FUNCTION herald_sessions_owner() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN UPDATE messages SET owner = "
            + _PG_OWNER.format("NEW")
            + " WHERE session_id = NEW.id; RETURN NULL; END $$"
        )
        op.execute(
            "CREATE TRIGGER sessions_owner AFTER UPDATE OF user_id ON sessions FOR EACH ROW "
            "WHEN (OLD.user_id IS DISTINCT FROM NEW.user_id) "
            "EXECUTE FUNCTION herald_sessions_owner()"
        )


def downgrade() -> None:
    """Back to revision 0005's index of words alone, without `messages.owner`."""
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS sessions_owner")
        _drop_sqlite_fulltext()
        op.execute("ALTER TABLE messages DROP COLUMN owner")
        _create_sqlite_fulltext(("content",))
    else:
        op.execute("DROP TRIGGER IF EXISTS sessions_owner ON sessions")
        op.execute("DROP FUNCTION IF EXISTS herald_sessions_owner()")
        op.execute("DROP INDEX IF EXISTS ix_messages_search")
        op.execute("ALTER TABLE messages DROP COLUMN IF EXISTS search")
        op.execute("ALTER TABLE messages DROP COLUMN owner")
        _create_pg_fulltext("to_tsvector('english', content)")


def _drop_sqlite_fulltext() -> None:
    for trigger in ("insert", "delete", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS messages_fts_{trigger}")
    op.execute("DROP TABLE IF EXISTS messages_fts")


def _create_sqlite_fulltext(columns: tuple[str, ...]) -> None:
    """An external-content FTS5 table over `columns` of `messages`, filled, kept by triggers."""
    names = ", ".join(columns)
    new = ", ".join(f"new.{c}" for c in columns)
    old = ", ".join(f"old.{c}" for c in columns)
    op.execute(
        f"CREATE VIRTUAL TABLE messages_fts USING fts5({names}, "
        "content='messages', content_rowid='id', tokenize='porter unicode61')"
    )
    op.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
    add = f"INSERT INTO messages_fts(rowid, {names}) VALUES (new.id, {new});"
    remove = (
        f"INSERT INTO messages_fts(messages_fts, rowid, {names}) VALUES ('delete', old.id, {old});"
    )
    op.execute(f"CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN {add} END")
    op.execute(f"CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN {remove} END")
    op.execute(
        f"CREATE TRIGGER messages_fts_update AFTER UPDATE OF {names} ON messages "
        f"BEGIN {remove} {add} END"
    )


def _create_pg_fulltext(expression: str) -> None:
    op.execute(
        f"ALTER TABLE messages ADD COLUMN search tsvector GENERATED ALWAYS AS ({expression}) STORED"
    )
    op.execute("CREATE INDEX ix_messages_search ON messages USING GIN (search)")
