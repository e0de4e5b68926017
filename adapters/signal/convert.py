"""signal-cli's JSON ⇄ Herald's messages: pure functions, no I/O.

Inbound, each `receive` event of the daemon's stream is `{"account", "envelope"}`; an envelope
carries one of `dataMessage` (a message, a reaction), `editMessage` (an edit), `syncMessage`
(the account's other devices), `receiptMessage`, `typingMessage`, `callMessage`. A message is
known by its author and its timestamp: Herald's id of it is `<chat>:<author>:<timestamp>`,
where the chat is the group id (base64) or, in a direct chat, the other person (their number,
else their uuid). Outbound, Markdown becomes plain text with `textStyle` ranges (UTF-16).
"""

from __future__ import annotations

import base64
import mimetypes
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from adapters.inbound import Incoming, Skipped, file_refusal
from adapters.markdown import (
    Mark,
    Options,
    Run,
    link_text,
    normalize,
    quote_lines,
    render,
    utf16_len,
)
from adapters.markdown import parser as markdown_parser
from adapters.signal import PLATFORM
from adapters.signal.config import SignalConfig
from gateway.chunking import markdown_to_plain
from gateway.contracts.errors import HeraldError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId, ChatId, ExternalUserId, PlatformMessageId
from gateway.contracts.messages import Attachment, InboundMessage, Reaction, Sender

NOT_ADDRESSED = "group message that does not address the bot"
OWN = "our own message"
UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
NUMBER = re.compile(r"^\+[1-9][0-9]{6,14}$")
MENTION = "\ufffc"
"""What stands in a message's text where a mention is (its `mentions` say who)."""
MAX_ID = 200
"""The longest author or group id taken from an envelope (they are a number, a uuid or 44
base64 characters; anything longer would only make a key too long to index)."""
MAX_QUOTE = 500
"""Characters of a quoted message's text shown to the agent."""
DEFAULT_RETRY_AFTER = 60.0
"""Seconds to wait after a rate-limit failure that names no time."""

RATE_LIMIT_ERROR = -5
UNTRUSTED_KEY_ERROR = -4
IO_ERROR = -3
USER_ERROR = -1
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


@dataclass(frozen=True, slots=True)
class AttachmentRef:
    """A file of an inbound message, fetched from the daemon by `getAttachment`."""

    id: str
    mime_type: str
    size: int | None
    filename: str


@dataclass(frozen=True, slots=True)
class MessageRef:
    """A message as signal-cli addresses it: the chat it is in, its author and timestamp."""

    chat: str
    author: str
    timestamp: int


def message_id(chat: str, author: str, timestamp: int) -> PlatformMessageId:
    """Herald's id of a Signal message: `<chat>:<author>:<timestamp>`."""
    return PlatformMessageId(f"{chat}:{author}:{timestamp}")


def split_message_id(key: str) -> MessageRef | None:
    """The chat, author and timestamp of `message_id`'s form (an edit's `…:e<stamp>` suffix
    dropped), or None for anything else."""
    parts = key.split(":")
    if len(parts) == 4 and parts[3].startswith("e"):
        parts = parts[:3]
    if len(parts) != 3 or not parts[2].isdigit() or not parts[0] or not parts[1]:
        return None
    return MessageRef(parts[0], parts[1], int(parts[2]))


def is_group(chat: str) -> bool:
    """Whether a chat id is a group id (not a number or a uuid)."""
    return not NUMBER.match(chat) and not UUID.match(chat)


def recipient(chat: str) -> dict[str, Any]:
    """The JSON-RPC parameters that address `chat`: `groupId`, or `recipient`."""
    return {"groupId": chat} if is_group(chat) else {"recipient": [chat]}


def _id(value: Any) -> str | None:
    if isinstance(value, str) and value and len(value) <= MAX_ID and ":" not in value:
        return value
    return None


def author_of(envelope: Mapping[str, Any]) -> str | None:
    """Who sent an envelope: their number, else their uuid (None when neither is given)."""
    return _id(envelope.get("sourceNumber")) or _id(envelope.get("sourceUuid"))


def _is_me(who: str | None, uuid: str | None, number: str, my_uuid: str | None) -> bool:
    return who == number or (my_uuid is not None and my_uuid in (who, uuid))


def _sent_at(timestamp: Any, now: datetime) -> datetime:
    if isinstance(timestamp, int) and not isinstance(timestamp, bool) and timestamp > 0:
        try:
            return datetime.fromtimestamp(timestamp / 1000, UTC)
        except (OverflowError, OSError, ValueError):
            return now
    return now


