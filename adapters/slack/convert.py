"""Slack events → normalized messages, and Slack errors → Herald errors. Pure functions.

Herald's platform message id of a Slack message is `<channel>:<ts>` (a `ts` is unique in its
channel), so the `message` and `app_mention` events of one message, and Slack's retries,
are one inbox row. An edit adds `:e<edit ts>` (and names the original in `edit_of`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from adapters.buttons import button_command
from adapters.inbound import FileRef, Incoming, Skipped, file_refusal, message_key
from adapters.slack import PLATFORM
from adapters.slack.config import SlackConfig
from adapters.slack.markup import from_slack
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

NOT_ADDRESSED = "channel message that does not address the bot"
AUTH_ERRORS = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "no_permission",
        "org_login_required",
        "ekm_access_denied",
        "missing_scope",
        "not_allowed_token_type",
    }
)
"""Errors that no retry fixes: the token or the app's scopes need changing."""
TRANSIENT_ERRORS = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout", "ratelimited"}
)
DEFAULT_RETRY_AFTER = 1.0
SECTION_CHARS = 3000
"""The longest text of one `section` block."""
BUTTONS_BLOCK = "herald_buttons"
"""The `block_id` of the `actions` block with Herald's buttons."""
BUTTON_STYLES = {"/approve": "primary", "/deny": "danger"}


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who the bot is (from `auth.test`)."""

    user_id: str
    bot_id: str


def split_message_key(key: str) -> tuple[str, str] | None:
    """`(channel, ts)` of a key made by `message_key`, None when it is not one."""
    channel, sep, ts = key.partition(":")
    if not sep or not channel or not ts:
        return None
    return channel, ts.split(":", 1)[0]


def _timestamp(ts: Any) -> datetime | None:
    try:
        seconds = float(ts)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(seconds):
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def to_inbound(  # noqa: C901, PLR0912 - one branch per Slack event subtype, flat on purpose
    body: Any,
    *,
    bot: BotIdentity,
    account: AccountId,
    config: SlackConfig,
    now: datetime,
) -> Incoming[FileRef] | Skipped:
    """The message an `event_callback` body carries for the agent, or `Skipped` and why.

    Never raises. DMs always pass; in channels, `app_mention` events and messages in
    `config.channels` do. A top-level channel message is answered in a thread under it.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("event"), Mapping):
        return Skipped("not an event callback")
    event: Mapping[str, Any] = body["event"]
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return Skipped(f"event type {kind!r} is not a message")
    subtype = event.get("subtype")
    edit_ts: str | None = None
    if subtype == "message_changed":
        inner = event.get("message")
        if not isinstance(inner, Mapping):
            return Skipped("edit without the edited message")
        edited = inner.get("edited")
        edit_ts = _str(edited.get("ts")) if isinstance(edited, Mapping) else None
        if edit_ts is None:
            return Skipped("a change that is not an edit (an unfurl or a reply count)")
        event = {
            **inner,
            "channel": event.get("channel"),
            "channel_type": event.get("channel_type"),
        }
        subtype = inner.get("subtype")
    if subtype == "message_deleted":
        return Skipped("deleted message (an answer already sent stays)")
    if subtype not in (None, "file_share", "thread_broadcast", "me_message"):
        return Skipped(f"message subtype {subtype!r} ignored")
    user = _str(event.get("user"))
    if event.get("bot_id") or event.get("bot_profile") or user is None:
        return Skipped("a bot's message")
    if user == bot.user_id:
        return Skipped("the bot's own message")
    channel = _str(event.get("channel"))
    ts = _str(event.get("ts"))
    sent_at = _timestamp(ts)
    if channel is None or ts is None or sent_at is None:
        return Skipped("no channel or ts")
    if now - sent_at > timedelta(seconds=config.backlog_max_age):
        return Skipped(f"older than backlog_max_age (sent {sent_at:%Y-%m-%d %H:%M:%S} UTC)")

    channel_type = event.get("channel_type")
    is_direct = channel_type == "im" or (channel_type is None and channel.startswith("D"))
    raw_text = event.get("text")
    raw_text = raw_text if isinstance(raw_text, str) else ""
    mentioned = kind == "app_mention" or f"<@{bot.user_id}>" in raw_text
    if not is_direct and not mentioned and channel not in config.channels:
        return Skipped(NOT_ADDRESSED)
    text = from_slack(raw_text, bot_user_id=bot.user_id)
    files, notes = _files(event.get("files"), config)
    if not text.strip() and not files and not notes:
        return Skipped("nothing Herald can read")
    if notes:
        text = "\n".join([text, *notes]) if text else "\n".join(notes)

    thread_ts = _str(event.get("thread_ts"))
    thread = thread_ts if thread_ts is not None else (None if is_direct else ts)
    key = message_key(channel, ts)
    original = key if edit_ts is not None else None
    if edit_ts is not None:
        key = PlatformMessageId(f"{key}:e{edit_ts}")
        sent_at = _timestamp(edit_ts) or sent_at
    profile = event.get("user_profile")
    name = ""
    if isinstance(profile, Mapping):
        name = str(profile.get("display_name") or profile.get("real_name") or "")
    message = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(channel),
        sender=Sender(ExternalUserId(user), name or user, False),
        text=text,
        platform_message_id=key,
        is_direct=is_direct,
        mentions_bot=mentioned,
        thread_id=ThreadId(thread) if thread is not None else None,
        received_at=sent_at,
        raw=dict(body),
        edit_of=original,
    )
    return Incoming(message, files)


