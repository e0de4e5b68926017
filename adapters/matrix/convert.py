"""Matrix events → normalized messages, Markdown → Matrix HTML, Matrix errors → Herald errors.

Pure functions over the events' JSON (as the client-server API sends them), no SDK types.

A Matrix event id is unique on its own, but Herald keys a platform message by its container
too: `<room id>:<event id>` (room ids may hold a colon, event ids do not and start with `$`:
`split_event_key` splits before the `$`). An edit (`m.replace`) is `<room id>:<event id of the
original>:e<the edit's origin_server_ts>`, naming the original in `edit_of`. A thread
(`m.thread`) is a session of its own, its id the thread root's event id; a reply
(`m.in_reply_to`) carries the quoted text to the agent when the sender's client wrote the
fallback quote. A reaction (`m.annotation`) is a `Reaction` for the gateway to judge.
"""

from __future__ import annotations

import html
import mimetypes
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from markdown_it import MarkdownIt

from adapters.buttons import button_command
from adapters.inbound import Incoming, Skipped, file_refusal, message_key
from adapters.matrix import PLATFORM
from adapters.matrix.config import MatrixConfig
from gateway.contracts.errors import (
    AuthError,
    HeraldError,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.ids import AccountId, ChatId, ExternalUserId, PlatformMessageId, ThreadId
from gateway.contracts.messages import Button, InboundMessage, Reaction, Sender

NOT_ADDRESSED = "group message that does not address the bot"
FILE_TYPES = frozenset({"m.image", "m.file", "m.audio", "m.video"})
TEXT_TYPES = frozenset({"m.text", "m.notice", "m.emote"})
HTML_FORMAT = "org.matrix.custom.html"
MXC = re.compile(r"mxc://(?!\.\.?/)[A-Za-z0-9.:\[\]-]+/[A-Za-z0-9_-]+")
"""A media URI as the spec has it (server name / media id): nothing that could walk the
download URL elsewhere on the homeserver (`..`, `/`, `?`)."""
EVENT_ID = re.compile(r"\$\S{1,254}")
"""An event id as the spec bounds it (255 bytes): relation ids are the sender's to write, and
an unbounded one would become a session key too long to index."""
MAX_QUOTE = 500
"""Characters of a replied-to message's text shown to the agent."""
MAX_EVENT_BYTES = 65_536
"""The largest event a homeserver accepts (the spec's limit, JSON included)."""
E2E_REFUSAL = (
    "This room is end-to-end encrypted, and Herald does not read encrypted rooms. "
    "Talk to me in a room without encryption (a new direct chat with encryption turned off)."
)
"""What Herald says, once, in an encrypted room it was brought into."""


@dataclass(frozen=True, slots=True)
class MediaRef:
    """A file of an inbound event to download from the media repository."""

    mxc: str
    mime_type: str
    size: int | None
    filename: str


@dataclass(frozen=True, slots=True)
class RoomView:
    """What converting an event needs to know about its room."""

    room_id: str
    members: int
    """Joined plus invited members (2: a direct chat)."""
    encrypted: bool = False


@dataclass(frozen=True, slots=True)
class Me:
    """Who the account is: its id and display name, to tell mentions."""

    user_id: str
    display_name: str = ""


def split_event_key(key: str) -> tuple[str, str] | None:
    """(room id, event id) of a key made by `message_key` (an edit's `:e<stamp>` suffix, or
    a reaction's `:r<id>`, names the event it is about), or None for anything else."""
    room, sep, rest = key.partition(":$")
    event = "$" + rest.split(":", 1)[0]
    if not sep or len(room) < 2 or not room.startswith("!") or event == "$":
        return None
    return room, event


def mentions(content: Mapping[str, Any], body: str, me: Me) -> bool:
    """Whether `content` addresses `me`: `m.mentions`, else its id, localpart or display name
    in the text (as clients without intentional mentions write a mention)."""
    intentional = content.get("m.mentions")
    if isinstance(intentional, Mapping):
        users = intentional.get("user_ids")
        if isinstance(users, list) and me.user_id in users:
            return True
    lowered = body.casefold()
    localpart = me.user_id[1:].split(":", 1)[0]
    names = [me.user_id, localpart, me.display_name]
    return any(
        re.search(rf"(?<!\w){re.escape(n.casefold())}(?!\w)", lowered) for n in names if n.strip()
    )


def inviter_of(invite_state: Sequence[Mapping[str, Any]], me: Me) -> str | None:
    """Who invited `me`, from an invite's stripped state: the sender of the last member event
    inviting `me` (the homeserver puts the invite itself last; the state before it is what the
    inviting server claimed, and may hold a forged "invite" from someone allowed)."""
    for state in reversed(invite_state):
        content = state.get("content")
        if (
            state.get("type") == "m.room.member"
            and state.get("state_key") == me.user_id
            and isinstance(content, Mapping)
            and content.get("membership") == "invite"
            and isinstance(state.get("sender"), str)
        ):
            return str(state["sender"])
    return None


def strip_reply_fallback(body: str) -> tuple[str, str]:
    """(text, quoted): a reply's body without the `> ` fallback lines its client put first,
    and those lines' text (the replied-to message, as the sender's client quoted it)."""
    lines = body.split("\n")
    quoted: list[str] = []
    index = 0
    while index < len(lines) and lines[index].startswith(">"):
        quoted.append(lines[index].removeprefix(">").removeprefix(" "))
        index += 1
    if not quoted:
        return body, ""
    if index < len(lines) and not lines[index].strip():
        index += 1
    if quoted and quoted[0].startswith("<@"):
        quoted[0] = quoted[0].split("> ", 1)[-1]
    return "\n".join(lines[index:]), "\n".join(quoted).strip()


def event_id_like(value: object) -> bool:
    """Whether `value` may be an event id (a `$`, at most 255 bytes, no spaces)."""
    return isinstance(value, str) and len(value.encode()) <= 255 and bool(EVENT_ID.fullmatch(value))


def _sent_at(ts: object, now: datetime) -> datetime:
    """When an event was sent: its `origin_server_ts` (set by the sender's server, so any
    integer), `now` when that is no time a datetime can hold."""
    if not isinstance(ts, int):
        return now
    try:
        return datetime.fromtimestamp(ts / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return now


def _relation(content: Mapping[str, Any]) -> Mapping[str, Any]:
    relates = content.get("m.relates_to")
    return relates if isinstance(relates, Mapping) else {}


def to_inbound(  # noqa: C901, PLR0912 - one event, every kind of it
    event: Mapping[str, Any],
    *,
    room: RoomView,
    me: Me,
    account: AccountId,
    config: MatrixConfig,
    now: datetime,
    display_name: str = "",
    original: Mapping[str, Any] | None = None,
) -> Incoming[MediaRef] | Skipped:
    """The message of one timeline event, or why it does not reach the agent.

    An edit (`m.replace`) needs `original`, the event it replaces (read by the adapter): the
    message is then its `m.new_content`, in the original's thread, with `edit_of` naming the
    original. An edit by anyone but the original's sender, or of an event that is not a
    message, is skipped (clients show no such edit either)."""
    sender = event.get("sender")
    event_id = event.get("event_id")
    if not isinstance(sender, str) or not isinstance(event_id, str):
        return Skipped("event without sender or id")
    if sender == me.user_id:
        return Skipped("our own event")
    if event.get("type") != "m.room.message":
        return Skipped(f"event of type {event.get('type')}")
    if room.encrypted:
        return Skipped("a message in an end-to-end encrypted room (not answered in the clear)")
    content = event.get("content")
    if not isinstance(content, Mapping) or not content:
        return Skipped("redacted or empty message")
    relation = _relation(content)
    ts = event.get("origin_server_ts")
    edit_of: PlatformMessageId | None = None
    key = message_key(room.room_id, event_id)
    if relation.get("rel_type") == "m.replace":
        edited = _edited(event, original)
        if isinstance(edited, Skipped):
            return edited
        content, relation, original_id = edited
        edit_of = message_key(room.room_id, original_id)
        key = PlatformMessageId(f"{edit_of}:e{ts if isinstance(ts, int) else event_id[1:]}")
    sent = _sent_at(ts, now)
    if now - sent > timedelta(seconds=config.backlog_max_age):
        return Skipped("older than backlog_max_age")
    msgtype = content.get("msgtype")
    body = content.get("body")
    body = body if isinstance(body, str) else ""
    thread: ThreadId | None = None
    reply_to: PlatformMessageId | None = None
    if relation.get("rel_type") == "m.thread" and event_id_like(relation.get("event_id")):
        thread = ThreadId(str(relation["event_id"]))
    in_reply = relation.get("m.in_reply_to")
    quoted = ""
    if isinstance(in_reply, Mapping) and isinstance(in_reply.get("event_id"), str):
        if not relation.get("is_falling_back") and event_id_like(in_reply["event_id"]):
            reply_to = message_key(room.room_id, str(in_reply["event_id"]))
        body, quoted = strip_reply_fallback(body)
    files: tuple[MediaRef, ...] = ()
    text = body
    if msgtype in FILE_TYPES:
        info = content.get("info")
        info = info if isinstance(info, Mapping) else {}
        mime = str(info.get("mimetype") or "application/octet-stream")
        size = info.get("size") if isinstance(info.get("size"), int) else None
        name = _with_extension(str(content.get("filename") or body or "file"), mime)
        url = content.get("url")
        caption = body if content.get("filename") and body != content.get("filename") else ""
        text = caption
        if not isinstance(url, str) or not MXC.fullmatch(url):
            why = "encrypted" if "file" in content else "no valid mxc:// address"
            text = "\n".join(filter(None, [caption, f"[file {name} unavailable: {why}]"]))
        elif (refusal := file_refusal(name, mime, size, config)) is not None:
            text = "\n".join(filter(None, [caption, refusal]))
        else:
            files = (MediaRef(url, mime, size, name),)
    elif msgtype not in TEXT_TYPES:
        return Skipped(f"message of type {msgtype}")
    direct = room.members <= 2
    addressed = mentions(content, body, me)
    if not direct and not addressed and room.room_id not in config.rooms:
        return Skipped(NOT_ADDRESSED)
    if quoted:
        text = f"[replying to: {quoted[:MAX_QUOTE]}]\n{text}"
    message = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(room.room_id),
        sender=Sender(ExternalUserId(sender), display_name or sender),
        text=text,
        platform_message_id=key,
        is_direct=direct,
        mentions_bot=addressed,
        thread_id=thread,
        reply_to=reply_to,
        received_at=now,
        raw={"event_id": event_id, "room_id": room.room_id, "sender": sender},
        edit_of=edit_of,
    )
    return Incoming(message, files)


AUDIO_EXTENSIONS = {
    "audio/ogg": ".ogg",
    "audio/opus": ".ogg",
    "audio/mpeg": ".mp3",
    "audio/mp4": ".m4a",
    "audio/webm": ".webm",
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
}
"""Extensions of the audio types clients send (a transcription endpoint reads the format from
the file's name)."""


def _with_extension(name: str, mime_type: str) -> str:
    """`name`, with an extension for its type when it has none (Element names a voice
    message "Voice message")."""
    if "." in name.rsplit("/", 1)[-1]:
        return name
    base = mime_type.split(";", 1)[0].strip().lower()
    extension = AUDIO_EXTENSIONS.get(base) or mimetypes.guess_extension(base) or ""
    return name + extension


def edited_event(event: Mapping[str, Any]) -> str | None:
    """The id of the event an `m.replace` edit replaces, or None for any other event."""
    content = event.get("content")
    relation = _relation(content) if isinstance(content, Mapping) else {}
    target = relation.get("event_id")
    if relation.get("rel_type") != "m.replace" or not event_id_like(target):
        return None
    return str(target)


def _edited(
    event: Mapping[str, Any], original: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any], Mapping[str, Any], str] | Skipped:
    """(the new content, the original's relation, the original's id) of an edit, or why it
    is not one Herald takes."""
    target = edited_event(event)
    if target is None or original is None or original.get("event_id") != target:
        return Skipped("an edit of an event Herald cannot read")
    if original.get("sender") != event.get("sender"):
        return Skipped("an edit by someone other than the message's sender")
    before = original.get("content")
    if original.get("type") != "m.room.message" or not isinstance(before, Mapping):
        return Skipped("an edit of something other than a message")
    if _relation(before).get("rel_type") == "m.replace":
        return Skipped("an edit of an edit")
    content = event.get("content")
    new = content.get("m.new_content") if isinstance(content, Mapping) else None
    if not isinstance(new, Mapping) or not new:
        return Skipped("an edit without its new content")
    thread = _relation(before)
    # The original's thread, not its reply: the new content has no reply fallback to strip.
    kept = {k: v for k, v in thread.items() if k in ("rel_type", "event_id")}
    relation = kept if kept.get("rel_type") == "m.thread" else {}
    return {k: v for k, v in new.items() if k != "m.relates_to"}, relation, target


