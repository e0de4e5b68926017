"""Storing files that arrive with inbound messages (shared by the adapters)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar

from gateway.contracts.errors import PermanentSendError
from gateway.contracts.messages import Attachment, InboundMessage


class Named(Protocol):
    """A file reference that has a name to tell the agent."""

    @property
    def filename(self) -> str: ...


RefT = TypeVar("RefT", bound=Named)


async def with_files(
    message: InboundMessage,
    files: Sequence[RefT],
    download: Callable[[int, RefT], Awaitable[Attachment]],
) -> InboundMessage:
    """`message` with its files downloaded as attachments, in order.

    A file `download` refuses for good (PermanentSendError) becomes a note in the text;
    NotReady propagates, so the message is delivered again later.
    """
    if not files:
        return message
    attachments: list[Attachment] = []
    notes: list[str] = []
    for index, ref in enumerate(files):
        try:
            attachments.append(await download(index, ref))
        except PermanentSendError as err:
            notes.append(f"[file {ref.filename} could not be downloaded: {err}]")
    text = "\n".join([message.text, *notes]) if notes else message.text
    return replace(message, attachments=tuple(attachments), text=text)


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