def _text(data: Mapping[str, Any], number: str, my_uuid: str | None) -> tuple[str, bool]:
    """The message's text with its mentions written out (`@+1555…`), and whether one of them
    is the account's."""
    body = data.get("message")
    text = body if isinstance(body, str) else ""
    found = data.get("mentions")
    mentions = [m for m in found if isinstance(m, Mapping)] if isinstance(found, list) else []
    addressed = False
    units = text.encode("utf-16-le", "surrogatepass")
    mentions = [m for m in mentions if isinstance(m.get("start"), int)]
    for mention in sorted(mentions, key=lambda m: -int(m["start"])):
        who = _id(mention.get("number")) or _id(mention.get("uuid")) or "someone"
        if _is_me(who, _id(mention.get("uuid")), number, my_uuid):
            addressed = True
            who = number
        start, length = mention.get("start"), mention.get("length")
        if not isinstance(start, int) or not isinstance(length, int) or start < 0 or length < 0:
            continue
        name = f"@{who}".encode("utf-16-le")
        units = units[: start * 2] + name + units[(start + length) * 2 :]
    return units.decode("utf-16-le", "replace"), addressed


def _files(
    data: Mapping[str, Any], config: SignalConfig
) -> tuple[tuple[AttachmentRef, ...], list[str]]:
    found = data.get("attachments")
    items = [a for a in found if isinstance(a, Mapping)] if isinstance(found, list) else []
    refs: list[AttachmentRef] = []
    notes: list[str] = []
    for item in items:
        mime = str(item.get("contentType") or "application/octet-stream")
        size = item.get("size") if isinstance(item.get("size"), int) else None
        ident = item.get("id")
        extension = mimetypes.guess_extension(mime.split(";", 1)[0].strip()) or ""
        name = str(item.get("filename") or f"{ident or 'file'}{extension}")
        if not isinstance(ident, str) or not ident or "/" in ident or len(ident) > MAX_ID:
            notes.append(f"[file {name} unavailable: no attachment id]")
        elif (refusal := file_refusal(name, mime, size, config)) is not None:
            notes.append(refusal)
        else:
            refs.append(AttachmentRef(ident, mime, size, name))
    return tuple(refs), notes


