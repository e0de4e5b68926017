"""Telegram updates → normalized messages, and Telegram errors → Herald errors. Pure functions.

A Telegram `message_id` is unique only inside its chat, so Herald's platform message id for a
Telegram message is `<chat_id>:<message_id>`; an edit adds `:e<edit_date>-<update_id>` (and
names the original in `edit_of`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from telegram import Bot, Message, MessageEntity, Update
from telegram.constants import ChatType
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)

from adapters.inbound import Incoming, Skipped, file_refusal, message_key
from adapters.telegram import PLATFORM
from adapters.telegram.config import GroupTrigger, TelegramConfig
from gateway.contracts.errors import (
    AuthError,
    HeraldError,
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
from gateway.contracts.messages import InboundMessage, Reaction, Sender

logger = logging.getLogger(__name__)

ALLOWED_UPDATES = ("message", "edited_message", "callback_query", "message_reaction")
"""The update types Herald asks Telegram for."""
MAX_QUOTE = 500
"""Characters of a replied-to message's text shown to the agent."""
MARKUP_ERROR = "can't parse entities"
BOT_TOKEN = re.compile(r"\b(\d{3,}:)[A-Za-z0-9_-]{20,}")
"""A bot token (`<bot id>:<secret>`), as the SDK's errors may quote it inside a URL."""
NOT_MODIFIED = "message is not modified"
NOT_ADDRESSED = "group message that does not address the bot"


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who the bot is (from `getMe`): needed to tell mentions and replies to it."""

    id: int
    username: str


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file of an inbound message to download through `getFile`."""

    file_id: str
    mime_type: str
    size: int | None
    filename: str


def split_message_key(key: str) -> tuple[str, int] | None:
    """`(chat_id, message_id)` of a key made by `message_key` (an edit's `:e<date>` suffix,
    or a reaction's `:r<update>`, names the message it is about), None when it is not one."""
    chat, sep, number = key.partition(":")
    if not sep:
        chat, number = "", key
    number = number.split(":", 1)[0]
    try:
        message_id = int(number)
    except ValueError:
        return None
    return chat, message_id


def parse_update(data: Any, bot: Bot | None = None) -> Update | Skipped:
    """The update in a JSON object (a webhook body, a poll result). Never raises."""
    if not isinstance(data, Mapping) or not isinstance(data.get("update_id"), int):
        return Skipped("not an update object")
    try:
        return Update.de_json(dict(data), bot)
    except Exception as err:  # untrusted input: whatever the parser trips over, skip it
        return Skipped(f"malformed update: {type(err).__name__}: {err}")


def to_inbound(
    update: Update,
    *,
    bot: BotIdentity,
    account: AccountId,
    config: TelegramConfig,
    now: datetime,
) -> Incoming[FileRef] | Skipped:
    """The message an update carries for the agent, or `Skipped` with the reason. Never raises.

    Applies the group trigger, the edited-message rule and the freshness limit; removes the
    bot's `@username` from commands and from a leading mention; quotes the replied-to text.
    """
    try:
        return _to_inbound(update, bot=bot, account=account, config=config, now=now)
    except Exception as err:  # the parser does not check types: a malformed message lands here
        return Skipped(f"malformed message: {type(err).__name__}: {err}")


