"""File bytes by content in SQL: the `blobs` record of every stored file (whichever backend
holds its bytes), the bytes themselves in `blob_chunks` for the database backend, and
`session_files` (files a session holds that no inbound message carries).

A blob is put in three steps, each its own short transaction (a large file never holds the
writer): `begin_put` records it as `pending` (or finds it complete and touches it), the
bytes go in (`put_chunk`, or the bucket), `finish_put` checks they are all there and marks
the row with its backend. Readers only trust complete rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import delete, func, select, update

from gateway.contracts.ids import SessionKey
from gateway.contracts.messages import Attachment, utcnow
from gateway.store import inbox as inbox_sql
from gateway.store import outbox as outbox_sql
from gateway.store.sql import insert_or_skip
from gateway.store.store import Store
from gateway.store.tables import (
    blob_chunks,
    blobs,
    inbox,
    outbox,
    session_files,
    sessions,
    settings,
)

_length = func.length(blob_chunks.c.data)
PENDING = "pending"
"""The `store` of a blob whose bytes are still being written."""


@dataclass(frozen=True, slots=True)
class BlobRow:
    """What the database records of one blob."""

    key: str
    size: int
    media_type: str
    store: str
    """`database`, `s3`, or `pending` (not readable yet)."""
    created_at: datetime
    used_at: datetime


class BlobRecords:
    """The `blobs`, `blob_chunks` and `session_files` tables."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def get(self, key: str) -> BlobRow | None:
        """The record of `key`, or None."""
        async with self.store.read() as conn:
            row = (await conn.execute(select(blobs).where(blobs.c.key == key))).mappings().first()
        if row is None:
            return None
        return BlobRow(
            str(row["key"]),
            int(row["size"]),
            str(row["media_type"]),
            str(row["store"]),
            row["created_at"],
            row["used_at"],
        )

    async def begin_put(self, key: str, size: int, media_type: str) -> str | None:
        """Touch a complete blob `key` and return its store; or record it `pending` (None:
        write the bytes, then `finish_put`)."""
        now = utcnow()
        async with self.store.write() as conn:
            found = await conn.scalar(select(blobs.c.store).where(blobs.c.key == key))
            if found is not None and found != PENDING:
                await conn.execute(update(blobs).where(blobs.c.key == key).values(used_at=now))
                return str(found)
            if found is None:
                await insert_or_skip(
                    conn,
                    blobs,
                    {
                        "key": key,
                        "size": size,
                        "media_type": media_type[:200],
                        "store": PENDING,
                        "created_at": now,
                        "used_at": now,
                    },
                )
            else:  # an earlier try died: start its clock again
                await conn.execute(
                    update(blobs).where(blobs.c.key == key).values(created_at=now, used_at=now)
                )
        return None

    async def put_chunk(self, key: str, seq: int, data: bytes) -> None:
        """Store chunk `seq` of `key` (kept as it is if it exists: the same content)."""
        async with self.store.write() as conn:
            await insert_or_skip(conn, blob_chunks, {"key": key, "seq": seq, "data": data})

    async def chunk_totals(self, key: str) -> tuple[int, int]:
        """(chunks, bytes) stored for `key` in `blob_chunks`."""
        async with self.store.read() as conn:
            row = (
                await conn.execute(
                    select(
                        func.count(), func.coalesce(func.sum(func.length(blob_chunks.c.data)), 0)
                    )
                    .select_from(blob_chunks)
                    .where(blob_chunks.c.key == key)
                )
            ).one()
        return int(row[0]), int(row[1])

    async def finish_put(self, key: str, backend: str) -> bool:
        """Mark `key` complete in `backend`; False when its row is gone (pruned meanwhile)."""
        async with self.store.write() as conn:
            result = await conn.execute(
                update(blobs).where(blobs.c.key == key).values(store=backend, used_at=utcnow())
            )
        return bool(result.rowcount)

    async def chunks(self, key: str, first: int, count: int) -> list[bytes]:
        """Chunks `first` … `first + count - 1` of `key` that exist, in order."""
        async with self.store.read() as conn:
            rows = await conn.execute(
                select(blob_chunks.c.data)
                .where(
                    blob_chunks.c.key == key,
                    blob_chunks.c.seq >= first,
                    blob_chunks.c.seq < first + count,
                )
                .order_by(blob_chunks.c.seq)
            )
            return [bytes(r[0]) for r in rows]

    async def delete_chunks(self, key: str) -> None:
        """Drop the database's bytes of `key`."""
        async with self.store.write() as conn:
            await conn.execute(delete(blob_chunks).where(blob_chunks.c.key == key))

    async def forget(self, key: str, unless_used_since: datetime | None = None) -> bool:
        """Delete the record of `key` (after its bytes), unless it was put again since
        `unless_used_since`; whether it was deleted."""
        async with self.store.write() as conn:
            condition = [blobs.c.key == key]
            if unless_used_since is not None:
                condition.append(blobs.c.used_at < unless_used_since)
            result = await conn.execute(delete(blobs).where(*condition))
        return bool(result.rowcount)

    async def expired(self, cutoff: datetime, stale: datetime, limit: int = 500) -> list[BlobRow]:
        """Complete blobs not put since `cutoff`, and pending ones begun before `stale`."""
        async with self.store.read() as conn:
            rows = (
                (
                    await conn.execute(
                        select(blobs)
                        .where(
                            ((blobs.c.store != PENDING) & (blobs.c.used_at < cutoff))
                            | ((blobs.c.store == PENDING) & (blobs.c.created_at < stale))
                        )
                        .order_by(blobs.c.used_at)
                        .limit(limit)
                    )
                )
                .mappings()
                .all()
            )
        return [
            BlobRow(
                str(r["key"]),
                int(r["size"]),
                str(r["media_type"]),
                str(r["store"]),
                r["created_at"],
                r["used_at"],
            )
            for r in rows
        ]

    async def setting_once(self, name: str, value: str) -> str:
        """Set `settings[name]` to `value` unless it is set; the value it holds now (the
        first writer's, whichever instance that was)."""
        async with self.store.write() as conn:
            await insert_or_skip(
                conn, settings, {"key": name, "value": value, "updated_at": utcnow()}
            )
            found = await conn.scalar(select(settings.c.value).where(settings.c.key == name))
        return str(found)

    async def add_session_files(self, key: SessionKey, files: Sequence[Attachment]) -> None:
        """Record that session `key` holds `files` (each with its blob)."""
        now = utcnow()
        async with self.store.write() as conn:
            for a in files:
                assert a.blob is not None
                await conn.execute(
                    session_files.insert().values(
                        session_key=str(key),
                        blob=a.blob,
                        path=str(a.path),
                        filename=a.filename,
                        mime_type=a.mime_type[:200],
                        size=a.size,
                        created_at=now,
                    )
                )

    async def drop_session_files(self, key: SessionKey, files: Sequence[Attachment]) -> None:
        """Forget `files` of session `key` (a request that did not run)."""
        paths = [str(a.path) for a in files]
        async with self.store.write() as conn:
            await conn.execute(
                delete(session_files).where(
                    session_files.c.session_key == str(key), session_files.c.path.in_(paths)
                )
            )

    async def session_files(self, key: SessionKey | str, limit: int) -> list[Attachment]:
        """The newest `limit` files session `key` holds, oldest first."""
        async with self.store.read() as conn:
            rows = (
                (
                    await conn.execute(
                        select(session_files)
                        .where(session_files.c.session_key == str(key))
                        .order_by(session_files.c.id.desc())
                        .limit(limit)
                    )
                )
                .mappings()
                .all()
            )
        return [
            Attachment(
                Path(str(r["path"])),
                str(r["mime_type"]),
                int(r["size"]),
                str(r["filename"]),
                blob=str(r["blob"]),
            )
            for r in reversed(rows)
        ]

    async def prune_session_files(self, cutoff: datetime) -> int:
        """Forget session files recorded before `cutoff`; how many."""
        async with self.store.write() as conn:
            result = await conn.execute(
                delete(session_files).where(session_files.c.created_at < cutoff)
            )
        return int(result.rowcount or 0)

    # An older install's files (`gateway/files_import.py`) --------------------------------

    async def inbox_files(self, after: int, limit: int) -> list[tuple[int, tuple[Attachment, ...]]]:
        """(id, attachments) of inbox rows after id `after` that carry files, by id."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(inbox.c.id, inbox.c.payload)
                    .where(inbox.c.id > after, inbox.c.payload.is_not(None))
                    .order_by(inbox.c.id)
                    .limit(limit)
                )
            ).all()
        return [(int(r[0]), inbox_sql.attachments_of(r[1])) for r in rows]

    async def set_inbox_files(self, row_id: int, attachments: Sequence[Attachment]) -> None:
        """Store inbox row `row_id`'s attachments as given (the rest of its payload kept)."""
        async with self.store.write() as conn:
            payload = await conn.scalar(select(inbox.c.payload).where(inbox.c.id == row_id))
            kept = dict(payload) if isinstance(payload, dict) else {}
            kept["attachments"] = inbox_sql.attachments_json(attachments)
            await conn.execute(update(inbox).where(inbox.c.id == row_id).values(payload=kept))

    async def outbox_files(self, after: int, limit: int) -> list[tuple[int, Attachment]]:
        """(id, attachment) of outbox rows after id `after` that carry a file, by id."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(outbox.c.id, outbox.c.attachment)
                    .where(outbox.c.id > after, outbox.c.attachment.is_not(None))
                    .order_by(outbox.c.id)
                    .limit(limit)
                )
            ).all()
        out: list[tuple[int, Attachment]] = []
        for row_id, value in rows:
            found = outbox_sql.attachment_of(value)
            if found is not None:
                out.append((int(row_id), found))
        return out

    async def set_outbox_file(self, row_id: int, attachment: Attachment) -> None:
        """Store outbox row `row_id`'s file as given."""
        async with self.store.write() as conn:
            await conn.execute(
                update(outbox)
                .where(outbox.c.id == row_id)
                .values(attachment=outbox_sql.attachment_json(attachment))
            )

    async def api_session_keys(self) -> list[str]:
        """The keys of every HTTP API session."""
        async with self.store.read() as conn:
            rows = await conn.execute(
                select(sessions.c.key).where(sessions.c.key.like("api:%")).distinct()
            )
            return [str(r[0]) for r in rows]
