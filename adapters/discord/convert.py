"""Discord gateway payloads → normalized messages, and Discord errors → Herald errors.
Pure functions.

Herald's platform message id of a Discord message is `<channel id>:<message id>` (the channel
the message is in: a thread's own id for a thread message). Message ids are snowflakes: they
grow with time, so "the last seen id" of a channel is a watermark.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from adapters.buttons import button_command
from adapters.discord import PLATFORM
from adapters.discord.config import DiscordConfig
from adapters.inbound import FileRef, Incoming, Skipped, file_refusal, message_key
from gateway.contracts.errors import (
    AuthError,
    HeraldError,
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
from gateway.contracts.messages import Button, InboundMessage, Reaction, Sender

NOT_ADDRESSED = "server message that does not address the bot"
OWN_MESSAGE = "the bot's own message"
DISCORD_EPOCH_MS = 1_420_070_400_000
MESSAGE_TYPES = frozenset({0, 19})
"""DEFAULT and REPLY: what people write. Joins, pins, thread notices and the like are not."""
THREAD_TYPES = frozenset({10, 11, 12})
DM_TYPES = frozenset({1, 3})
DEFAULT_RETRY_AFTER = 1.0
_MENTION = re.compile(r"<@!?(\d+)>")
CUSTOM_ID_PREFIX = "herald:"
"""Herald's buttons' `custom_id`s: the prefix, then the command a press sends."""
MESSAGE_COMPONENT = 3
"""The interaction type of a press of a message's button."""
BUTTON_STYLES = {"/approve": 3, "/deny": 4}
"""Success (green) and danger (red); any other button is secondary (2)."""


class ChannelKind(StrEnum):
    """What a Discord channel is, as far as sessions go."""

    DIRECT = "direct"
    GUILD = "guild"
    THREAD = "thread"


@dataclass(frozen=True, slots=True)
class Channel:
    """A channel a message is in: a thread knows its parent channel."""

    id: str
    kind: ChannelKind
    parent_id: str | None = None


def split_message_key(key: str) -> tuple[str, str] | None:
    """`(channel id, message id)` of a key made by `message_key` (an edit's `:e<stamp>`
    suffix, or a reaction's `:r<id>`, names the message it is about), None when it is not
    one."""
    channel, sep, message = key.partition(":")
    message = message.split(":", 1)[0]
    if not sep or not channel.isdigit() or not message.isdigit():
        return None
    return channel, message