def _to_inbound(
    update: Update,
    *,
    bot: BotIdentity,
    account: AccountId,
    config: TelegramConfig,
    now: datetime,
) -> Incoming[FileRef] | Skipped:
    if update.callback_query is not None:
        return _pressed(update, bot=bot, account=account)
    edited = update.message is None and update.edited_message is not None
    message = update.message or update.edited_message
    if message is None:
        return Skipped("no message in the update")
    sender = message.from_user
    if sender is None:
        return Skipped("no sender")
    if sender.id == bot.id:
        return Skipped("the bot's own message")
    sent_at = (message.edit_date if edited else None) or message.date
    if sent_at.tzinfo is None:
        sent_at = sent_at.replace(tzinfo=UTC)
    if now - sent_at > timedelta(seconds=config.backlog_max_age):
        return Skipped(f"older than backlog_max_age (sent {sent_at:%Y-%m-%d %H:%M:%S} UTC)")

    is_direct = message.chat.type == ChatType.PRIVATE
    text = message.text if message.text is not None else (message.caption or "")
    entities = message.parse_entities() if message.text else message.parse_caption_entities()
    command = _command(text, entities, bot)
    if isinstance(command, Skipped):
        return command
    mentioned = command is not None or _mentions(entities, bot)
    replied = _reply_to_bot(message, bot)
    if not is_direct and not _triggered(config.group_trigger, mentioned, replied):
        return Skipped(NOT_ADDRESSED)
    text = command if command is not None else _without_leading_mention(text, bot)

    files, notes = _files(message, config)
    if not text.strip() and not files and not notes:
        return Skipped(f"nothing Herald can read ({_content_kind(message)})")
    if command is None and (quote := _quote(message)):
        text = f"{quote}\n\n{text}" if text else quote
    if notes:
        text = "\n".join([text, *notes]) if text else "\n".join(notes)

    key = message_key(message.chat.id, message.message_id)
    original = key if edited else None
    if edited:
        # `edit_date` counts seconds: the update id tells two edits in one second apart
        # (and is the same when Telegram delivers the update again).
        stamp = int((message.edit_date or message.date).timestamp())
        key = PlatformMessageId(f"{key}:e{stamp}-{update.update_id}")
    reply = message.reply_to_message
    thread = message.message_thread_id if message.is_topic_message else None
    inbound = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(str(message.chat.id)),
        sender=Sender(ExternalUserId(str(sender.id)), sender.full_name, sender.is_bot),
        text=text,
        platform_message_id=key,
        is_direct=is_direct,
        mentions_bot=mentioned or replied,
        thread_id=ThreadId(str(thread)) if thread is not None else None,
        reply_to=(
            message_key(message.chat.id, reply.message_id) if _is_real_reply(message) else None
        )
        if reply is not None
        else None,
        received_at=sent_at,
        raw=update.to_dict(),
        edit_of=original,
    )
    return Incoming(inbound, files)


def reaction_from(update: Update, *, bot: BotIdentity, account: AccountId) -> Reaction | Skipped:
    """The reaction a `message_reaction` update adds (the first new emoji), or `Skipped` and
    why (a reaction taken back, an anonymous one, the bot's own). Never raises."""
    try:
        changed = update.message_reaction
        if changed is None:
            return Skipped("not a reaction")
        user = changed.user
        if user is None:
            return Skipped("an anonymous reaction")
        if user.id == bot.id:
            return Skipped("the bot's own reaction")
        before = {getattr(r, "emoji", None) for r in changed.old_reaction}
        added = [
            e for r in changed.new_reaction if (e := getattr(r, "emoji", None)) and e not in before
        ]
        if not added:
            return Skipped("a reaction taken back, or not an emoji")
        at = changed.date if changed.date.tzinfo else changed.date.replace(tzinfo=UTC)
        return Reaction(
            platform=PLATFORM,
            account=account,
            chat_id=ChatId(str(changed.chat.id)),
            sender=Sender(ExternalUserId(str(user.id)), user.full_name, user.is_bot),
            message=message_key(changed.chat.id, changed.message_id),
            emoji=added[0],
            event_id=str(update.update_id),
            is_direct=changed.chat.type == ChatType.PRIVATE,
            received_at=at,
            raw=update.to_dict(),
        )
    except Exception as err:  # the parser does not check types
        return Skipped(f"malformed reaction: {type(err).__name__}: {err}")


BUTTON_COMMANDS = ("/approve ", "/deny ")
"""What a button of Herald's may send (`Button.command`); other callback data is ignored."""