REACT_TO_APPROVE = "✅"
REACT_TO_DENY = "❌"
"""The reactions an approval question offers for its buttons (the gateway reads these, and
👍 / 👎, as the reactor's `/approve N` and `/deny N`)."""


def button_reactions(buttons: Sequence[Button]) -> dict[str, str]:
    """The reaction that stands for each of Herald's buttons → the command it sends (buttons
    of other commands are left out: a reaction could not send them)."""
    out: dict[str, str] = {}
    for button in buttons:
        command = button_command(button.command)
        if command is not None:
            key = REACT_TO_APPROVE if command.startswith("/approve") else REACT_TO_DENY
            out.setdefault(key, command)
    return out


def with_buttons(content: dict[str, Any], buttons: Sequence[Button]) -> dict[str, Any]:
    """`content` offering `buttons` as reactions: the choices written under the text (a
    reaction comes back to the gateway as a `Reaction`, and means the button's command)."""
    reactions = button_reactions(buttons)
    if not reactions:
        return content
    labels = {button_command(b.command): b.label for b in buttons}
    choices = ", ".join(
        f"{key} {labels[command].removeprefix(key).strip() or command}"
        for key, command in reactions.items()
    )
    note = f"React {choices} (or send the command)."
    out = {**content, "body": f"{content.get('body', '')}\n\n{note}"}
    if "formatted_body" in content:
        out["formatted_body"] = f"{content['formatted_body']}<p>{html.escape(note)}</p>"
    return out