def snowflake_time(snowflake: str) -> datetime | None:
    """When the object with this id was created, None when it is not a snowflake."""
    if not snowflake.isdigit():
        return None
    try:
        return datetime.fromtimestamp(((int(snowflake) >> 22) + DISCORD_EPOCH_MS) / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def newer(a: str | None, b: str | None) -> str | None:
    """The later of two snowflakes (either may be None)."""
    if a is None or not a.isdigit():
        return b
    if b is None or not b.isdigit():
        return a
    return a if int(a) >= int(b) else b


def channel_from(payload: Any) -> Channel | None:
    """The channel a `GET /channels/{id}` answer describes, None when it is not one."""
    if not isinstance(payload, Mapping):
        return None
    channel_id = _str(payload.get("id"))
    kind = payload.get("type")
    if channel_id is None or not isinstance(kind, int):
        return None
    if kind in DM_TYPES:
        return Channel(channel_id, ChannelKind.DIRECT)
    if kind in THREAD_TYPES:
        return Channel(channel_id, ChannelKind.THREAD, _str(payload.get("parent_id")))
    return Channel(channel_id, ChannelKind.GUILD)


def _str(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and value else None


def is_guild_message(data: Mapping[str, Any]) -> bool:
    """Whether a MESSAGE_CREATE payload is from a server (DMs carry no `guild_id`)."""
    return _str(data.get("guild_id")) is not None


def to_inbound(  # noqa: C901, PLR0912 - one branch per Discord message field, flat on purpose
    data: Any,
    *,
    bot_id: str,
    account: AccountId,
    config: DiscordConfig,
    channel: Channel | None,
    now: datetime,
    edit: bool = False,
) -> Incoming[FileRef] | Skipped:
    """The message a MESSAGE_CREATE payload (or a history entry) carries for the agent, or
    `Skipped` and why. Never raises. With `edit`, a MESSAGE_UPDATE: the edited message, its id
    `<channel>:<message>:e<edited_timestamp>`, naming the original in `edit_of` (an update
    that is not an edit, such as an embed added, is skipped).

    `channel` is what Herald knows of the message's channel: needed for server messages (a
    thread's messages go to the session of the thread) and for history entries, which carry
    no `guild_id`; without it a message without `guild_id` is a DM. DMs always pass; in servers,
    messages that mention the bot, reply to it, or are in `config.channels` (or a thread of
    one) do.
    """
    if not isinstance(data, Mapping):
        return Skipped("not a message")
    message_id = _str(data.get("id"))
    channel_id = _str(data.get("channel_id"))
    if message_id is None or channel_id is None or not message_id.isdigit():
        return Skipped("no message or channel id")
    kind = data.get("type", 0)
    if not isinstance(kind, int) or kind not in MESSAGE_TYPES:  # a list or dict: unhashable
        return Skipped(f"message type {kind!r} ignored")
    author = data.get("author")
    if not isinstance(author, Mapping) or _str(author.get("id")) is None:
        return Skipped("no author")
    author_id = str(_str(author.get("id")))
    if author_id == bot_id:
        return Skipped(OWN_MESSAGE)
    if author.get("bot") or author.get("system") or data.get("webhook_id"):
        return Skipped("a bot's message")
    sent_at = snowflake_time(message_id)
    if sent_at is None:
        return Skipped("no message id")
    edited_at = _iso_time(data.get("edited_timestamp")) if edit else None
    if edit:
        if edited_at is None:
            return Skipped("an update that is not an edit (an embed, a pin)")
        sent_at = edited_at
    if now - sent_at > timedelta(seconds=config.backlog_max_age):
        return Skipped(f"older than backlog_max_age (sent {sent_at:%Y-%m-%d %H:%M:%S} UTC)")

    if channel is not None:
        is_direct = channel.kind is ChannelKind.DIRECT
    else:
        is_direct = not is_guild_message(data)
    chat, thread = channel_id, None
    if not is_direct:
        if channel is None:
            return Skipped("server message in a channel Herald cannot see")
        if channel.kind is ChannelKind.THREAD and channel.parent_id is not None:
            chat, thread = channel.parent_id, channel_id
    raw_text = data.get("content")
    raw_text = raw_text if isinstance(raw_text, str) else ""
    mentions = data.get("mentions")
    names: dict[str, str] = {}
    for user in mentions if isinstance(mentions, list) else []:
        if isinstance(user, Mapping) and _str(user.get("id")) is not None:
            names[str(_str(user.get("id")))] = _display_name(user)
    referenced = data.get("referenced_message")
    replied_to_bot = (
        isinstance(referenced, Mapping)
        and isinstance(referenced.get("author"), Mapping)
        and _str(referenced["author"].get("id")) == bot_id
    )
    mentioned = bot_id in names or replied_to_bot
    if (
        not is_direct
        and not mentioned
        and channel_id not in config.channels
        and chat not in config.channels
    ):
        return Skipped(NOT_ADDRESSED)

    text = _plain_mentions(raw_text, bot_id, names)
    files, notes = _files(data.get("attachments"), config)
    if not text and not files and not notes:
        return Skipped("nothing Herald can read")
    if notes:
        text = "\n".join([text, *notes]) if text else "\n".join(notes)
    reply_to = None
    reference = data.get("message_reference")
    if isinstance(reference, Mapping) and _str(reference.get("message_id")) is not None:
        reply_to = message_key(
            _str(reference.get("channel_id")) or channel_id, str(_str(reference["message_id"]))
        )
    member = data.get("member")
    nick = _str(member.get("nick")) if isinstance(member, Mapping) else None
    message = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(chat),
        sender=Sender(ExternalUserId(author_id), nick or _display_name(author), False),
        text=text,
        platform_message_id=(
            message_key(channel_id, message_id)
            if edited_at is None
            else PlatformMessageId(
                f"{message_key(channel_id, message_id)}:e{int(edited_at.timestamp() * 1000)}"
            )
        ),
        is_direct=is_direct,
        mentions_bot=mentioned,
        thread_id=ThreadId(thread) if thread is not None else None,
        reply_to=reply_to,
        received_at=sent_at,
        raw=dict(data),
        edit_of=None if edited_at is None else message_key(channel_id, message_id),
    )
    return Incoming(message, files)


def _iso_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def reaction_from(
    data: Any, *, bot_id: str, account: AccountId, channel: Channel | None, now: datetime
) -> Reaction | Skipped:
    """The reaction a MESSAGE_REACTION_ADD payload adds, or `Skipped` and why (the bot's own,
    another bot's, a custom emoji shown by name). Never raises. `channel`: as for
    `to_inbound` (a reaction in a thread belongs to the thread's session)."""
    if not isinstance(data, Mapping):
        return Skipped("not a reaction")
    user = _str(data.get("user_id"))
    channel_id, message_id = _str(data.get("channel_id")), _str(data.get("message_id"))
    emoji = data.get("emoji")
    name = _str(emoji.get("name")) if isinstance(emoji, Mapping) else None
    if user is None or channel_id is None or message_id is None or name is None:
        return Skipped("a reaction without its user, message or emoji")
    if user == bot_id:
        return Skipped("the bot's own reaction")
    is_direct = _str(data.get("guild_id")) is None
    chat, thread = channel_id, None
    if not is_direct and channel is not None and channel.kind is ChannelKind.THREAD:
        chat, thread = channel.parent_id or channel_id, channel_id
    member = data.get("member")
    person = member.get("user") if isinstance(member, Mapping) else None
    if isinstance(person, Mapping) and person.get("bot") is True:
        return Skipped("a bot's reaction")
    shown = _display_name(person) if isinstance(person, Mapping) else user
    return Reaction(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(chat),
        sender=Sender(ExternalUserId(user), shown, False),
        message=message_key(channel_id, message_id),
        emoji=name,
        # Discord gives a reaction event no id and never sends one twice: one added again
        # after it was taken back is a new reaction (its time tells them apart).
        event_id=f"{user}:{name}:{int(now.timestamp() * 1_000_000)}",
        is_direct=is_direct,
        thread_id=ThreadId(thread) if thread is not None else None,
        received_at=now,
        raw=dict(data),
    )


def _display_name(user: Mapping[str, Any]) -> str:
    return str(_str(user.get("global_name")) or _str(user.get("username")) or user.get("id"))


def _plain_mentions(text: str, bot_id: str, names: Mapping[str, str]) -> str:
    """The text with the bot's mention removed and other mentions as `@name`."""

    def replace(match: re.Match[str]) -> str:
        user = match[1]
        if user == bot_id:
            return ""
        return f"@{names[user]}" if user in names else match[0]

    return re.sub(r"[ \t]{2,}", " ", _MENTION.sub(replace, text)).strip()


def _files(items: Any, config: DiscordConfig) -> tuple[tuple[FileRef, ...], list[str]]:
    """Files to download, and notes for the agent about files that are not downloaded."""
    files: list[FileRef] = []
    notes: list[str] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping):
            continue
        url = _str(item.get("url"))
        name = _str(item.get("filename")) or _str(item.get("id")) or "file"
        mime = _str(item.get("content_type")) or "application/octet-stream"
        size = item.get("size") if isinstance(item.get("size"), int) else None
        if url is None:
            notes.append(f"[file {name} not downloadable]")
        elif (note := file_refusal(name, mime, size, config)) is not None:
            notes.append(note)
        else:
            files.append(FileRef(url, mime, size, name))
    return tuple(files), notes


