"""Loopback payloads ⇄ normalized messages, and HTTP errors ⇄ Herald errors. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from adapters.inbound import Skipped
from adapters.loopback import PLATFORM
from gateway.contracts.errors import (
    AuthError,
    MarkupRejected,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    PlatformMessageId,
    ThreadId,
)
from gateway.contracts.messages import InboundMessage, OutboundMessage, Sender, TextFormat

DEFAULT_RETRY_AFTER = 1.0
"""Seconds to wait after a 429 that names no delay."""
MARKUP_ERROR = "can't parse entities"
"""What the platform says when it refuses a message's markup."""


def update_id_of(update: Any) -> int | None:
    """The update's `update_id`, None when it has no integer one."""
    if not isinstance(update, Mapping):
        return None
    value = update.get("update_id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _id(value: Any) -> str | None:
    """A platform id: a non-empty string, or an integer written as one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def to_inbound(update: Any, account: AccountId) -> InboundMessage | Skipped:
    """The message an update carries, or `Skipped` with the reason. Never raises."""
    if not isinstance(update, Mapping):
        return Skipped("the update is not an object")
    message = update.get("message")
    if not isinstance(message, Mapping):
        return Skipped("the update has no message")
    message_id = _id(message.get("message_id"))
    if message_id is None:
        return Skipped("the message has no message_id")
    chat = message.get("chat")
    chat_id = _id(chat.get("id")) if isinstance(chat, Mapping) else None
    if chat_id is None or not isinstance(chat, Mapping):
        return Skipped("the message has no chat id")
    chat_type = chat.get("type")
    if not isinstance(chat_type, str):
        return Skipped("the chat has no type")
    sender = message.get("from")
    sender_id = _id(sender.get("id")) if isinstance(sender, Mapping) else None
    if sender_id is None or not isinstance(sender, Mapping):
        return Skipped("the message has no sender id")
    name = sender.get("name")
    is_bot = sender.get("is_bot", False)
    if not isinstance(name, str | None) or not isinstance(is_bot, bool):
        return Skipped("the sender's name or is_bot is malformed")
    text = message.get("text")
    if not isinstance(text, str):
        return Skipped("the message has no text")
    received_at = _timestamp(message.get("date"))
    if received_at is None:
        return Skipped("the message has no valid date")
    thread_id = message.get("thread_id")
    reply_to = message.get("reply_to")
    mentions_bot = message.get("mentions_bot", False)
    if thread_id is not None and _id(thread_id) is None:
        return Skipped("the thread_id is malformed")
    if reply_to is not None and _id(reply_to) is None:
        return Skipped("the reply_to is malformed")
    if not isinstance(mentions_bot, bool):
        return Skipped("mentions_bot is not a boolean")
    thread = _id(thread_id)
    reply = _id(reply_to)
    return InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(chat_id),
        sender=Sender(ExternalUserId(sender_id), name or "", is_bot),
        text=text,
        platform_message_id=PlatformMessageId(message_id),
        is_direct=chat_type == "private",
        mentions_bot=mentions_bot,
        thread_id=ThreadId(thread) if thread is not None else None,
        reply_to=PlatformMessageId(reply) if reply is not None else None,
        received_at=received_at,
        raw=dict(update),
    )


def render_markdown(text: str) -> str:
    """Herald's Markdown in the platform's markup: the loopback platform takes it as is."""
    return text


def _text(message: OutboundMessage) -> str:
    """The text to put on the wire; attachments, which the platform cannot carry, as lines."""
    text = render_markdown(message.text) if message.format is TextFormat.MARKDOWN else message.text
    notes = [
        f"[attachment: {a.filename or a.path.name} ({a.mime_type}, {a.size} bytes)]"
        for a in message.attachments
    ]
    return "\n".join([text, *notes]) if notes else text


def to_send_payload(message: OutboundMessage) -> dict[str, Any]:
    """The JSON body of `POST /bot<token>/send` for one outbound chunk."""
    return {
        "chat_id": message.chat_id,
        "thread_id": message.thread_id,
        "text": _text(message),
        "format": message.format.value,
        "reply_to": message.reply_to,
        "idempotency_key": message.idempotency_key,
        "recovered": message.recovered,
    }


def to_edit_payload(target: PlatformMessageId, message: OutboundMessage) -> dict[str, Any]:
    """The JSON body of `POST /bot<token>/edit` replacing the text of `target`."""
    return {
        "chat_id": message.chat_id,
        "message_id": target,
        "text": _text(message),
        "format": message.format.value,
    }


def to_typing_payload(chat_id: ChatId, thread_id: ThreadId | None) -> dict[str, Any]:
    """The JSON body of `POST /bot<token>/typing`."""
    return {"chat_id": chat_id, "thread_id": thread_id}


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def parse_error(status: int, body: Any, headers: Mapping[str, str]) -> Exception:
    """The Herald error for a non-200 answer (`body` parsed JSON, or anything else).

    401 → AuthError; 429 → RateLimited (body `retry_after`, else the `Retry-After` header);
    400 "can't parse entities" → MarkupRejected; other 4xx but 408 → PermanentSendError;
    anything else (5xx, 408, unexpected) → NotReady.
    """
    description = ""
    retry_after: float | None = None
    if isinstance(body, Mapping):
        error = body.get("error")
        description = error if isinstance(error, str) else ""
        retry_after = _seconds(body.get("retry_after"))
    detail = f"loopback: HTTP {status}" + (f": {description}" if description else "")
    if status == 401:
        return AuthError(detail)
    if status == 429:
        if retry_after is None:
            retry_after = _seconds(_header(headers, "retry-after"))
        return RateLimited(DEFAULT_RETRY_AFTER if retry_after is None else retry_after, detail)
    if status == 400 and MARKUP_ERROR in description:
        return MarkupRejected(detail)
    if 400 <= status < 500 and status != 408:
        return PermanentSendError(detail)
    return NotReady(detail)