def _pressed(
    update: Update, *, bot: BotIdentity, account: AccountId
) -> Incoming[FileRef] | Skipped:
    """A press of one of Herald's inline buttons, as the presser's own command message."""
    query = update.callback_query
    assert query is not None
    data = query.data or ""
    message = query.message
    if not data.startswith(BUTTON_COMMANDS) or message is None:
        return Skipped("a button press Herald did not offer")
    sender = query.from_user
    if sender.id == bot.id:
        return Skipped("the bot's own press")
    chat = message.chat
    # The session a message there would go to: a topic's own in a forum, the chat's for a
    # reply thread of an ordinary group (Telegram numbers those threads too).
    topic = getattr(message, "is_topic_message", None)
    thread = getattr(message, "message_thread_id", None) if topic else None
    inbound = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(str(chat.id)),
        sender=Sender(ExternalUserId(str(sender.id)), sender.full_name, sender.is_bot),
        text=data,
        platform_message_id=PlatformMessageId(f"cb:{query.id}"),
        is_direct=chat.type == ChatType.PRIVATE,
        mentions_bot=True,
        thread_id=ThreadId(str(thread)) if thread is not None else None,
        raw=update.to_dict(),
    )
    return Incoming(inbound, ())


def _command(
    text: str, entities: Mapping[MessageEntity, str], bot: BotIdentity
) -> str | Skipped | None:
    """The text with `/cmd@thisbot` made `/cmd`; None when not a command; Skipped when the
    command names another bot."""
    for entity, value in entities.items():
        if entity.type != MessageEntity.BOT_COMMAND or entity.offset != 0:
            continue
        name, _, target = value.partition("@")
        if target and target.lower() != bot.username.lower():
            return Skipped("a command for another bot")
        rest = text[len(value) :] if text.startswith(value) else text[len(name) :]
        return name + rest
    return None


def _mentions(entities: Mapping[MessageEntity, str], bot: BotIdentity) -> bool:
    for entity, value in entities.items():
        if entity.type == MessageEntity.MENTION and value[1:].lower() == bot.username.lower():
            return True
        if entity.type == MessageEntity.TEXT_MENTION and entity.user and entity.user.id == bot.id:
            return True
    return False


def _is_real_reply(message: Message) -> bool:
    """False for the implicit reply to a forum topic's creation message."""
    reply = message.reply_to_message
    if reply is None:
        return False
    implicit = (
        reply.forum_topic_created is not None or reply.message_id == message.message_thread_id
    )
    return not (message.is_topic_message and implicit)


def _reply_to_bot(message: Message, bot: BotIdentity) -> bool:
    reply = message.reply_to_message
    return (
        _is_real_reply(message)
        and reply is not None
        and reply.from_user is not None
        and reply.from_user.id == bot.id
    )


def _triggered(triggers: tuple[GroupTrigger, ...], mentioned: bool, replied: bool) -> bool:
    return (
        GroupTrigger.ALL in triggers
        or (GroupTrigger.MENTION in triggers and mentioned)
        or (GroupTrigger.REPLY in triggers and replied)
    )


def _without_leading_mention(text: str, bot: BotIdentity) -> str:
    handle = f"@{bot.username}"
    if text[: len(handle)].lower() == handle.lower():
        rest = text[len(handle) :]
        if not rest or not (rest[0].isalnum() or rest[0] == "_"):
            return rest.lstrip(" ,:;\t\n")
    return text


def _quote(message: Message) -> str:
    """The replied-to text as a Markdown quote, or ""."""
    if not _is_real_reply(message):
        return ""
    reply = message.reply_to_message
    assert reply is not None
    quoted = message.quote.text if message.quote is not None else (reply.text or reply.caption)
    if not quoted:
        return ""
    if len(quoted) > MAX_QUOTE:
        quoted = quoted[:MAX_QUOTE].rstrip() + "…"
    who = reply.from_user.full_name if reply.from_user is not None else "someone"
    lines = "\n".join(f"> {line}" for line in quoted.splitlines())
    return f"> (replying to {who})\n{lines}"


