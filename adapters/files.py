"""Storing files that arrive with inbound messages (shared by the adapters)."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar

import aiohttp

from gateway.contracts.adapter import InboundSink, ScreeningSink
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.messages import Attachment, InboundMessage

logger = logging.getLogger(__name__)


class Named(Protocol):
    """A file reference that has a name to tell the agent."""

    @property
    def filename(self) -> str: ...


RefT = TypeVar("RefT", bound=Named)


NOT_ALLOWED = "not downloaded: the sender is not allowed"
UNAVAILABLE = "unavailable"
"""What the note of a file whose download failed says (`[file NAME unavailable: why]`)."""
MAX_RETRY_PAUSE = 5.0
"""The longest a download waits before its one retry."""


async def may_fetch(sink: InboundSink, message: InboundMessage) -> bool:
    """Whether the files of `message` may be downloaded: its sender is allowed (asked of a
    `ScreeningSink` before any byte is fetched), or the sink does not screen."""
    return not isinstance(sink, ScreeningSink) or await sink.may_fetch(message)


async def with_files(
    message: InboundMessage,
    files: Sequence[RefT],
    download: Callable[[int, RefT], Awaitable[Attachment]],
    *,
    sink: InboundSink,
    retry_pause: float = 1.0,
) -> InboundMessage:
    """`message` with its files downloaded as attachments, in order.

    Nothing is downloaded for a sender `sink` does not allow (each file becomes a note: the
    message is rejected anyway, and a stranger's files would only cost disk). A file is the
    message's problem, never the adapter's: a `download` that fails (refused, not found, a
    5xx, a timeout, even a platform's "token refused" for that one file) is tried once more
    after `retry_pause` seconds when the failure may pass, then becomes a note in the text
    ("[file NAME unavailable: why; ...]") and the message goes on without it.
    """
    if not files:
        return message
    attachments: list[Attachment] = []
    notes: list[str] = []
    if not await may_fetch(sink, message):
        notes = [f"[file {ref.filename} {NOT_ALLOWED}]" for ref in files]
        files = ()
    for index, ref in enumerate(files):
        try:
            attachments.append(await _twice(functools.partial(download, index, ref), retry_pause))
        except (NotReady, RateLimited, PermanentSendError, AuthError) as err:
            logger.info("%s: file %s unavailable: %s", message.platform, index, err)
            notes.append(
                f"[file {ref.filename} {UNAVAILABLE}: {err}; ask the person to send it again]"
            )
    text = "\n".join([message.text, *notes]) if notes else message.text
    return replace(message, attachments=tuple(attachments), text=text)


async def _twice(fetch: Callable[[], Awaitable[Attachment]], pause: float) -> Attachment:
    """`fetch()`, once more after `pause` seconds (or the platform's `retry_after`, at most
    `MAX_RETRY_PAUSE`) when it failed with an error that may pass."""
    try:
        return await fetch()
    except (NotReady, RateLimited) as err:
        wait = err.retry_after if isinstance(err, RateLimited) else pause
        await asyncio.sleep(min(max(wait, 0.0), MAX_RETRY_PAUSE))
    return await fetch()


def safe_name(name: str) -> str:
    """A file name part without path separators, leading dots or odd characters."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".")[:100]
    return cleaned or "file"


def attachment_path(files_dir: Path, key: str, index: int, filename: str) -> Path:
    """Where file `index` of message `key` (`<chat>:<id>`) is kept: `<chat>/<id>-<index>-<name>`."""
    chat, _, number = key.partition(":")
    return files_dir / safe_name(chat) / f"{safe_name(number)}-{index}-{safe_name(filename)}"


def save_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (a reader never sees half a file). Blocking."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(path)


async def download(
    http: aiohttp.ClientSession,
    url: str,
    *,
    what: str,
    limit: int,
    headers: Mapping[str, str] | None = None,
    client_timeout: aiohttp.ClientTimeout | None = None,
) -> bytes:
    """The body at `url`, read up to `limit` bytes.

    Raises NotReady (try again later: 429, 5xx, a connection that fails; `what` names the
    file in the message) or PermanentSendError (leave the file out: any other status, or
    larger than `limit`).
    """
    timeout = client_timeout or http.timeout  # None would switch the session's timeout off
    try:
        async with http.get(url, headers=headers, timeout=timeout) as response:
            if response.status >= 500 or response.status == 429:
                raise NotReady(f"{what}: HTTP {response.status}")
            if response.status != 200:
                raise PermanentSendError(f"HTTP {response.status}")
            if (response.content_length or 0) > limit:
                raise PermanentSendError(f"larger than {limit} bytes")
            data = bytearray()
            async for block in response.content.iter_chunked(65536):
                data.extend(block)
                if len(data) > limit:
                    raise PermanentSendError(f"larger than {limit} bytes")
    except (aiohttp.ClientError, TimeoutError) as err:
        raise NotReady(f"{what}: {type(err).__name__}") from err
    return bytes(data)


async def keep(
    files_dir: Path, key: str, index: int, data: bytes, *, mime_type: str, filename: str
) -> Attachment:
    """Save file `index` of message `key` under `files_dir`; the attachment that names it."""
    path = attachment_path(files_dir, key, index, filename)
    await asyncio.to_thread(save_file, path, data)
    return Attachment(path, mime_type, len(data), filename)