def reaction_of(event: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reacted-to event id, key) of an `m.reaction` event, or None."""
    if event.get("type") != "m.reaction":
        return None
    content = event.get("content")
    relation = _relation(content) if isinstance(content, Mapping) else {}
    target, key = relation.get("event_id"), relation.get("key")
    if relation.get("rel_type") != "m.annotation" or not event_id_like(target):
        return None
    return (str(target), key) if isinstance(key, str) and key else None


def reaction_from(
    event: Mapping[str, Any],
    *,
    room: RoomView,
    me: Me,
    account: AccountId,
    now: datetime,
    display_name: str = "",
) -> Reaction | Skipped:
    """The reaction an `m.reaction` (`m.annotation`) event adds, or `Skipped` and why (the
    bot's own, not an annotation). Whether it is on one of the bot's messages, and who may
    react, the gateway decides (`ReactionSink.react`)."""
    found = reaction_of(event)
    sender, event_id = event.get("sender"), event.get("event_id")
    if found is None or not isinstance(sender, str) or not isinstance(event_id, str):
        return Skipped("not a reaction")
    if sender == me.user_id:
        return Skipped("our own event")
    ts = event.get("origin_server_ts")
    return Reaction(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(room.room_id),
        sender=Sender(ExternalUserId(sender), display_name or sender),
        message=message_key(room.room_id, found[0]),
        emoji=found[1],
        event_id=event_id,
        is_direct=room.members <= 2,
        received_at=datetime.fromtimestamp(ts / 1000, UTC) if isinstance(ts, int) else now,
        raw={"event_id": event_id, "room_id": room.room_id, "sender": sender},
    )


_MARKDOWN = (
    MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True})
    .enable("strikethrough")
    .enable("table")
)


def _image_as_link(_renderer: Any, tokens: Sequence[Any], idx: int, *_: Any) -> str:
    """A Markdown picture as a link to it (http/https) or its alt text: Matrix's `<img>` takes
    mxc:// only, and a client that fetched any other address would load a tracker."""
    token = tokens[idx]
    alt = html.escape(token.content or "picture", quote=False)
    src = str(token.attrGet("src") or "")
    inside_link = idx > 0 and tokens[idx - 1].type == "link_open"
    if src.startswith(("https://", "http://")) and not inside_link:
        return f'<a href="{html.escape(src)}">{alt}</a>'
    return alt


_MARKDOWN.add_render_rule("image", _image_as_link)
LINK_SCHEMES = ("https", "http", "ftp", "mailto", "magnet", "matrix")
"""The link schemes a Matrix client keeps (the spec's list, and `matrix:`)."""


def _safe_link(url: str) -> bool:
    scheme, colon, _ = url.partition(":")
    return bool(colon) and scheme.strip().casefold() in LINK_SCHEMES


_MARKDOWN.validateLink = _safe_link  # type: ignore[method-assign]


def to_html(markdown: str) -> str:
    """Matrix HTML (`org.matrix.custom.html`) for `markdown`: only the tags Markdown makes
    (raw HTML in the text is escaped, links of schemes outside `LINK_SCHEMES` are left as
    text, pictures become links)."""
    return str(_MARKDOWN.render(markdown)).strip()


def text_content(
    text: str,
    *,
    markdown: bool,
    thread: str | None = None,
    reply_to: str | None = None,
) -> dict[str, Any]:
    """The content of an `m.text` event saying `text` (in a thread, replying to an event).

    Its empty `m.mentions` mentions no one: clients then ignore `@room` and names in the text
    (the body-based push rules apply only to events without `m.mentions`)."""
    content: dict[str, Any] = {"msgtype": "m.text", "body": text, "m.mentions": {}}
    if markdown:
        formatted = to_html(text)
        if formatted != f"<p>{_escaped(text)}</p>":
            content["format"] = HTML_FORMAT
            content["formatted_body"] = formatted
    relate(content, thread=thread, reply_to=reply_to)
    return content


def _escaped(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def relate(content: dict[str, Any], *, thread: str | None, reply_to: str | None) -> None:
    """Put `content` in `thread` (with `reply_to` as its in-thread reply) or make it a reply."""
    if thread:
        target = reply_to or thread
        content["m.relates_to"] = {
            "rel_type": "m.thread",
            "event_id": thread,
            "is_falling_back": reply_to is None,
            "m.in_reply_to": {"event_id": target},
        }
    elif reply_to:
        content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}


def edit_content(target: str, new: Mapping[str, Any]) -> dict[str, Any]:
    """An `m.replace` event's content that makes event `target` read `new`."""
    replacement = {k: v for k, v in new.items() if k != "m.relates_to"}
    content: dict[str, Any] = {
        **replacement,
        "body": f"* {new.get('body', '')}",
        "m.new_content": replacement,
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }
    if "formatted_body" in replacement:
        content["formatted_body"] = f"* {replacement['formatted_body']}"
    return content


VOICE_BODY = "Voice message"
"""The body of a voice reply (what clients that do not play it show)."""


def ogg_duration_ms(data: bytes) -> int | None:
    """The length of an Ogg/Opus stream in milliseconds: the last page's granule position
    (48 kHz samples) less the `OpusHead` pre-skip; None when the stream does not say."""
    head = data.find(b"OpusHead")
    last = data.rfind(b"OggS")
    if head < 0 or last < 0 or len(data) < last + 14 or len(data) < head + 12:
        return None
    granule = int.from_bytes(data[last + 6 : last + 14], "little", signed=True)
    pre_skip = int.from_bytes(data[head + 10 : head + 12], "little")
    samples = granule - pre_skip
    return samples * 1000 // 48_000 if samples > 0 else None


def voice_content(
    url: str, *, size: int, mime_type: str, filename: str, duration_ms: int | None
) -> dict[str, Any]:
    """The content of an `m.audio` event that clients play as a voice message (MSC3245: the
    `org.matrix.msc3245.voice` marker, with MSC1767's audio block), as Element sends one."""
    info: dict[str, Any] = {"mimetype": mime_type, "size": size}
    audio: dict[str, Any] = {}
    if duration_ms is not None:
        info["duration"] = audio["duration"] = duration_ms
    return {
        "msgtype": "m.audio",
        "body": VOICE_BODY,
        "filename": filename,
        "url": url,
        "info": info,
        "org.matrix.msc1767.text": VOICE_BODY,
        "org.matrix.msc1767.file": {
            "url": url,
            "name": filename,
            "mimetype": mime_type,
            "size": size,
        },
        "org.matrix.msc1767.audio": audio,
        "org.matrix.msc3245.voice": {},
    }


def within_event_limit(content: dict[str, Any], encoded_size: int) -> dict[str, Any]:
    """`content` small enough for one event: without its HTML when only that is too much.
    Raises PermanentSendError when the plain text alone is too large."""
    if encoded_size <= MAX_EVENT_BYTES - 2048:
        return content
    plain = {k: v for k, v in content.items() if k not in ("format", "formatted_body")}
    new = plain.get("m.new_content")
    if isinstance(new, Mapping):
        plain["m.new_content"] = {
            k: v for k, v in new.items() if k not in ("format", "formatted_body")
        }
    return plain


def error_from(
    errcode: str | None,
    message: str,
    *,
    status: int | None,
    retry_after_ms: int | None,
    doing: str,
) -> HeraldError:
    """The Herald error for a homeserver's refusal met while `doing` something.

    M_LIMIT_EXCEEDED / 429 → RateLimited (its `retry_after_ms`); M_UNKNOWN_TOKEN, M_MISSING_TOKEN
    and 401 → AuthError; other 4xx (M_FORBIDDEN: not in the room, M_NOT_FOUND, M_TOO_LARGE) →
    PermanentSendError; 5xx and no answer → NotReady.
    """
    detail = f"{PLATFORM}: {doing}: {errcode or status or 'error'} {message}".strip()
    if errcode == "M_LIMIT_EXCEEDED" or status == 429:
        return RateLimited((retry_after_ms or 1000) / 1000, detail)
    if errcode in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN") or status == 401:
        return AuthError(f"{detail} (check access_token and user_id)")
    if status is not None and 400 <= status < 500:
        return PermanentSendError(detail)
    return NotReady(detail)


def known(value: object, names: Collection[str]) -> bool:
    """Whether `value` is one of `names` (for event types read from JSON)."""
    return isinstance(value, str) and value in names
