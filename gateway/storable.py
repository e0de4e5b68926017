"""Text every backend stores and every encoder writes.

A platform's JSON may carry a lone UTF-16 surrogate (`"\\ud800"` is valid JSON); Python decodes
it into a string that neither SQLite, PostgreSQL nor a UTF-8 encoder accepts. Left in an
inbound message, the insert fails, the platform is never acknowledged and redelivers the same
message before every later one. Each lone surrogate becomes U+FFFD (the replacement character)
before the message is stored; NUL is replaced by the store's `SafeText` column type.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from gateway.contracts.messages import InboundMessage

SURROGATE = re.compile("[\ud800-\udfff]")
S = TypeVar("S", bound=str)


def clean(text: S) -> S:
    """`text` with each lone surrogate replaced by U+FFFD (the same type: ids stay ids)."""
    if SURROGATE.search(text) is None:
        return text
    return type(text)(SURROGATE.sub("\ufffd", text))


def _clean_json(value: Mapping[str, Any]) -> Mapping[str, Any]:
    try:
        dumped = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return value  # not JSON: stored as the payload column's serializer manages
    if SURROGATE.search(dumped) is None:
        return value
    cleaned: Mapping[str, Any] = json.loads(SURROGATE.sub("\ufffd", dumped))
    return cleaned


def storable(message: InboundMessage) -> InboundMessage:
    """`message` with no lone surrogate in any of its text (itself when there is none)."""
    sender = message.sender
    texts = (
        message.text,
        message.account,
        message.chat_id,
        message.platform_message_id,
        message.thread_id or "",
        message.reply_to or "",
        sender.id,
        sender.display_name,
    )
    raw = _clean_json(message.raw)
    if raw is message.raw and not any(SURROGATE.search(t) for t in texts):
        return message
    return dataclasses.replace(
        message,
        text=clean(message.text),
        account=clean(message.account),
        chat_id=clean(message.chat_id),
        platform_message_id=clean(message.platform_message_id),
        thread_id=None if message.thread_id is None else clean(message.thread_id),
        reply_to=None if message.reply_to is None else clean(message.reply_to),
        sender=dataclasses.replace(
            sender, id=clean(sender.id), display_name=clean(sender.display_name)
        ),
        raw=raw,
    )
