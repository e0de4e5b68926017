"""The blob store: file bytes by their SHA-256, behind one small interface with two backends,
the database (`blob_chunks`, the default) and an S3-compatible bucket (`gateway/s3.py`).

Every blob has a row in `blobs` (`gateway/store/blobs.py`) whichever backend holds its
bytes; a blob is read from the backend its row names, so switching `files.store` keeps older
files readable. Bytes move in chunks, never a whole file in memory. `state_dir/cache/files`
only caches them: `Blobs.local` writes a blob there by its hash and checks the hash before
each use (a cached file changed on disk is fetched again).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from gateway.config import FileStore, HeraldConfig
from gateway.contracts.errors import FileGone, FileStoreUnavailable, FileTooLarge
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.blobs import PENDING, BlobRecords

logger = logging.getLogger(__name__)

KEY = re.compile(r"[0-9a-f]{64}")
"""What a blob key looks like (a SHA-256 in lower-case hex): nothing else names a blob."""
CHUNK = 256 * 1024
"""Bytes per `blob_chunks` row, and per read from a local file."""
READ_AHEAD = 4
"""Chunks fetched per query when reading from the database."""
STALE_PENDING = timedelta(hours=6)
"""A blob still `pending` this long after its put began was abandoned (a crash)."""


def is_key(value: str) -> bool:
    """Whether `value` is a blob key (so it may name a file in the cache or a bucket)."""
    return KEY.fullmatch(value) is not None


class BlobBackend(Protocol):
    """Where the bytes of blobs live. `name` is what `blobs.store` records."""

    name: str

    async def write(self, key: str, path: Path, size: int) -> None:
        """Store the bytes of the local file `path` (its SHA-256 is `key`) under `key`.
        Raises FileStoreUnavailable."""
        ...

    def read(self, key: str) -> AsyncIterator[bytes]:
        """The bytes of `key`, chunk by chunk. Raises FileGone (no such blob) or
        FileStoreUnavailable."""
        ...

    async def delete(self, key: str) -> None:
        """Drop the bytes of `key` (nothing when there are none). Raises
        FileStoreUnavailable."""
        ...


def hash_file(path: Path, limit: int | None = None) -> tuple[str, int]:
    """(SHA-256 hex, size) of the file at `path`. Raises FileTooLarge past `limit` bytes
    (read no further), OSError. Blocking."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            size += len(block)
            if limit is not None and size > limit:
                raise FileTooLarge(max(size, path.stat().st_size), limit)
            digest.update(block)
    return digest.hexdigest(), size


def _database_errors(err: Exception) -> FileStoreUnavailable:
    return FileStoreUnavailable(f"the database's file store failed: {type(err).__name__}")


class DatabaseBlobs:
    """`BlobBackend` in the database: `blob_chunks` rows of `CHUNK` bytes, each written in
    its own short transaction."""

    name = "database"

    def __init__(self, records: BlobRecords) -> None:
        self.records = records

    async def write(self, key: str, path: Path, size: int) -> None:
        """See `BlobBackend.write`."""
        try:
            seq = 0
            with await asyncio.to_thread(path.open, "rb") as f:
                while block := await asyncio.to_thread(f.read, CHUNK):
                    await self.records.put_chunk(key, seq, block)
                    seq += 1
            chunks, stored = await self.records.chunk_totals(key)
        except (SQLAlchemyError, OSError) as err:
            raise _database_errors(err) from err
        if stored != size or chunks != seq:
            raise FileStoreUnavailable(
                f"the database holds {stored} of {size} bytes of a file just written "
                "(pruned while it was written?); send it again"
            )

    async def read(self, key: str) -> AsyncIterator[bytes]:
        """See `BlobBackend.read`."""
        seq = 0
        while True:
            try:
                found = await self.records.chunks(key, seq, READ_AHEAD)
            except SQLAlchemyError as err:
                raise _database_errors(err) from err
            if not found and seq == 0:
                raise FileGone(f"no stored file {key[:12]}…")
            for block in found:
                yield block
            if len(found) < READ_AHEAD:
                return
            seq += len(found)

    async def delete(self, key: str) -> None:
        """See `BlobBackend.delete`."""
        try:
            await self.records.delete_chunks(key)
        except SQLAlchemyError as err:
            raise _database_errors(err) from err