def error_from(
    status: int | None, code: int | None, retry_after: float | None, doing: str
) -> HeraldError:
    """The Herald error for a failed REST call (HTTP status, Discord's JSON error code,
    retry_after of a 429).

    429 → RateLimited; 401 → AuthError; 5xx and no answer → NotReady; anything else about
    the request (unknown channel, missing permission, too long) → PermanentSendError.
    """
    detail = f"discord: {doing}: HTTP {status}" + (f" (code {code})" if code else "")
    if status == 429:
        seconds = retry_after if retry_after is not None else DEFAULT_RETRY_AFTER
        return RateLimited(seconds if math.isfinite(seconds) else DEFAULT_RETRY_AFTER, detail)
    if status == 401:
        return AuthError(detail)
    if status is None or status >= 500:
        return NotReady(detail)
    return PermanentSendError(detail)


def custom_id(button: Button) -> str:
    """The `custom_id` of a button: what a press sends, readable after any restart."""
    return f"{CUSTOM_ID_PREFIX}{button.command}"[:100]


def button_style(button: Button) -> int:
    """The Discord button style of a button (by the command it sends)."""
    return BUTTON_STYLES.get(button.command.split(" ", 1)[0], 2)


def button_components(buttons: tuple[Button, ...]) -> list[dict[str, Any]]:
    """The message components of one row of buttons (what the view sends)."""
    if not buttons:
        return []
    row = [
        {"type": 2, "style": button_style(b), "label": b.label[:80], "custom_id": custom_id(b)}
        for b in buttons
    ]
    return [{"type": 1, "components": row}]


