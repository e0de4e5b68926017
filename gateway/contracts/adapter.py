"""The adapter protocol: one connection to one platform account."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol, Self, runtime_checkable

from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId, ThreadId
from gateway.contracts.messages import (
    Attachment,
    DeliveryReceipt,
    InboundMessage,
    OutboundMessage,
    Reaction,
    SendLimits,
)


class AdapterState(StrEnum):
    """What `/health` and `/ready` report for an adapter."""

    STARTING = "starting"
    RECEIVING = "receiving"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"
    FAILED = "failed"
    STANDBY = "standby"
    """Another instance holds this receiver's lease; this one takes over if that one dies."""


class Checkpoints(Protocol):
    """Small durable values one adapter account keeps across restarts (watermarks, last ids).

    Names are the adapter's own (e.g. `uidvalidity`, `last:<channel>`); values are text.
    A value set is durable when `set` returns. Shared by every instance on one database.
    """

    async def get(self, name: str) -> str | None:
        """The value last set under `name`, or None."""
        ...

    async def set(self, name: str, value: str) -> None:
        """Store `value` under `name` (last write wins)."""
        ...


class FileLinks(Protocol):
    """Public, signed, expiring URLs under Herald's HTTP server for files it sends, for
    platforms that fetch media by URL (Twilio MMS / WhatsApp)."""

    def link(self, attachment: Attachment, base_url: str) -> str:
        """A URL under `base_url` that serves the attachment's bytes (from the blob store)
        until it expires. Raises ValueError for a file not in the blob store."""
        ...


@dataclass(frozen=True, slots=True)
class AdapterContext:
    """What the supervisor hands an adapter besides its config section."""

    files: Path
    """Where files received from the platform are kept (`state_dir/files/<platform>/<account>`)."""
    checkpoints: Checkpoints
    links: FileLinks | None = None
    """Signs media URLs for files sent by URL; None when Herald serves no HTTP."""
    menu: Callable[[], Sequence[tuple[str, str]]] | None = None
    """The chat commands to show in the platform's command menu, as (name without the
    slash, description); read at each connection. None: leave the menu alone."""
    webhook: str = ""
    """The name after `/webhooks/` this account's requests arrive at: `<platform>:<account>`
    on a platform with several accounts; empty: the platform's name."""


class InboundSink(Protocol):
    """Where an adapter hands inbound messages.

    `accept` returns only after the message is durably stored; the adapter acknowledges the
    message to its platform after that and never before.
    """

    async def accept(self, message: InboundMessage) -> None: ...


@runtime_checkable
class SettlingSink(Protocol):
    """A sink that also stores messages the adapter answers by itself (opt-out keywords)."""

    async def settle(self, message: InboundMessage, detail: str) -> None:
        """Store `message` as handled, outcome `dropped` with `detail`, starting no turn.

        Returns once committed; a message already stored is ignored. Raises like `accept`.
        """
        ...


@runtime_checkable
class ScreeningSink(Protocol):
    """A sink that tells an adapter, before it downloads anything, whether a sender's files
    are wanted (a stranger's message is rejected, so its files would only cost disk)."""

    async def may_fetch(self, message: InboundMessage) -> bool:
        """Whether `message`'s sender is allowed now, so its files may be downloaded.

        Writes nothing; `accept` still makes the access decision. Raises like `accept`.
        """
        ...


@runtime_checkable
class ReactionSink(Protocol):
    """A sink that takes reactions to messages (an adapter without one drops them)."""

    async def react(self, reaction: Reaction) -> None:
        """Act on a reaction: on an approval question, a decision by the reactor; on another
        of the bot's messages, a note in that session; else nothing. Returns once whatever
        it changed is committed (the adapter acknowledges after that); a stranger's
        reaction, or one seen before, changes nothing. Raises like `accept`."""
        ...


@runtime_checkable
class ReceiptSink(Protocol):
    """A sink that records what a platform reports later about a message it accepted."""

    async def delivery_report(
        self,
        platform: Platform,
        account: AccountId,
        message: PlatformMessageId,
        status: str,
        error: str | None = None,
    ) -> bool:
        """Record `status` (`delivered`, `failed`, …) on the sent chunk with platform id
        `message`; False when no sent chunk has that id (yet)."""
        ...


@runtime_checkable
class Adapter(Protocol):
    """A connection to one platform account. Entered once; `run` until cancelled."""

    platform: Platform
    account: AccountId
    limits: SendLimits

    async def __aenter__(self) -> Self:
        """Open the connection. Raises AuthError (stop) or NotReady (retry later)."""
        ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def run(self, sink: InboundSink) -> None:
        """Receive until cancelled. Raises AuthError or NotReady when the connection fails."""
        ...

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Deliver one chunk. Raises RateLimited, PermanentSendError or NotReady."""
        ...

    def liveness(self) -> AdapterState:
        """Whether inbound traffic is flowing, not merely whether a task is alive."""
        ...


@runtime_checkable
class TypingIndicator(Protocol):
    """An adapter that can show "typing…" in a chat (for a few seconds per call)."""

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        """Show the indicator once. Raises like `send`; callers treat failures as harmless."""
        ...


@runtime_checkable
class WorkingIndicator(Protocol):
    """An adapter that marks the message being answered while its turn runs (a reaction)."""

    async def working(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Put the mark on `message`. Raises like `send`; callers treat failures as harmless."""
        ...

    async def done(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Take the mark off again. Raises like `send`."""
        ...


@runtime_checkable
class MessageEditor(Protocol):
    """An adapter that can replace the text of a message it sent (streaming by edits)."""

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        """Replace the text of `target` in `message.chat_id` with `message.text`.

        Editing to the text the message already has succeeds. Raises like `send`.
        """
        ...


@runtime_checkable
class SelfCheck(Protocol):
    """An adapter that can check its credentials without taking over receiving."""

    async def check(self) -> str:
        """A one-line description of the account. Raises AuthError or NotReady."""
        ...


@dataclass(frozen=True, slots=True)
class WebhookResponse:
    """What a webhook adapter answers the platform."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain"


@runtime_checkable
class WebhookAdapter(Adapter, Protocol):
    """An adapter that also receives over HTTP at `/webhooks/<platform>/...`."""

    async def handle_webhook(
        self, path: str, headers: Mapping[str, str], body: bytes, sink: InboundSink
    ) -> WebhookResponse:
        """Verify and store one request; answer only after the inbox commit."""
        ...