def _files(items: Any, config: SlackConfig) -> tuple[tuple[FileRef, ...], list[str]]:
    """Files to download, and notes for the agent about files that are not downloaded."""
    files: list[FileRef] = []
    notes: list[str] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping):
            continue
        url = _str(item.get("url_private_download")) or _str(item.get("url_private"))
        name = _str(item.get("name")) or _str(item.get("id")) or "file"
        mime = _str(item.get("mimetype")) or "application/octet-stream"
        size = item.get("size") if isinstance(item.get("size"), int) else None
        if url is None:
            notes.append(f"[file {name} not downloadable]")
        elif (note := file_refusal(name, mime, size, config)) is not None:
            notes.append(note)
        else:
            files.append(FileRef(url, mime, size, name))
    return tuple(files), notes


def error_from(
    status: int | None, error: str | None, retry_after: str | None, doing: str
) -> HeraldError:
    """The Herald error for a failed Web API call (HTTP status, Slack's `error`, Retry-After).

    429 → RateLimited; token and scope errors → AuthError; 5xx and Slack's own failures →
    NotReady; anything else about the request (unknown channel, too long) → PermanentSendError.
    """
    detail = f"slack: {doing}: {error or f'HTTP {status}'}"
    if status == 429 or error == "ratelimited":
        try:
            seconds = float(retry_after) if retry_after is not None else DEFAULT_RETRY_AFTER
        except ValueError:
            seconds = DEFAULT_RETRY_AFTER
        return RateLimited(seconds if math.isfinite(seconds) else DEFAULT_RETRY_AFTER, detail)
    if error in AUTH_ERRORS:
        return AuthError(detail)
    if status is None or status >= 500 or error in TRANSIENT_ERRORS:
        return NotReady(detail)
    return PermanentSendError(detail)


def blocks_for(text: str, buttons: tuple[Button, ...], *, mrkdwn: bool) -> list[dict[str, Any]]:
    """Block Kit for a message with buttons: the text in `section` blocks (readable without
    the buttons), then one `actions` block whose buttons carry their command as `value`.

    `text` is what the `text` field carries: mrkdwn when `mrkdwn`, otherwise the plain text
    itself (shown as `plain_text`, nothing escaped).
    """
    kind = "mrkdwn" if mrkdwn else "plain_text"
    pieces = [text[i : i + SECTION_CHARS] for i in range(0, len(text), SECTION_CHARS)]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": kind, "text": piece}}
        for piece in pieces
        if piece.strip()
    ]
    elements: list[dict[str, Any]] = []
    for index, button in enumerate(buttons):
        element: dict[str, Any] = {
            "type": "button",
            "action_id": f"herald_{index}",
            "text": {"type": "plain_text", "text": button.label[:75], "emoji": True},
            "value": button.command,
        }
        style = BUTTON_STYLES.get(button.command.split(" ", 1)[0])
        if style is not None:
            element["style"] = style
        elements.append(element)
    if elements:
        blocks.append({"type": "actions", "block_id": BUTTONS_BLOCK, "elements": elements})
    return blocks


