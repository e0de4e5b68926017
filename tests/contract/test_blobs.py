"""The blob store's contract, on each backend: the database on SQLite and on PostgreSQL,
and an S3 bucket (moto's server): bytes in and out in chunks, the size cap, a missing key,
a cached copy changed on disk fetched again, pruning."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from gateway.blobs import CHUNK, Blobs, DatabaseBlobs
from gateway.contracts.errors import FileGone, FileTooLarge
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.blobs import BlobRecords
from gateway.store.tables import blobs as blob_rows
from tests.conftest import PgServer
from tests.fakes.s3 import MotoS3

pytestmark = pytest.mark.timeout(60)

CAP = 3 * CHUNK


@pytest.fixture(
    params=[
        pytest.param("database-sqlite", id="database-sqlite"),
        pytest.param("database-postgres", id="database-postgres", marks=pytest.mark.postgres),
        pytest.param("s3", id="s3"),
    ]
)
async def blob_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Blobs, Store]]:
    """`Blobs` over one backend, with a cap of three chunks."""
    from gateway.s3 import S3Blobs

    if request.param == "database-postgres":
        server: PgServer = request.getfixturevalue("pg_server")
        database: str = request.getfixturevalue("pg_database")
        server.copy_database(database, request.getfixturevalue("pg_template"))
        url = server.url(database)
    else:
        shutil.copyfile(request.getfixturevalue("sqlite_template"), tmp_path / "herald.db")
        url = f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}"
    async with Store.open(url) as store:
        records = BlobRecords(store)
        if request.param == "s3":
            moto: MotoS3 = request.getfixturevalue("moto_s3")
            async with S3Blobs(moto.config(await moto.new_bucket())) as bucket:
                yield Blobs(records, bucket, tmp_path / "cache", max_bytes=CAP), store
        else:
            yield Blobs(records, DatabaseBlobs(records), tmp_path / "cache", max_bytes=CAP), store


async def read_all(blobs: Blobs, key: str) -> tuple[bytes, int]:
    """The bytes of `key` and the number of chunks they came in."""
    out = bytearray()
    pieces = 0
    async for block in blobs.read(key):
        out.extend(block)
        pieces += 1
    return bytes(out), pieces


async def test_bytes_go_in_and_come_out_in_chunks_once_per_content(
    blob_store: tuple[Blobs, Store], tmp_path: Path
) -> None:
    blobs, _ = blob_store
    data = os.urandom(2 * CHUNK + 123)
    source = tmp_path / "in.bin"
    source.write_bytes(data)
    key, size = await blobs.put(source, "application/octet-stream")
    assert (key, size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert await blobs.put(source) == (key, size)  # the same bytes: kept once
    got, pieces = await read_all(blobs, key)
    assert got == data
    assert pieces > 1  # streamed, not one piece
    row = await blobs.records.get(key)
    assert row is not None
    assert row.store == blobs.backend.name
    local = await blobs.local(key, "../../etc/passwd")
    assert local.read_bytes() == data
    assert local.is_relative_to(tmp_path / "cache")  # a name never leaves the cache
    assert local.name == "passwd"


async def test_a_file_over_the_cap_is_refused_and_nothing_is_kept(
    blob_store: tuple[Blobs, Store], tmp_path: Path
) -> None:
    blobs, _ = blob_store
    source = tmp_path / "big.bin"
    source.write_bytes(b"x" * (CAP + 1))
    with pytest.raises(FileTooLarge, match=f"at most {CAP} bytes"):
        await blobs.put(source)
    with pytest.raises(FileTooLarge):
        await blobs.put_bytes(b"x" * (CAP + 1), "", tmp_path)
    key = hashlib.sha256(b"x" * (CAP + 1)).hexdigest()
    assert await blobs.records.get(key) is None


async def test_a_missing_or_malformed_key_is_gone(blob_store: tuple[Blobs, Store]) -> None:
    blobs, _ = blob_store
    with pytest.raises(FileGone, match="no longer kept"):
        await read_all(blobs, "0" * 64)
    with pytest.raises(FileGone):
        await blobs.local("0" * 64)
    for bad in ("../../etc/passwd", "A" * 64, "0" * 63):
        with pytest.raises(FileGone):
            await read_all(blobs, bad)
        with pytest.raises(ValueError, match="not a file key"):
            blobs.cached(bad)


async def test_a_cached_copy_changed_on_disk_is_fetched_again(
    blob_store: tuple[Blobs, Store], tmp_path: Path
) -> None:
    blobs, _ = blob_store
    data = b"the real report\n" * 100
    key, _ = await blobs.put_bytes(data, "text/plain", tmp_path)
    local = await blobs.local(key, "report.txt")
    local.write_bytes(b"swapped by someone with the disk")
    again = await blobs.local(key, "report.txt")
    assert again == local
    assert again.read_bytes() == data
    local.unlink()
    assert (await blobs.local(key, "report.txt")).read_bytes() == data


async def test_pruning_deletes_what_was_not_put_within_the_retention(
    blob_store: tuple[Blobs, Store], tmp_path: Path
) -> None:
    blobs, store = blob_store
    old, _ = await blobs.put_bytes(b"old file", "text/plain", tmp_path)
    fresh, _ = await blobs.put_bytes(b"fresh file", "text/plain", tmp_path)
    again, _ = await blobs.put_bytes(b"old but sent again", "text/plain", tmp_path)
    long_ago = utcnow() - timedelta(days=40)
    async with store.write() as conn:
        await conn.execute(
            update(blob_rows)
            .where(blob_rows.c.key.in_([old, again]))
            .values(used_at=long_ago, created_at=long_ago)
        )
    await blobs.put_bytes(b"old but sent again", "text/plain", tmp_path)  # used now
    assert await blobs.prune(30 * 86400) == 1
    assert await blobs.records.get(old) is None
    with pytest.raises(FileGone):
        await read_all(blobs, old)
    assert (await read_all(blobs, fresh))[0] == b"fresh file"
    assert (await read_all(blobs, again))[0] == b"old but sent again"
    if isinstance(blobs.backend, DatabaseBlobs):
        assert await blobs.records.chunk_totals(old) == (0, 0)
    assert await blobs.prune(30 * 86400) == 0


async def test_a_put_abandoned_halfway_is_pruned_and_can_be_put_again(
    blob_store: tuple[Blobs, Store], tmp_path: Path
) -> None:
    blobs, store = blob_store
    data = b"half a file" * 1000
    key = hashlib.sha256(data).hexdigest()
    assert await blobs.records.begin_put(key, len(data), "") is None  # then the process died
    with pytest.raises(FileGone):
        await read_all(blobs, key)
    # Put again later: it completes.
    assert (await blobs.put_bytes(data, "", tmp_path))[0] == key
    assert (await read_all(blobs, key))[0] == data
    # Another abandoned one, older than the pending limit, is pruned.
    other = hashlib.sha256(b"other").hexdigest()
    await blobs.records.begin_put(other, 5, "")
    async with store.write() as conn:
        await conn.execute(
            update(blob_rows)
            .where(blob_rows.c.key == other)
            .values(created_at=utcnow() - timedelta(days=1))
        )
    assert await blobs.prune(30 * 86400) == 1
    assert await blobs.records.get(other) is None
