"""Pure conversions between Mattermost's v4 payloads and Herald's messages. Never raise.

Ids: a chat is a channel id; a thread is its root post's id (`root_id`); a message is
`<channel>:<post>` (an edit `<channel>:<post>:e<edit_at>`, a button press
`<channel>:<post>:b<trigger>`, a slash command `<channel>:s<trigger>`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

from adapters.buttons import button_command
from adapters.inbound import FileRef, Incoming, Skipped, file_refusal, message_key
from adapters.mattermost import PLATFORM
from adapters.mattermost.config import MattermostConfig
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

NOT_ADDRESSED = "a channel post that does not mention the bot"
OWN_POST = "the bot's own post"
DIRECT = "D"
"""The channel type of a direct message (`O` open, `P` private, `G` group message)."""
SEND_MARK = "herald_send"
"""The post prop that carries a digest of the outbox key, found again after a crash."""
ACTION_PATH = "actions"
COMMAND_PATH = "command"


@dataclass(frozen=True, slots=True)
class Me:
    """The bot account: its user id and username (for `@username` mentions)."""

    user_id: str
    username: str = ""


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _ms(value: Any) -> datetime | None:
    """Milliseconds as a time; None for none, and for one no datetime holds (a reaction's
    `create_at` is the client's to choose)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(value / 1000, UTC)
    except (OverflowError, ValueError, OSError):
        return None


def json_of(text: str) -> Any:
    """`text` parsed; None when it is not JSON, or nests deeper than Python parses (a user's
    post props may nest thousands deep, which the server keeps and sends)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


MAX_DEPTH = 64
"""The deepest nesting a post may have (real ones nest a few levels; a user's props may nest
900 deep, which parses here but not where the store writes the post again)."""


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests deeper than `limit` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def event_of(text: str) -> dict[str, Any] | None:
    """A websocket frame's JSON object, None when it is not one."""
    value = json_of(text)
    return value if isinstance(value, dict) else None


def embedded(data: Any, key: str) -> Mapping[str, Any] | None:
    """`data[key]` of an event: a JSON object sent as a string (a post, a reaction)."""
    if not isinstance(data, Mapping):
        return None
    value = data.get(key)
    if isinstance(value, str):
        parsed = event_of(value)
        return parsed
    return value if isinstance(value, Mapping) else None


def mentions_of(data: Any) -> tuple[str, ...]:
    """The user ids a `posted` event says the post mentions (`data.mentions`, a JSON list)."""
    raw = data.get("mentions") if isinstance(data, Mapping) else None
    if isinstance(raw, str):
        raw = json_of(raw)
    return tuple(v for v in raw if isinstance(v, str)) if isinstance(raw, list) else ()


def _mentioned(text: str, me: Me) -> bool:
    if not me.username:
        return False
    return re.search(rf"(?<![\w.-])@{re.escape(me.username)}(?![\w-])", text, re.I) is not None


def to_inbound(
    post: Any,
    *,
    channel_type: str | None,
    mentions: Sequence[str] | None,
    me: Me,
    account: AccountId,
    config: MattermostConfig,
    now: datetime,
    edit: bool = False,
) -> Incoming[FileRef] | Skipped:
    """The message a post (of a `posted` event, or read back from a channel) carries for the
    agent, or `Skipped` and why. With `edit`, a `post_edited` post: its id names `edit_at`
    and `edit_of` the post.

    `channel_type` is the channel's (`D` direct; else a channel, where only posts that
    mention the bot — `mentions` of the event, or `@username` in the text — or posts in
    `config.channels` pass). A post with `root_id` is in that thread's session.
    """
    if not isinstance(post, Mapping) or too_deep(post):
        return Skipped(f"not a post, or one nested more than {MAX_DEPTH} deep")
    post_id, channel_id = _str(post.get("id")), _str(post.get("channel_id"))
    user = _str(post.get("user_id"))
    if post_id is None or channel_id is None or user is None:
        return Skipped("a post without its id, channel or user")
    if user == me.user_id:
        return Skipped(OWN_POST)
    if _str(post.get("type")) is not None:
        return Skipped(f"a {post.get('type')} post")
    props = post.get("props")
    props = props if isinstance(props, Mapping) else {}
    if props.get("from_bot") in ("true", True) or props.get("from_webhook") in ("true", True):
        return Skipped("a bot's post")
    if _ms(post.get("delete_at")) is not None:
        return Skipped("a deleted post")
    sent_at = _ms(post.get("create_at"))
    if sent_at is None:
        return Skipped("a post without its time")
    edited_at = _ms(post.get("edit_at")) if edit else None
    if edit:
        if edited_at is None:
            return Skipped("an update that is not an edit")
        sent_at = edited_at
    if now - sent_at > timedelta(seconds=config.backlog_max_age):
        return Skipped(f"older than backlog_max_age (sent {sent_at:%Y-%m-%d %H:%M:%S} UTC)")
    text = post.get("message")
    text = text if isinstance(text, str) else ""
    is_direct = channel_type == DIRECT
    mentioned = me.user_id in (mentions or ()) or _mentioned(text, me)
    if not is_direct and not mentioned and channel_id not in config.channels:
        return Skipped(NOT_ADDRESSED)
    if me.username:
        text = re.sub(rf"(?<![\w.-])@{re.escape(me.username)}(?![\w-])", "", text, flags=re.I)
        text = text.strip()
    files, notes = _files(post, config)
    if not text and not files and not notes:
        return Skipped("nothing Herald can read")
    if notes:
        text = "\n".join([text, *notes]) if text else "\n".join(notes)
    key = message_key(channel_id, post_id)
    root = _str(post.get("root_id"))
    stamp = int(edited_at.timestamp() * 1000) if edited_at is not None else 0
    message = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(channel_id),
        # Not `props.override_username`: any user may set it on their own post.
        sender=Sender(ExternalUserId(user), user),
        text=text,
        platform_message_id=key if edited_at is None else PlatformMessageId(f"{key}:e{stamp}"),
        is_direct=is_direct,
        mentions_bot=mentioned,
        thread_id=ThreadId(root) if root is not None else None,
        received_at=sent_at,
        raw=dict(post),
        edit_of=None if edited_at is None else key,
    )
    return Incoming(message, files)