def reaction_from(body: Any, *, bot: BotIdentity, account: AccountId) -> Reaction | Skipped:
    """The reaction a `reaction_added` event callback carries, or `Skipped` and why (not on a
    message, the bot's own). Never raises. Slack names the emoji (`thumbsup`, `+1::skin-tone-2`).
    """
    event = body.get("event") if isinstance(body, Mapping) else None
    if not isinstance(event, Mapping) or event.get("type") != "reaction_added":
        return Skipped("not a reaction_added event")
    item = event.get("item")
    item = item if isinstance(item, Mapping) else {}
    user, name = _str(event.get("user")), _str(event.get("reaction"))
    channel, ts = _str(item.get("channel")), _str(item.get("ts"))
    if item.get("type") != "message" or channel is None or ts is None:
        return Skipped("a reaction to something other than a message")
    if user is None or name is None:
        return Skipped("a reaction without its user or emoji")
    if user == bot.user_id:
        return Skipped("the bot's own reaction")
    at = _timestamp(event.get("event_ts")) or datetime.now(UTC)
    event_id = _str(body.get("event_id")) or f"{user}:{name}:{event.get('event_ts')}"
    return Reaction(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(channel),
        sender=Sender(ExternalUserId(user), user, False),
        message=message_key(channel, ts),
        emoji=name,
        event_id=event_id,
        is_direct=channel.startswith("D"),
        received_at=at,
        raw=dict(body),
    )


def pressed(payload: Any, *, bot: BotIdentity, account: AccountId) -> Incoming[FileRef] | Skipped:
    """A press of one of Herald's buttons (a `block_actions` payload), as the presser's own
    command message in the session of the message the button is under; `Skipped` and why for
    anything else. Never raises.

    The message id is `<channel>:<message ts>:b<trigger id>`: one press is one inbox row, how
    often Slack delivers it.
    """
    if not isinstance(payload, Mapping) or payload.get("type") != "block_actions":
        return Skipped("not a block_actions payload")
    actions = payload.get("actions")
    action = actions[0] if isinstance(actions, list) and actions else None
    if not isinstance(action, Mapping):
        return Skipped("a block_actions payload without an action")
    command = button_command(action.get("value"))
    if command is None:
        return Skipped("a button press Herald did not offer")
    user = payload.get("user")
    user_id = _str(user.get("id")) if isinstance(user, Mapping) else None
    if user_id is None or user_id == bot.user_id:
        return Skipped("a press without a person")
    container = payload.get("container")
    container = container if isinstance(container, Mapping) else {}
    message = payload.get("message")
    message = message if isinstance(message, Mapping) else {}
    channel_info = payload.get("channel")
    channel = _str(container.get("channel_id")) or (
        _str(channel_info.get("id")) if isinstance(channel_info, Mapping) else None
    )
    ts = _str(container.get("message_ts")) or _str(message.get("ts"))
    trigger = _str(payload.get("trigger_id")) or _str(action.get("action_ts"))
    if channel is None or ts is None or trigger is None:
        return Skipped("a press without its channel or message")
    thread = _str(message.get("thread_ts")) or _str(container.get("thread_ts"))
    name = ""
    if isinstance(user, Mapping):
        name = str(user.get("name") or user.get("username") or "")
    inbound = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(channel),
        sender=Sender(ExternalUserId(user_id), name or user_id, False),
        text=command,
        platform_message_id=PlatformMessageId(f"{message_key(channel, ts)}:b{trigger}"),
        is_direct=channel.startswith("D"),
        mentions_bot=True,
        thread_id=ThreadId(thread) if thread is not None else None,
        raw=dict(payload),
    )
    return Incoming(inbound)