class Blobs:
    """Put, read, cache and prune file bytes (`FileBytes` for the gateway's file paths).

    `backend` takes new blobs; `others` are read for blobs stored before a change
    of `files.store`. `max_bytes` caps each file."""

    def __init__(
        self,
        records: BlobRecords,
        backend: BlobBackend,
        cache: Path,
        *,
        max_bytes: int,
        others: Sequence[BlobBackend] = (),
    ) -> None:
        self.records = records
        self.backend = backend
        self.cache = cache
        self.max_bytes = max_bytes
        self.backends = {b.name: b for b in [*others, backend]}

    async def put(self, path: Path, media_type: str = "") -> tuple[str, int]:
        """Store the local file `path`; (its key, its size). The same bytes stored twice are
        kept once (the second put only marks them used now). Raises FileTooLarge,
        FileStoreUnavailable, OSError (the file cannot be read)."""
        key, size = await asyncio.to_thread(hash_file, path, self.max_bytes)
        try:
            found = await self.records.begin_put(key, size, media_type)
        except SQLAlchemyError as err:
            raise _database_errors(err) from err
        if found is not None and found in self.backends:
            return key, size
        await self.backend.write(key, path, size)
        try:
            done = await self.records.finish_put(key, self.backend.name)
        except SQLAlchemyError as err:
            raise _database_errors(err) from err
        if not done:
            raise FileStoreUnavailable("the file's record was pruned while it was written")
        return key, size

    async def put_bytes(self, data: bytes, media_type: str, scratch: Path) -> tuple[str, int]:
        """`put` of `data` through a file under `scratch` (deleted after)."""
        if len(data) > self.max_bytes:
            raise FileTooLarge(len(data), self.max_bytes)
        path = scratch / f".put-{secrets.token_hex(8)}"
        await asyncio.to_thread(_write, path, data)
        try:
            return await self.put(path, media_type)
        finally:
            await asyncio.to_thread(path.unlink, True)

    async def read(self, key: str) -> AsyncGenerator[bytes, None]:
        """The bytes of blob `key`, chunk by chunk. Raises FileGone, FileStoreUnavailable."""
        if not is_key(key):
            raise FileGone("not a file key")
        try:
            row = await self.records.get(key)
        except SQLAlchemyError as err:
            raise _database_errors(err) from err
        if row is None or row.store == PENDING:
            raise FileGone(
                "the file is no longer kept (received and sent files are deleted after "
                "files.retention_days)"
            )
        backend = self.backends.get(row.store)
        if backend is None:
            raise FileStoreUnavailable(
                f"the file is kept in {row.store!r}, which this instance does not reach "
                f"(files.store is {self.backend.name!r}); configure files.{row.store}"
            )
        async for block in backend.read(key):
            yield block

    def cached(self, key: str, name: str = "") -> Path:
        """Where blob `key` is cached on this instance: `cache/<k[:2]>/<key>/<name>`."""
        if not is_key(key):
            raise ValueError("not a file key")
        base = name.replace("\\", "/").rsplit("/", 1)[-1]
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", base).lstrip(".")[:100] or "file"
        return self.cache / key[:2] / key / safe

    async def local(self, key: str, name: str = "") -> Path:
        """A real file holding blob `key` (the cache's copy, its hash checked now; fetched
        again when missing or changed). Raises FileGone, FileStoreUnavailable."""
        path = self.cached(key, name)
        with contextlib.suppress(OSError):
            if (await asyncio.to_thread(hash_file, path))[0] == key:
                return path
            logger.warning("files: cached %s did not match its hash; fetching it again", path)
        part = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
        try:
            await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True, mode=0o700)
            digest = hashlib.sha256()
            with await asyncio.to_thread(part.open, "wb") as f:
                async for block in self.read(key):
                    digest.update(block)
                    await asyncio.to_thread(f.write, block)
            if digest.hexdigest() != key:
                raise FileStoreUnavailable("the stored bytes do not match their hash")
            await asyncio.to_thread(part.replace, path)
        except OSError as err:
            raise FileStoreUnavailable(f"cannot write the cache: {err.strerror}") from err
        finally:
            await asyncio.to_thread(part.unlink, True)
        return path

    async def adopt(self, path: Path, media_type: str, name: str = "") -> tuple[str, int, Path]:
        """`put` a local file, then move it into the cache (no second copy); (key, size, the
        cached path)."""
        key, size = await self.put(path, media_type)
        cached = self.cached(key, name or path.name)
        try:
            await asyncio.to_thread(_move, path, cached)
        except OSError:
            cached = await self.local(key, name or path.name)
        return key, size, cached

    async def prune(self, max_age: float) -> int:
        """Delete blobs not put within `max_age` seconds (and abandoned pending ones), bytes
        first; the number deleted. A backend that fails is logged and tried next time."""
        now = utcnow()
        cutoff = now - timedelta(seconds=max_age)
        removed = 0
        try:
            rows = await self.records.expired(cutoff, now - STALE_PENDING)
            await self.records.prune_session_files(cutoff)
        except (SQLAlchemyError, DBAPIError) as err:
            logger.warning("files: cannot prune the blob store: %s", type(err).__name__)
            return 0
        for row in rows:
            # The record first (unless put again meanwhile), then the bytes: a put that
            # starts between the two finds no record and writes the bytes again.
            pending = row.store == PENDING
            try:
                if not await self.records.forget(row.key, None if pending else cutoff):
                    continue
                backend = self.backends.get(self.backend.name if pending else row.store)
                if backend is not None:
                    await backend.delete(row.key)
                removed += 1
            except (FileStoreUnavailable, SQLAlchemyError) as err:
                logger.warning("files: cannot prune %s…: %s", row.key[:12], err)
        return removed


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(data)


def _move(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.replace(source, target)


async def open_blobs(config: HeraldConfig, store: Store, stack: AsyncExitStack) -> Blobs:
    """The blob store `files.store` names (the bucket's client entered on `stack`), reading
    the other backend too when it is configured. An S3 bucket that cannot be reached now is
    logged, not fatal: files fail with a clear error until it is fixed."""
    files = config.files
    records = BlobRecords(store)
    database = DatabaseBlobs(records)
    cache = config.state_dir / "cache" / "files"
    if files.s3 is None:
        return Blobs(records, database, cache, max_bytes=files.max_file_bytes)
    from gateway.s3 import S3Blobs  # noqa: PLC0415 - aiobotocore only with a bucket

    bucket = await stack.enter_async_context(S3Blobs(files.s3))
    try:
        async with asyncio.timeout(min(files.s3.timeout, 10.0)):
            await bucket.check()
    except (FileStoreUnavailable, TimeoutError) as err:
        logger.warning(
            "files: %s; received and sent files fail until this is fixed",
            err if isinstance(err, FileStoreUnavailable) else "S3 did not answer in time",
        )
    if files.store is FileStore.S3:
        return Blobs(records, bucket, cache, max_bytes=files.max_file_bytes, others=[database])
    return Blobs(records, database, cache, max_bytes=files.max_file_bytes, others=[bucket])