def _files(
    post: Mapping[str, Any], config: MattermostConfig
) -> tuple[tuple[FileRef, ...], list[str]]:
    metadata = post.get("metadata")
    infos = metadata.get("files") if isinstance(metadata, Mapping) else None
    refs: list[FileRef] = []
    notes: list[str] = []
    base = config.url
    for info in infos if isinstance(infos, list) else []:
        if not isinstance(info, Mapping) or _str(info.get("id")) is None:
            continue
        name = _str(info.get("name")) or str(info["id"])
        mime = _str(info.get("mime_type")) or "application/octet-stream"
        size = info.get("size")
        size = size if isinstance(size, int) and not isinstance(size, bool) else None
        refused = file_refusal(name, mime, size, config)
        if refused is not None:
            notes.append(refused)
            continue
        refs.append(FileRef(f"{base}/api/v4/files/{info['id']}", mime, size, name))
    return tuple(refs), notes


def post_time(post: Any) -> int | None:
    """A post's `create_at` (milliseconds), None when it has none."""
    value = post.get("create_at") if isinstance(post, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def reaction_from(
    reaction: Any,
    *,
    channel_id: str | None,
    channel_type: str | None,
    me: Me,
    account: AccountId,
    now: datetime,
) -> Reaction | Skipped:
    """The reaction of a `reaction_added` event (`data.reaction`), or `Skipped` and why."""
    if not isinstance(reaction, Mapping):
        return Skipped("not a reaction")
    user, post = _str(reaction.get("user_id")), _str(reaction.get("post_id"))
    emoji = _str(reaction.get("emoji_name"))
    channel = _str(reaction.get("channel_id")) or channel_id
    if user is None or post is None or emoji is None or channel is None:
        return Skipped("a reaction without its user, post, emoji or channel")
    if user == me.user_id:
        return Skipped("the bot's own reaction")
    at = _ms(reaction.get("create_at")) or now
    return Reaction(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(channel),
        sender=Sender(ExternalUserId(user), user),
        message=message_key(channel, post),
        emoji=emoji,
        event_id=f"{post}:{user}:{emoji}:{int(at.timestamp() * 1000)}",
        is_direct=channel_type == DIRECT,
        received_at=now,
        raw=dict(reaction),
    )


def error_from(status: int, body: Any, headers: Mapping[str, str], doing: str) -> HeraldError:
    """The Herald error for a refused request: 401 AuthError, 429 RateLimited (after
    `X-Ratelimit-Reset` seconds), 5xx NotReady, anything else PermanentSendError."""
    said = ""
    if isinstance(body, Mapping):
        said = str(body.get("message") or body.get("id") or "")
    what = f"mattermost: {doing}: HTTP {status}" + (f" {said}" if said else "")
    if status == 401:
        return AuthError(f"{what} (check platforms.mattermost.token)")
    if status == 429:
        reset = headers.get("X-Ratelimit-Reset") or headers.get("Retry-After") or "1"
        try:
            wait = max(float(reset), 0.1)
        except ValueError:
            wait = 1.0
        return RateLimited(wait, what)
    if status >= 500 or status in (408, 425):
        return NotReady(what)
    return PermanentSendError(what)


def pending_post_id(me: Me, idempotency_key: str) -> str:
    """The `pending_post_id` of a chunk (the shape clients use: `<user id>:<13 digits>`),
    the same for every try of it; the server answers a repeat with the post made."""
    digest = int(hashlib.sha256(idempotency_key.encode()).hexdigest()[:15], 16)
    return f"{me.user_id}:{digest % 10**13:013d}"


_CHANNEL_WIDE = re.compile(
    r"(```.*?(?:```|\Z)|`[^`\n]*`)|(?<![\w.@-])@(channel|here|all)(?![\w-])", re.I | re.S
)


def quiet_mentions(text: str) -> str:
    """`text` with `@channel`, `@here` and `@all` defused (a word joiner after the `@`, which
    the server's mention parser does not take): an answer repeating them at a member's
    request would notify everyone in the channel. Code spans and people's mentions are kept.
    """
    return _CHANNEL_WIDE.sub(
        lambda m: m.group(1) if m.group(1) is not None else f"@\u2060{m.group(2)}", text
    )


def send_mark(idempotency_key: str) -> str:
    """What `SEND_MARK` holds for a chunk: a digest of its outbox key."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def signature(secret: str, command: str) -> str:
    """The HMAC-SHA256 (hex) of a button's command under `action_secret`."""
    return hmac.new(secret.encode(), command.encode(), hashlib.sha256).hexdigest()


def button_props(buttons: Sequence[Button], *, url: str, secret: str) -> dict[str, Any]:
    """The `props.attachments` of a post with Herald's buttons (interactive message
    buttons): each action posts to `url` with its command and the command's signature in
    its `context`."""
    actions = []
    for index, button in enumerate(buttons):
        verb = button.command.split(" ", 1)[0].lstrip("/")
        actions.append(
            {
                "id": f"herald{verb}{index}",
                "name": button.label[:80],
                "type": "button",
                "style": "success"
                if verb == "approve"
                else "danger"
                if verb == "deny"
                else "default",
                "integration": {
                    "url": url,
                    "context": {
                        "command": button.command,
                        "signature": signature(secret, button.command),
                    },
                },
            }
        )
    return {"attachments": [{"text": "", "actions": actions}]}


def _digest(trigger: str) -> str:
    """A short, fixed-length stand-in for a trigger id (base64 of a signed blob)."""
    return hashlib.sha256(trigger.encode()).hexdigest()[:32]


def pressed(payload: Any, *, secret: str, me: Me, account: AccountId) -> InboundMessage | Skipped:
    """A press of one of Herald's buttons (the server's POST to the integration URL) as the
    presser's own command, or `Skipped` and why: not JSON, not a command Herald offers, or a
    signature that does not match (compared in constant time)."""
    if not isinstance(payload, Mapping):
        return Skipped("not an action request")
    context = payload.get("context")
    context = context if isinstance(context, Mapping) else {}
    command = button_command(context.get("command"))
    signed = context.get("signature")
    if command is None or not isinstance(signed, str):
        return Skipped("a press of a button Herald did not offer")
    if not hmac.compare_digest(signed.encode(), signature(secret, command).encode()):
        return Skipped("a press whose signature does not match")
    user, channel = _str(payload.get("user_id")), _str(payload.get("channel_id"))
    post = _str(payload.get("post_id"))
    trigger = (
        _str(payload.get("trigger_id"))
        or hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[
            :26
        ]
    )
    if user is None or channel is None or post is None or user == me.user_id:
        return Skipped("a press without its person, channel or post")
    return InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(channel),
        sender=Sender(ExternalUserId(user), _str(payload.get("user_name")) or user),
        text=command,
        platform_message_id=PlatformMessageId(f"{message_key(channel, post)}:b{_digest(trigger)}"),
        mentions_bot=True,
        raw=dict(payload),
    )


