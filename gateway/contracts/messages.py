"""Normalized messages: what adapters produce and consume. No platform types in here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    Platform,
    PlatformMessageId,
    SessionKey,
    ThreadId,
    session_key,
)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class TextFormat(StrEnum):
    """How `OutboundMessage.text` is written."""

    MARKDOWN = "markdown"
    PLAIN = "plain"


@dataclass(frozen=True, slots=True)
class Sender:
    """Who wrote an inbound message."""

    id: ExternalUserId
    display_name: str = ""
    is_bot: bool = False


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that came with a message (already downloaded) or goes out with one."""

    path: Path
    mime_type: str
    size: int
    filename: str = ""
    transcript: str | None = None
    """What a voice note or audio file says, once transcribed (stored with the message)."""
    blob: str | None = None
    """The SHA-256 (hex) of the bytes in the blob store; `path` is then only where this
    instance caches them (or did). None: a file from before the blob store, at `path`."""
    voice: bool = False
    """Going out: a spoken reply (Ogg/Opus), sent as the platform's voice note where it has
    one (Telegram `sendVoice`), else as an audio file."""


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """One message received from a platform, normalized at the adapter's edge."""

    platform: Platform
    account: AccountId
    chat_id: ChatId
    sender: Sender
    text: str
    platform_message_id: PlatformMessageId
    is_direct: bool = True
    mentions_bot: bool = False
    thread_id: ThreadId | None = None
    reply_to: PlatformMessageId | None = None
    attachments: tuple[Attachment, ...] = ()
    received_at: datetime = field(default_factory=utcnow)
    raw: Mapping[str, Any] = field(default_factory=dict)
    edit_of: PlatformMessageId | None = None
    """Set on an edit: the `platform_message_id` of the message it changes (the edit's own
    id is unique per edit, `<original>:e<edit stamp>`); `text` is the whole new text."""

    def __post_init__(self) -> None:
        if self.received_at.tzinfo is None:
            raise ValueError("received_at must be timezone-aware")

    @property
    def session_key(self) -> SessionKey:
        """The default session key: one session per chat (and thread)."""
        return session_key(self.platform, self.account, self.chat_id, self.thread_id)


@dataclass(frozen=True, slots=True)
class Reaction:
    """A reaction someone added to a message in a chat, normalized at the adapter's edge."""

    platform: Platform
    account: AccountId
    chat_id: ChatId
    sender: Sender
    message: PlatformMessageId
    """The message reacted to (its `platform_message_id` form, as a receipt stores it)."""
    emoji: str
    """The emoji itself (`👍`) where the platform sends one, else its name (`thumbsup`)."""
    event_id: str
    """Unique per reaction event on the platform (deduplicates redeliveries)."""
    is_direct: bool = True
    thread_id: ThreadId | None = None
    received_at: datetime = field(default_factory=utcnow)
    raw: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.received_at.tzinfo is None:
            raise ValueError("received_at must be timezone-aware")


@dataclass(frozen=True, slots=True)
class Button:
    """A button under a message; pressing it sends `command` as the presser's own message
    (platforms without buttons show the text only, which names the command)."""

    label: str
    command: str


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """One chunk of text (and files) to deliver to a chat."""

    platform: Platform
    account: AccountId
    chat_id: ChatId
    text: str
    idempotency_key: str
    thread_id: ThreadId | None = None
    format: TextFormat = TextFormat.MARKDOWN
    reply_to: PlatformMessageId | None = None
    attachments: tuple[Attachment, ...] = ()
    recovered: bool = False
    """True when this is a resend after a crash left the first send's outcome unknown."""
    buttons: tuple[Button, ...] = ()
    """Buttons under the message, where the platform has them (one row)."""


@dataclass(frozen=True, slots=True)
class DeliveryReceipt:
    """What the platform said after accepting an outbound message."""

    platform_message_id: PlatformMessageId | None
    delivered_at: datetime = field(default_factory=utcnow)


@dataclass(frozen=True, slots=True)
class SendLimits:
    """What an adapter can send in one message."""

    max_chunk: int = 4000
    count_utf16: bool = False
    """True when the platform counts length in UTF-16 code units."""
    min_edit_interval: float = 1.0
    """Seconds between two edits of one message when streaming by edits."""
    min_send_interval: float = 0.0
    """Seconds between two sends to one chat (the platform's per-chat rate)."""
    max_file_bytes: int | None = None
    """The largest file the platform takes in one message (None: files cannot be sent)."""
    voice: bool = False
    """Whether the adapter sends spoken replies (`Attachment.voice`)."""
    voice_caption: int = 0
    """The longest text shown with a voice reply, as its caption (0: none is shown, the
    audio goes alone: the adapter leaves out the text the message carries, which is sent
    alone if the audio is refused)."""