def _files(message: Message, config: TelegramConfig) -> tuple[tuple[FileRef, ...], list[str]]:
    """Files to download, and notes for the agent about files that are not downloaded."""
    candidates: list[FileRef] = []
    if message.photo:
        best = message.photo[-1]
        candidates.append(
            FileRef(best.file_id, "image/jpeg", best.file_size, f"photo_{best.file_unique_id}.jpg")
        )
    if message.document is not None:
        doc = message.document
        candidates.append(
            FileRef(
                doc.file_id,
                doc.mime_type or "application/octet-stream",
                doc.file_size,
                doc.file_name or f"document_{doc.file_unique_id}",
            )
        )
    if message.voice is not None:
        voice = message.voice
        candidates.append(
            FileRef(
                voice.file_id,
                voice.mime_type or "audio/ogg",
                voice.file_size,
                f"voice_{voice.file_unique_id}.ogg",
            )
        )
    if message.audio is not None:
        audio = message.audio
        candidates.append(
            FileRef(
                audio.file_id,
                audio.mime_type or "audio/mpeg",
                audio.file_size,
                audio.file_name or f"audio_{audio.file_unique_id}",
            )
        )
    files: list[FileRef] = []
    notes: list[str] = []
    for ref in candidates:
        note = file_refusal(ref.filename, ref.mime_type, ref.size, config)
        if note is not None:
            notes.append(note)
        else:
            files.append(ref)
    return tuple(files), notes


def _content_kind(message: Message) -> str:
    for kind in (
        "sticker",
        "voice",
        "video_note",
        "video",
        "audio",
        "animation",
        "location",
        "contact",
        "poll",
        "dice",
        "new_chat_members",
        "left_chat_member",
        "pinned_message",
    ):
        if getattr(message, kind, None):
            return kind
    return "empty message"


def error_from(err: TelegramError, doing: str) -> HeraldError:
    """The Herald error for a Telegram error met while `doing` something (for the message).

    RetryAfter → RateLimited; InvalidToken → AuthError; "can't parse entities" → MarkupRejected;
    other BadRequest and Forbidden (blocked, kicked) → PermanentSendError; Conflict (another
    poller or a webhook), network errors and 5xx → NotReady.
    """
    if isinstance(err, InvalidToken):
        # Its message quotes the token; say what happened without it.
        return AuthError(f"telegram: {doing}: the token was refused (check token and base_url)")
    # Errors stay in the outbox and in logs: never with the token (a base_url without `/bot`
    # makes the HTTP library quote it as the port).
    message = BOT_TOKEN.sub(r"\1***", err.message)
    detail = f"telegram: {doing}: {message}"
    if isinstance(err, RetryAfter):
        delay = err.retry_after
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        return RateLimited(seconds, detail)
    if isinstance(err, BadRequest) and MARKUP_ERROR in err.message.lower():
        return MarkupRejected(detail)
    if isinstance(err, ChatMigrated):
        return PermanentSendError(f"{detail} (the group moved to chat {err.new_chat_id})")
    if isinstance(err, BadRequest | Forbidden):
        return PermanentSendError(detail)
    if isinstance(err, Conflict):
        return NotReady(f"{detail} (another Herald is polling this bot, or a webhook is set)")
    if isinstance(err, NetworkError):
        return NotReady(detail)
    return NotReady(detail)


_MENU_COMMAND = re.compile(r"[a-z0-9_]{1,32}")


def menu_entries(entries: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Command-menu entries as Telegram accepts them: names of 1-32 lowercase letters,
    digits and underscores (hyphens become underscores; others are left out), descriptions
    of 1-256 characters, no repeats, at most 100."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, description in entries:
        command = name.lower().replace("-", "_")
        if not _MENU_COMMAND.fullmatch(command) or command in seen:
            continue
        text = " ".join(description.split()) or command
        out.append((command, text if len(text) <= 256 else text[:255] + "…"))
        seen.add(command)
    return out[:100]