def to_event(  # noqa: C901, PLR0912 - one envelope, every kind of it
    event: Mapping[str, Any],
    *,
    config: SignalConfig,
    account: AccountId,
    now: datetime,
    my_uuid: str | None = None,
) -> Incoming[AttachmentRef] | Reaction | Skipped:
    """The message (or edit, or reaction) of one `receive` event, or why it reaches no one.

    Skipped: another account's event, envelopes that are no message (receipts, typing, calls,
    stories, the account's own other devices), the account's own messages, removed
    reactions, messages older than `backlog_max_age`, and group messages that do not address
    the account in a group not listed in `groups`."""
    envelope = event.get("envelope")
    if not isinstance(envelope, Mapping):
        return Skipped("event without envelope")
    if event.get("account") not in (None, config.number):
        return Skipped(f"an event of account {event.get('account')}")
    author = author_of(envelope)
    if author is None:
        return Skipped("envelope without sender")
    if _is_me(author, _id(envelope.get("sourceUuid")), config.number, my_uuid):
        return Skipped(OWN)
    edit = envelope.get("editMessage")
    data = envelope.get("dataMessage")
    target: int | None = None
    if isinstance(edit, Mapping) and isinstance(edit.get("dataMessage"), Mapping):
        data = edit["dataMessage"]
        stamp = edit.get("targetSentTimestamp")
        target = stamp if isinstance(stamp, int) and stamp > 0 else None
        if target is None:
            return Skipped("edit without a target")
    if not isinstance(data, Mapping):
        kinds = [k for k in envelope if k.endswith("Message") and envelope[k] is not None]
        return Skipped(f"no message ({', '.join(kinds) or 'empty envelope'})")
    group = data.get("groupInfo")
    group_id = _id(group.get("groupId")) if isinstance(group, Mapping) else None
    chat = group_id or author
    direct = group_id is None
    name = envelope.get("sourceName")
    sender = Sender(ExternalUserId(author), name if isinstance(name, str) and name else author)
    stamp = data.get("timestamp")
    timestamp = stamp if isinstance(stamp, int) and stamp > 0 else envelope.get("timestamp")
    if not isinstance(timestamp, int) or timestamp <= 0:
        return Skipped("message without timestamp")
    sent = _sent_at(timestamp, now)
    reaction = data.get("reaction")
    if isinstance(reaction, Mapping):
        if reaction.get("isRemove"):
            return Skipped("a reaction taken back")
        whose = _id(reaction.get("targetAuthorNumber")) or _id(reaction.get("targetAuthorUuid"))
        when = reaction.get("targetSentTimestamp")
        emoji = reaction.get("emoji")
        if whose is None or not isinstance(when, int) or not isinstance(emoji, str) or not emoji:
            return Skipped("reaction without target or emoji")
        if _is_me(whose, _id(reaction.get("targetAuthorUuid")), config.number, my_uuid):
            whose = config.number
        return Reaction(
            platform=PLATFORM,
            account=account,
            chat_id=ChatId(chat),
            sender=sender,
            message=message_id(chat, whose, when),
            emoji=emoji,
            event_id=f"{author}:{timestamp}",
            is_direct=direct,
            received_at=now,
            raw={"author": author, "timestamp": timestamp, "group": group_id},
        )
    if now - sent > timedelta(seconds=config.backlog_max_age):
        return Skipped("older than backlog_max_age")
    text, addressed = _text(data, config.number, my_uuid)
    files, notes = _files(data, config)
    if not text.strip() and not files and not notes:
        return Skipped("a message with nothing to read (a sticker, a group update, a deletion)")
    quote = data.get("quote")
    reply_to: PlatformMessageId | None = None
    if isinstance(quote, Mapping) and isinstance(quote.get("id"), int):
        quoted = _id(quote.get("authorNumber")) or _id(quote.get("authorUuid"))
        if quoted is not None:
            if _is_me(quoted, _id(quote.get("authorUuid")), config.number, my_uuid):
                quoted = config.number
                addressed = True
            reply_to = message_id(chat, quoted, int(quote["id"]))
        said = quote.get("text")
        if isinstance(said, str) and said.strip():
            text = f"[replying to: {said.strip()[:MAX_QUOTE]}]\n{text}"
    if not direct and not addressed and chat not in config.groups:
        return Skipped(NOT_ADDRESSED)
    key = message_id(chat, author, timestamp)
    edit_of: PlatformMessageId | None = None
    if target is not None:
        edit_of = message_id(chat, author, target)
        key = PlatformMessageId(f"{edit_of}:e{timestamp}")
    message = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(chat),
        sender=sender,
        text="\n".join([text, *notes]) if notes else text,
        platform_message_id=key,
        is_direct=direct,
        mentions_bot=addressed,
        reply_to=reply_to,
        received_at=now,
        raw={"author": author, "timestamp": timestamp, "group": group_id},
        edit_of=edit_of,
    )
    return Incoming(message, files)


def data_uri(attachment: Attachment, data: bytes) -> str:
    """A file as signal-cli takes it in `attachments`: an RFC 2397 data URI with its name.

    signal-cli URL-decodes the name (a bare `%` would fail the send, a `+` become a space)
    and reads one parameter only (its pattern is greedy): the name is percent-encoded and
    the type goes without its own parameters."""
    name = quote(attachment.filename or attachment.path.name, safe="")
    mime = attachment.mime_type.split(";", 1)[0].strip() or "application/octet-stream"
    encoded = base64.b64encode(data).decode()
    return f"data:{mime};filename={name};base64,{encoded}"


# -- outbound text ---------------------------------------------------------------------------

_OPTIONS = Options(
    linkable=re.compile(r"(?:https?://[^\s/?#]|mailto:\S)", re.IGNORECASE),
    languages=False,
    link_break=" ",
    measure=len,
)
_STYLES = {
    "b": "BOLD",
    "i": "ITALIC",
    "s": "STRIKETHROUGH",
    "code": "MONOSPACE",
    "pre": "MONOSPACE",
}


@dataclass(frozen=True, slots=True)
class Styled:
    """A message's text and its `textStyle` ranges (`start:length:STYLE`, UTF-16 units)."""

    text: str
    styles: tuple[str, ...] = ()


def to_signal(markdown: str) -> Styled:
    """Signal text for Markdown: bold, italic, strikethrough and code as text styles, quotes
    as `> ` lines, links as `text (url)`; plain text if the Markdown cannot be rendered."""
    try:
        runs = render(normalize(markdown), _OPTIONS, md=markdown_parser()).runs
        styled = _write(runs)
    # A renderer bug must degrade to plain text, never lose the answer.
    except Exception:
        return Styled(markdown_to_plain(normalize(markdown)).strip())
    if not styled.text.strip() and markdown.strip():
        return Styled(markdown_to_plain(normalize(markdown)).strip())
    return styled


