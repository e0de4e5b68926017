"""Moving an older install's files into the blob store (`herald state import`, and the first
start after the upgrade): the files inbox and outbox rows name by path, the pictures sent
over the HTTP API (in the session folders under `state_dir/files/sessions`), and the
media-link key (`state_dir/media-links.key`, into `settings`).

Idempotent and resumable: a row names its file's blob once the bytes are stored and read
back, so a run killed halfway and started again stores each file once; an original is
deleted only after its blob was read back and the row that names it committed. What a run
moved is returned, one line per file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import mimetypes
import re
from pathlib import Path

from gateway.blobs import Blobs, hash_file
from gateway.contracts.errors import FileGone, FileStoreUnavailable, FileTooLarge
from gateway.contracts.ids import SessionKey
from gateway.contracts.messages import Attachment
from gateway.media import KEY_FILE, LINK_KEY, link_key
from gateway.store import Store
from gateway.store.blobs import BlobRecords

logger = logging.getLogger(__name__)

BATCH = 200
"""Rows read per query."""


def legacy_session_dir(files_root: Path, key: str) -> Path:
    """Where an older install kept session `key`'s files (`files/sessions/<slug>-<digest>`)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("._-")[:60] or "session"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return files_root / "sessions" / f"{slug}-{digest}"


async def import_files(state_dir: Path, store: Store, blobs: Blobs) -> list[str]:
    """Move the files of `state_dir` that rows name into `blobs`, and the media-link key
    into `settings`; what was moved (`<path> → <blob>`). Files that are gone are skipped;
    a file the store refuses (too large) is logged and left. Raises FileStoreUnavailable
    (nothing half-done: run it again)."""
    records = BlobRecords(store)
    moved: list[str] = []
    moved += await _link_key(state_dir, store)
    after = 0
    while batch := await records.inbox_files(after, BATCH):
        for row_id, attachments in batch:
            after = row_id
            done = [await _one(blobs, a, moved) for a in attachments]
            if any(d is not a for d, a in zip(done, attachments, strict=True)):
                await records.set_inbox_files(row_id, done)
            await _drop_originals(blobs, done)
    after = 0
    while out := await records.outbox_files(after, BATCH):
        for row_id, attachment in out:
            after = row_id
            done_one = await _one(blobs, attachment, moved)
            if done_one is not attachment:
                await records.set_outbox_file(row_id, done_one)
            await _drop_originals(blobs, [done_one])
    moved += await _api_pictures(state_dir, records, blobs)
    return moved


async def _one(blobs: Blobs, a: Attachment, moved: list[str]) -> Attachment:
    """`a` with its bytes in the store (read back), or `a` unchanged (stored already, gone,
    or refused)."""
    if a.blob is not None or not await asyncio.to_thread(a.path.is_file):
        return a
    try:
        key, size = await blobs.put(a.path, a.mime_type)
    except FileTooLarge as err:
        logger.warning("import: %s left where it is: %s", a.path, err)
        return a
    except FileGone:
        return a
    await _read_back(blobs, key)
    moved.append(f"{a.path} → blob {key[:12]}… ({size} bytes)")
    return Attachment(a.path, a.mime_type, size, a.filename, a.transcript, key)


async def _read_back(blobs: Blobs, key: str) -> None:
    """Read the stored bytes of `key` back and check their hash. Raises
    FileStoreUnavailable."""
    digest = hashlib.sha256()
    async for block in blobs.read(key):
        digest.update(block)
    if digest.hexdigest() != key:
        raise FileStoreUnavailable(f"the stored copy of {key[:12]}… does not read back")


async def _drop_originals(blobs: Blobs, attachments: list[Attachment]) -> None:
    """Delete each original whose blob is stored (its row names it, committed): only when
    the file still holds those very bytes, and never a file in the cache."""
    cache = blobs.cache.resolve()
    for a in attachments:
        if a.blob is None:
            continue
        try:
            path = a.path.resolve()
            if path.is_relative_to(cache) or not await asyncio.to_thread(path.is_file):
                continue
            if (await asyncio.to_thread(hash_file, path))[0] == a.blob:
                await asyncio.to_thread(path.unlink)
        except OSError as err:
            logger.warning("import: cannot delete %s: %s", a.path, err)


async def _link_key(state_dir: Path, store: Store) -> list[str]:
    """The key file's key into `settings` (unless a key is there already); the file is
    deleted once the setting reads back the same key."""
    path = state_dir / KEY_FILE
    if not await asyncio.to_thread(path.is_file):
        return []
    try:
        old = bytes.fromhex((await asyncio.to_thread(path.read_text, "ascii")).strip())
    except (OSError, ValueError) as err:
        logger.warning("import: %s is not a key (%s); left where it is", path, err)
        return []
    had = await store.get_setting(LINK_KEY)
    key = await link_key(store, path)
    if key != old:
        logger.warning(
            "import: settings[%s] holds another key already; %s left where it is", LINK_KEY, path
        )
        return []
    await asyncio.to_thread(path.unlink)
    return [] if had is not None else [f"{path} → settings[{LINK_KEY}]"]


async def _api_pictures(state_dir: Path, records: BlobRecords, blobs: Blobs) -> list[str]:
    """Pictures sent over the HTTP API (files in an API session's folder) into the store and
    `session_files`."""
    root = state_dir / "files"
    moved: list[str] = []
    for key in await records.api_session_keys():
        folder = legacy_session_dir(root, key)
        paths = await asyncio.to_thread(_files_in, folder)
        if not paths:
            continue
        known = {str(a.path): a for a in await records.session_files(key, 10_000)}
        for path in paths:
            if str(path) in known:  # stored by an earlier run, which stopped before this
                await _drop_originals(blobs, [known[str(path)]])
                continue
            mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            done = await _one(blobs, Attachment(path, mime, 0, path.name), moved)
            if done.blob is None:
                continue
            await records.add_session_files(SessionKey(key), [done])
            await _drop_originals(blobs, [done])
        await asyncio.to_thread(_remove_empty, folder)
    return moved


def _files_in(folder: Path) -> list[Path]:
    """The files in `folder`, oldest first (none when it is missing). Blocking."""
    try:
        found = [p for p in folder.iterdir() if p.is_file() and not p.name.endswith(".part")]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime)


def _remove_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty
        folder.rmdir()
