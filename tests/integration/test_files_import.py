"""`import_files`: a state directory as the previous release left it (received files in
session folders named by inbox rows, a staged file an outbox row names, an API picture in
its session's folder, the media-link key file) moves into the blob store. Killed halfway
(the store fails after two files) and run again, it stores each file once, lists each file
once, deletes each original only once its blob reads back, and a second full run moves
nothing."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.blobs import Blobs, DatabaseBlobs
from gateway.contracts.errors import FileStoreUnavailable
from gateway.contracts.ids import SessionKey
from gateway.contracts.messages import Attachment
from gateway.files_import import import_files, legacy_session_dir
from gateway.media import LINK_KEY, StoredFiles
from gateway.store import Store
from gateway.store import inbox as inbox_sql
from gateway.store.blobs import BlobRecords
from gateway.store.inbox import Inbox
from gateway.store.outbox import Chunk, OutboxKind, Target, enqueue
from tests.fakes.platform import inbound

pytestmark = pytest.mark.timeout(60)

ANN = "test:acct:ann"
API = "api:default:carol"


class Failing(DatabaseBlobs):
    """The database backend, failing from its `after`-th write on (a store that goes away
    halfway through the import)."""

    def __init__(self, records: BlobRecords, after: int) -> None:
        super().__init__(records)
        self.left = after

    async def write(self, key: str, path: Path, size: int) -> None:
        if self.left == 0:
            raise FileStoreUnavailable("the database went away")
        self.left -= 1
        await super().write(key, path, size)


def existing(paths: dict[str, bytes]) -> list[str]:
    return [p for p in paths if Path(p).exists()]


async def no_snapshot(*_: object) -> tuple[str, str]:
    return "", ""


@pytest.fixture
async def store(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Store]:
    shutil.copyfile(sqlite_template, tmp_path / "herald.db")
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}") as opened:
        yield opened


async def old_install(state: Path, store: Store) -> dict[str, bytes]:
    """What the previous release left: path → bytes of each file a row names."""
    files = state / "files"
    ann = legacy_session_dir(files, ANN)
    made = {
        ann / "1-0-photo.jpg": b"\xff\xd8 a photo",
        ann / "2-0-notes.txt": b"ann's notes",
        files / "outbox" / "ab12-report.pdf": b"%PDF report",
        legacy_session_dir(files, API) / "api-1-1.png": b"\x89PNG carol's picture",
    }
    for path, data in made.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (state / "media-links.key").write_text("42" * 32)
    photo, notes, report, _ = made
    async with store.write() as conn:
        for n, (path, mime) in enumerate([(photo, "image/jpeg"), (notes, "text/plain")]):
            message = inbound(f"file {n}")
            attachment = Attachment(path, mime, len(made[path]), path.name.split("-", 2)[2])
            await inbox_sql.insert(
                conn,
                replace(message, attachments=(attachment,)),
                key=SessionKey(ANN),
                user_id=None,
            )
        await enqueue(
            conn,
            [
                Chunk(
                    "s1:t1:f0",
                    Target("test", "acct", "ann"),  # type: ignore[arg-type]
                    "your report",
                    kind=OutboxKind.REPLY,
                    attachment=Attachment(report, "application/pdf", 11, "report.pdf"),
                )
            ],
        )
    await store.open_session(SessionKey(API), platform="api", user_id=None, snapshot=no_snapshot)
    return {str(p): d for p, d in made.items()}


async def test_an_import_killed_halfway_and_run_again_moves_each_file_once(
    tmp_path: Path, store: Store
) -> None:
    state = tmp_path / "state"
    made = await old_install(state, store)
    records = BlobRecords(store)
    cache = state / "cache" / "files"

    first = Failing(records, after=2)
    with pytest.raises(FileStoreUnavailable):
        await import_files(state, store, Blobs(records, first, cache, max_bytes=10_000))
    assert await store.get_setting(LINK_KEY) == "42" * 32  # links signed before stay valid
    assert not (state / "media-links.key").exists()
    left = sorted(await asyncio.to_thread(existing, made))
    assert len(left) == 2  # two moved (deleted once read back), two left

    second = Failing(records, after=100)
    again = await import_files(state, store, Blobs(records, second, cache, max_bytes=10_000))
    assert sorted(line.split(" → ")[0] for line in again) == left  # each file listed once
    assert 100 - second.left == 2  # and stored once: the first run's two are not redone
    blobs = Blobs(records, DatabaseBlobs(records), cache, max_bytes=10_000)
    assert await import_files(state, store, blobs) == []  # nothing left to move
    assert await asyncio.to_thread(existing, made) == []

    # Every file reads back from the store through the rows that name it, by its old path
    # (the transcripts' references), with the state directory's files gone.
    files = StoredFiles(Inbox(store), blobs)
    got: dict[str, bytes] = {}
    for key in (ANN, API):
        session = await store.get_session(SessionKey(key))
        if session is None:
            session = await store.open_session(
                SessionKey(key), platform="test", user_id=None, snapshot=no_snapshot
            )
        for a in await files.received(session):
            got[str(a.path)] = (await files.local(a)).read_bytes()
    [(_, report)] = await records.outbox_files(0, 10)
    got[str(report.path)] = (await files.local(report)).read_bytes()
    assert got == made