def _write(runs: Sequence[Run]) -> Styled:
    out: list[str] = []
    styles: list[str] = []
    at = 0

    def put(text: str, marks: Sequence[Mark] = ()) -> None:
        nonlocal at
        length = utf16_len(text)
        if length and text.strip():
            styles.extend(f"{at}:{length}:{_STYLES[m.kind]}" for m in marks if m.kind in _STYLES)
        out.append(text)
        at += length

    for index, (line, quoted) in enumerate(quote_lines(runs)):
        if index:
            put("\n")
        if quoted:
            put("> ")
        link: tuple[str, str] | None = None
        for run in line:
            marks = [m for m in run.marks if m.kind != "quote"]
            url = next((m.arg for m in marks if m.kind == "a"), None)
            if link is not None and url != link[0]:
                put(_link_end(*link))
                link = None
            if url is not None:
                link = (url, (link[1] if link else "") + run.text)
            put(run.text, marks)
        if link is not None:
            put(_link_end(*link))
    text = "".join(out)
    stripped = text.rstrip()
    end = utf16_len(stripped)
    kept = [s for s in styles if int(s.split(":")[0]) < end]
    return Styled(stripped, tuple(kept))


def _link_end(url: str, label: str) -> str:
    shown = link_text(url)
    return f" ({shown})" if label.strip() and label.strip() != shown else ""


# -- errors ----------------------------------------------------------------------------------


def retry_after_of(data: Any) -> float | None:
    """The longest `retryAfterSeconds` of the send results in a JSON-RPC error's `data`."""
    response = data.get("response") if isinstance(data, Mapping) else None
    results = response.get("results") if isinstance(response, Mapping) else None
    waits = [
        float(r["retryAfterSeconds"])
        for r in results or ()
        if isinstance(r, Mapping) and isinstance(r.get("retryAfterSeconds"), int | float)
    ]
    return max(waits) if waits else None


def _results_of(data: Any) -> list[Mapping[str, Any]]:
    response = data.get("response") if isinstance(data, Mapping) else None
    results = response.get("results") if isinstance(response, Mapping) else None
    return [r for r in results or () if isinstance(r, Mapping)] if isinstance(results, list) else []


def challenge_of(data: Any) -> str | None:
    """The captcha challenge token of a proof-required failure (signal-cli writes it as the
    `token` of a RATE_LIMIT_FAILURE result), or None."""
    tokens = [r.get("token") for r in _results_of(data) if isinstance(r.get("token"), str)]
    return str(tokens[0]) if tokens else None


TRANSIENT = frozenset({"NETWORK_FAILURE", "RATE_LIMIT_FAILURE"})
"""Send result types that say nothing about the message or the recipient: try again later."""


def error_from(code: int, message: str, data: Any, doing: str) -> HeraldError:
    """The Herald error for a JSON-RPC error of a send (or another call to one chat)."""
    what = f"signal: {doing}: {message} ({code})"
    if code == RATE_LIMIT_ERROR:
        wait = retry_after_of(data)
        challenge = challenge_of(data)
        if challenge is not None:
            what += (
                ": Signal asks for a captcha before this account sends more; solve one at "
                "https://signalcaptchas.org/challenge/generate.html and run `signal-cli "
                f"submitRateLimitChallenge --challenge {challenge} --captcha CAPTCHA_TOKEN`"
            )
        return RateLimited(DEFAULT_RETRY_AFTER if wait is None else wait, what)
    if code in (IO_ERROR, INTERNAL_ERROR):
        return NotReady(what)
    kinds = {str(r.get("type")) for r in _results_of(data)}
    if code == USER_ERROR and kinds and kinds <= TRANSIENT:
        # "Failed to send message" because Signal's servers could not be reached.
        return NotReady(f"{what}: {', '.join(sorted(kinds))}")
    if code == UNTRUSTED_KEY_ERROR:
        return PermanentSendError(
            f"{what}: the person's safety number changed; trust it with `signal-cli trust`"
        )
    return PermanentSendError(what)


def failed_results(result: Any) -> list[str]:
    """The failure types of a send's per-recipient `results` (empty when all succeeded)."""
    results = result.get("results") if isinstance(result, Mapping) else None
    return [
        str(r.get("type"))
        for r in results or ()
        if isinstance(r, Mapping) and r.get("type") not in (None, "SUCCESS")
    ]