def interaction_channel(data: Any) -> Channel | None:
    """The channel an INTERACTION_CREATE payload names (its `channel` object), if any."""
    return channel_from(data.get("channel")) if isinstance(data, Mapping) else None


def pressed(
    data: Any, *, bot_id: str, account: AccountId, channel: Channel | None
) -> Incoming[FileRef] | Skipped:
    """A press of one of Herald's buttons (an INTERACTION_CREATE of a message component), as
    the presser's own command message in the session of the message the button is under;
    `Skipped` and why for anything else. Never raises.

    `channel` is what Herald knows of the interaction's channel (a thread's messages belong to
    the thread's session). The message id is `<channel id>:i<interaction id>`.
    """
    if not isinstance(data, Mapping) or data.get("type") != MESSAGE_COMPONENT:
        return Skipped("not a button press")
    interaction_id = _str(data.get("id"))
    channel_id = _str(data.get("channel_id"))
    if interaction_id is None or channel_id is None:
        return Skipped("a press without its id or channel")
    component = data.get("data")
    raw_id = component.get("custom_id") if isinstance(component, Mapping) else None
    if not isinstance(raw_id, str) or not raw_id.startswith(CUSTOM_ID_PREFIX):
        return Skipped("a button press Herald did not offer")
    command = button_command(raw_id[len(CUSTOM_ID_PREFIX) :])
    if command is None:
        return Skipped("a button press Herald did not offer")
    member = data.get("member")
    user = member.get("user") if isinstance(member, Mapping) else data.get("user")
    if not isinstance(user, Mapping) or _str(user.get("id")) is None:
        return Skipped("a press without a person")
    user_id = str(_str(user.get("id")))
    if user_id == bot_id or user.get("bot"):
        return Skipped("a bot's press")
    is_direct = (
        channel.kind is ChannelKind.DIRECT if channel is not None else not is_guild_message(data)
    )
    chat, thread = channel_id, None
    thread_of = channel.parent_id if channel is not None and not is_direct else None
    if channel is not None and channel.kind is ChannelKind.THREAD and thread_of is not None:
        chat, thread = thread_of, channel_id
    nick = _str(member.get("nick")) if isinstance(member, Mapping) else None
    message = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(chat),
        sender=Sender(ExternalUserId(user_id), nick or _display_name(user), False),
        text=command,
        platform_message_id=PlatformMessageId(f"{channel_id}:i{interaction_id}"),
        is_direct=is_direct,
        mentions_bot=True,
        thread_id=ThreadId(thread) if thread is not None else None,
        raw=dict(data),
    )
    return Incoming(message)