def slash_command(
    body: bytes, *, token: str, me: Me, account: AccountId
) -> InboundMessage | Skipped:
    """A slash command's POST (form fields) as the person's own message: `/herald approve 7`
    is `/approve 7`, `/herald what is up` is `what is up`; `Skipped` and why for a body that
    is not one, or a token that does not match (compared in constant time)."""
    try:
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8"), strict_parsing=False).items()}
    except (UnicodeDecodeError, ValueError):
        return Skipped("not a form")
    given = form.get("token", "")
    if not token or not hmac.compare_digest(given.encode(), token.encode()):
        return Skipped("a command whose token does not match")
    user, channel = _str(form.get("user_id")), _str(form.get("channel_id"))
    trigger = _str(form.get("trigger_id"))
    if user is None or channel is None or trigger is None or user == me.user_id:
        return Skipped("a command without its person, channel or trigger")
    text = form.get("text", "").strip()
    if not text:
        return Skipped("an empty command")
    first = text.split(None, 1)[0].lower()
    if not text.startswith("/") and re.fullmatch(r"[a-z][a-z0-9_-]*", first) and first in COMMANDS:
        text = "/" + text
    root = _str(form.get("root_id"))
    return InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(channel),
        sender=Sender(ExternalUserId(user), _str(form.get("user_name")) or user),
        text=text,
        platform_message_id=PlatformMessageId(f"{channel}:s{_digest(trigger)}"),
        is_direct=False,
        mentions_bot=True,
        thread_id=ThreadId(root) if root is not None else None,
        raw=form,
    )


COMMANDS = frozenset(
    {
        "approve",
        "deny",
        "stop",
        "new",
        "reset",
        "queue",
        "steer",
        "interrupt",
        "mode",
        "status",
        "sethome",
        "help",
    }
)
"""Words that, first after the slash command, are Herald's commands (`/herald stop`)."""
