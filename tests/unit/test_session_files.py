"""Received files kept through the blob store: a message's downloads go into the store (the
download moved to the cache, its name a label only), a file over the cap or a store that
fails becomes a note in the message, each session sees only its own files, and pruning
covers the local scratch and cache folders."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.blobs import Blobs, DatabaseBlobs
from gateway.contracts.errors import FileGone
from gateway.contracts.messages import Attachment
from gateway.media import StoredFiles, prune_files
from gateway.store import Store
from gateway.store.blobs import BlobRecords
from gateway.store.inbox import Inbox
from tests.fakes.platform import inbound

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def files(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[StoredFiles]:
    shutil.copyfile(sqlite_template, tmp_path / "herald.db")
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}") as store:
        records = BlobRecords(store)
        blobs = Blobs(records, DatabaseBlobs(records), tmp_path / "cache", max_bytes=2048)
        yield StoredFiles(Inbox(store), blobs)


async def test_downloads_go_into_the_blob_store_and_leave_the_download_folder(
    tmp_path: Path, files: StoredFiles
) -> None:
    download = tmp_path / "files" / "slack" / "default" / "C1" / "17-0-notes.pdf"
    download.parent.mkdir(parents=True)
    download.write_bytes(b"%PDF")
    big = download.with_name("17-1-big.bin")
    big.write_bytes(b"x" * 4096)
    message = replace(
        inbound("see attached"),
        attachments=(
            Attachment(download, "application/pdf", 4, "../../etc/passwd"),
            Attachment(big, "application/octet-stream", 4096, "big.bin"),
        ),
    )

    kept = await files.keep_received(message)

    [pdf] = kept.attachments
    assert pdf.blob is not None
    assert pdf.filename == "../../etc/passwd"  # a label only, never a path
    assert pdf.path.is_relative_to(tmp_path / "cache")
    assert pdf.path.name == "passwd"
    assert "[file big.bin not kept: the file is 4096 bytes" in kept.text
    assert not download.exists()
    assert not big.exists()
    pdf.path.unlink()  # the cache is only a cache
    assert (await files.local(pdf)).read_bytes() == b"%PDF"
    with pytest.raises(FileGone):
        await files.local(Attachment(tmp_path / "gone.pdf", "application/pdf", 1, "gone.pdf"))


def test_prune_covers_scratch_and_cache_folders(tmp_path: Path) -> None:
    month_ago = time.time() - 31 * 86400
    old_chat = tmp_path / "telegram" / "default" / "42" / "1-0-photo.jpg"
    old_cached = tmp_path / "cache" / "ab" / ("ab" * 32) / "photo.jpg"
    new_cached = tmp_path / "cache" / "cd" / ("cd" * 32) / "photo.jpg"
    for path in (old_chat, old_cached, new_cached):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    for path in (old_chat, old_cached):
        os.utime(path, (month_ago, month_ago))

    assert prune_files(tmp_path, 30 * 86400) == 2
    assert not old_chat.parent.exists()
    assert not old_cached.parent.exists()
    assert new_cached.exists()
