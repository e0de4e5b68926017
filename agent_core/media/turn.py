"""What one turn's tools hand back to the gateway: pictures to show, files to send."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gateway.contracts.history import ChatMessage, SessionInfo
from gateway.contracts.messages import Attachment


class SessionFiles(Protocol):
    """The files people sent in a session, as the gateway stored them (the only files
    `view_attachment` shows and pictures the model sees: never another session's)."""

    async def received(self, session: SessionInfo) -> Sequence[Attachment]:
        """The attachments of the session's inbound messages, oldest first."""
        ...

    async def local(self, attachment: Attachment) -> Path:
        """A real file with the attachment's bytes on this instance (materialised from the
        blob store, its hash checked). Raises FileGone (no longer kept) or
        FileStoreUnavailable (the store failed)."""
        ...

    async def keep(self, path: Path, filename: str, mime_type: str) -> Attachment:
        """Store the local file `path` (moved away) for sending; the attachment naming it.
        Raises FileTooLarge, FileStoreUnavailable."""
        ...


@dataclass(frozen=True, slots=True)
class Destination:
    """A chat a file goes to, as the gateway's target resolver named it."""

    platform: str
    account: str
    chat_id: str
    thread_id: str | None = None
    max_bytes: int = 0
    """The largest file that chat's platform takes."""


@dataclass(frozen=True, slots=True)
class OutgoingFile:
    """A file `send_file` queued: sent after the turn's reply text, as its own outbox row."""

    attachment: Attachment
    caption: str = ""
    to: Destination | None = None
    """None: the chat of the turn."""


@dataclass
class TurnMedia:
    """Per turn: pictures a tool asked to show the model, files a tool asked to send."""

    shown: list[ChatMessage] = field(default_factory=list)
    files: list[OutgoingFile] = field(default_factory=list)
    report_to: tuple[Destination, ...] | None = None
    """A scheduled job's run (no chat of its own): the chats its report goes to, each with
    its platform's file limit; a file sent without a target goes to every one of them after
    the report. None: the turn answers a chat, and such a file goes there."""

    def take_shown(self) -> list[ChatMessage]:
        """Remove and return the picture messages waiting to go to the model."""
        out, self.shown = self.shown, []
        return out
