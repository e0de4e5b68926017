"""Pure mail conversions: a received RFC 5322 message ⇄ Herald's normalized messages.

Ids: a mail's `platform_message_id` is its Message-ID without the angle brackets (the inbox
deduplicates on it, so the same mail fetched twice, or again after UIDVALIDITY changed, is
stored once); a mail without a Message-ID gets `uid:<uidvalidity>:<uid>`. The chat is the
sender's address, lowercased; the thread is the thread root's Message-ID (the first entry of
References, else In-Reply-To, else the mail's own id) when sessions are per thread.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy
from email.headerregistry import Address
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import EmailPolicy
from email.utils import format_datetime, getaddresses, make_msgid, parseaddr
from html.parser import HTMLParser
from typing import Any

from markdown_it import MarkdownIt

from adapters.email import PLATFORM, authres
from adapters.email.config import REFUSED, EmailConfig, SessionBy
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    PlatformMessageId,
    ThreadId,
)
from gateway.contracts.messages import InboundMessage, Sender

HERALD_ID_PREFIX = "herald."
"""Message-IDs Herald writes start with this, so its own mail is recognized if it comes back."""
NO_MESSAGE_ID = "uid:"
"""Prefix of the id given to a mail without a Message-ID (`uid:<uidvalidity>:<uid>`)."""
MAX_REFERENCES = 20
"""References kept in a reply (the root and the most recent ones)."""
SUBJECT = "subject"
"""Key of `InboundMessage.raw` holding the mail's subject."""

_BULK_PRECEDENCE = frozenset({"bulk", "list", "junk"})
_LIST_HEADERS = ("List-Id", "List-Unsubscribe", "List-Post", "List-Help", "Mailing-List")
_AUTO_HEADERS = ("X-Autoreply", "X-Autorespond")
_ROBOT_LOCALPARTS = re.compile(
    r"^(mailer-daemon|postmaster|no-?reply|do-?not-?reply|bounces?)([+\-.].*)?$", re.IGNORECASE
)
_REPLY_PREFIX = re.compile(r"^\s*((re|aw|sv|antw)\s*(\[\d+\])?\s*:\s*)+", re.IGNORECASE)
# Attribution lines ("On … wrote:", "Le … a écrit :", "Am … schrieb …:", "Ann <a@b> wrote:"),
# each matched in time linear in the line (no two unbounded runs that can overlap).
_ATTRIBUTION = re.compile(r"(on|le)\s.+\s(wrote|a écrit\s?):", re.IGNORECASE)
_SCHRIEB = re.compile(r"am\s.+?\sschrieb\s", re.IGNORECASE)
_NAMED_WROTE = re.compile(r"\s<[^<>]+>\s+wrote:$", re.IGNORECASE)
_ORIGINAL = re.compile(
    r"^\s*(-{2,}\s*(original message|forwarded message|ursprüngliche nachricht)\s*-{2,}"
    r"|_{10,})\s*$",
    re.IGNORECASE,
)
_OUTLOOK_FROM = re.compile(r"^\s*\**from:\**\s.+$", re.IGNORECASE)
_SENT_LINE = re.compile(r"^\s*\**(sent|date):\**\s.+$", re.IGNORECASE)
_MOBILE_SIGNATURE = re.compile(r"^\s*sent from my \w+", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class MailFile:
    """An attachment of a received mail, still in memory."""

    filename: str
    mime_type: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ReceivedMail:
    """A received mail, normalized, with the files still to be written to disk."""

    message: InboundMessage
    files: tuple[MailFile, ...] = ()
    too_large: tuple[str, ...] = ()
    """Names of attachments over the size limit (left out)."""
    references: tuple[str, ...] = ()
    """The thread so far, oldest first, ending with this mail's own id (for a reply)."""


@dataclass(frozen=True, slots=True)
class ThreadState:
    """What a reply in one conversation needs: the subject and the mail being answered."""

    subject: str
    message_id: str
    references: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form for the checkpoint store."""
        return {"subject": self.subject, "id": self.message_id, "refs": list(self.references)}

    @classmethod
    def from_json(cls, data: Any) -> ThreadState | None:
        """The state stored by `to_json`, or None when `data` is not one."""
        if not isinstance(data, dict):
            return None
        subject, message_id, refs = data.get("subject"), data.get("id"), data.get("refs")
        if not isinstance(subject, str) or not isinstance(message_id, str):
            return None
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            refs = []
        return cls(subject, message_id, tuple(refs))


MAX_STRUCTURED = 998
"""Characters of a structured header (an address, a MIME parameter list, an id, a date) the
standard library's parser is given: its parsers of these are quadratic or worse on hostile
input (a 20,000-character `From` of quotes takes 40 s). RFC 5322's line limit."""
_STRUCTURED = frozenset(
    {"from", "sender", "reply-to", "to", "cc", "bcc", "message-id", "date", "mime-version"}
    | {"content-type", "content-disposition", "content-transfer-encoding"}
    | {f"resent-{name}" for name in ("from", "sender", "to", "cc", "bcc", "message-id", "date")}
)


class HeaderTooLong(ValueError):
    """A structured header over MAX_STRUCTURED characters: the mail is not read."""


class _BoundedPolicy(EmailPolicy):
    """`policy.default`, refusing to parse a structured header over MAX_STRUCTURED."""

    def header_fetch_parse(self, name: str, value: str) -> Any:
        if len(value) > MAX_STRUCTURED and name.lower() in _STRUCTURED:
            raise HeaderTooLong(f"a {name} header of {len(value)} characters")
        return super().header_fetch_parse(name, value)


_POLICY = _BoundedPolicy()


def parse(data: bytes) -> EmailMessage:
    """The mail in `data` (RFC 5322 bytes) with the modern `email` API. Reading a structured
    header longer than MAX_STRUCTURED (also while parsing) raises HeaderTooLong."""
    message = BytesParser(policy=_POLICY).parsebytes(data)
    assert isinstance(message, EmailMessage)
    return message


def bare_id(value: str | None) -> str:
    """A Message-ID without angle brackets and whitespace; '' when there is none."""
    if not value:
        return ""
    match = re.search(r"<([^<>\s]+)>", value)
    return match.group(1) if match else value.strip().strip("<>").strip()


def id_list(value: str | None) -> list[str]:
    """The Message-IDs of a References / In-Reply-To header, in order."""
    if not value:
        return []
    found = re.findall(r"<([^<>\s]+)>", str(value))
    return found or [v for v in str(value).split() if v]


def sender_of(message: EmailMessage) -> tuple[str, str]:
    """(address lowercased, display name) of the mail's author (From, else Sender)."""
    raw = {name.strip().lower(): value for name, value in reversed(list(message.raw_items()))}
    for header in ("from", "sender"):
        value = raw.get(header)
        if value is None:
            continue
        if len(value) > MAX_STRUCTURED:  # read raw here, so bounded here as the policy does
            raise HeaderTooLong(f"a {header} header of {len(value)} characters")
        address = _one_address(value.replace("\r", "").replace("\n", ""))
        if not address:
            return "", ""
        name, decoded = parseaddr(str(message.get(header)))
        return address, (name.strip() if decoded.strip().lower() == address else "")
    return "", ""


def _one_address(value: str) -> str:
    """The one address of a raw From/Sender value, lowercased; '' when it names none, more
    than one, or reads two ways (`boss@example.com <att@evil.com>`: the standard library
    takes the first, a mail server the bracketed one, which its DKIM and SPF vouch for)."""
    found = [addr for _, addr in getaddresses([value]) if addr]
    if len(found) != 1 or "@" not in found[0]:
        return ""
    address = found[0].strip().lower()
    bracketed = re.findall(r"<([^<>]*)>", value)
    if len(bracketed) > 1 or (bracketed and bracketed[0].strip().lower() != address):
        return ""
    if not bracketed and "<" in value:
        return ""
    return address


def thread_root(message: EmailMessage) -> str:
    """The id of the mail that started this thread."""
    references = id_list(message.get("References"))
    if references:
        return references[0]
    reply_to = id_list(message.get("In-Reply-To"))
    if reply_to:
        return reply_to[0]
    return bare_id(message.get("Message-ID"))


def thread_references(message: EmailMessage) -> tuple[str, ...]:
    """References for a reply to `message`: its own, then its id; trimmed to MAX_REFERENCES."""
    refs = id_list(message.get("References")) or id_list(message.get("In-Reply-To"))
    own = bare_id(message.get("Message-ID"))
    if own and own not in refs:
        refs.append(own)
    return trim_references(refs)


def trim_references(refs: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The root and the most recent ids, at most MAX_REFERENCES of them."""
    if len(refs) <= MAX_REFERENCES:
        return tuple(refs)
    return (refs[0], *refs[len(refs) - MAX_REFERENCES + 1 :])


def automated(message: EmailMessage, own_address: str) -> str | None:
    """Why this mail must not be answered (it is Herald's own, a bounce, automatic or bulk
    mail), or None for a mail a person wrote."""
    sender, _ = sender_of(message)
    if not sender:
        return "no sender address"
    if sender == own_address.lower():
        return "mail from Herald's own address"
    if bare_id(message.get("Message-ID")).startswith(HERALD_ID_PREFIX):
        return "Herald's own mail came back"
    local = sender.partition("@")[0]
    if _ROBOT_LOCALPARTS.match(local):
        return f"automatic sender {sender}"
    return_path = message.get("Return-Path")
    if return_path is not None and str(return_path).strip() in ("<>", ""):
        return "a bounce (empty Return-Path)"
    if message.get_content_type() == "multipart/report":
        return "a delivery or read report"
    auto = (re.split(r"[;(\s]", str(message.get("Auto-Submitted", "no")).strip()) or ["no"])[0]
    auto = auto.lower() or "no"
    if auto != "no":
        return f"Auto-Submitted: {auto}"
    precedence = str(message.get("Precedence", "")).strip().lower()
    if precedence in _BULK_PRECEDENCE:
        return f"Precedence: {precedence}"
    for header in (*_LIST_HEADERS, *_AUTO_HEADERS):
        if message.get(header) is not None:
            return f"{header} header"
    return None


def authenticated(
    message: EmailMessage, sender: str, authserv_id: str, received_above: int = 0
) -> bool:
    """Whether the receiving server's Authentication-Results (authserv-id `authserv_id`,
    above the trace headers: see `adapters/email/authres.py`) say `dkim=pass` or `spf=pass`
    for the sender's domain (or a subdomain of it)."""
    domain = sender.rpartition("@")[2].lower()
    if not domain:
        return False
    results = authres.trusted(message.raw_items(), authserv_id, received_above)
    return authres.passes_for(results, domain)


def _is_attribution(line: str) -> bool:
    """Whether a (stripped) line introduces a quote: "On … wrote:" and its kin."""
    if not line.endswith(":"):
        return False
    return (
        _ATTRIBUTION.fullmatch(line) is not None
        or _SCHRIEB.match(line) is not None
        or ((found := _NAMED_WROTE.search(line)) is not None and found.start() > 0)
    )


class _TextExtractor(HTMLParser):
    """Visible text of an HTML mail: paragraphs and line breaks kept, scripts and styles
    dropped, links written `text (url)`, list items as bullets."""

    BLOCKS = frozenset(
        {"p", "div", "br", "tr", "li", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol"}
        | {"blockquote", "pre", "hr", "section", "article", "header", "footer"}
    )
    HIDDEN = frozenset({"script", "style", "head", "title", "template"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0
        self.quote_depth = 0
        self.links: list[str | None] = []
        self.pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.HIDDEN:
            self.hidden += 1
        elif tag == "blockquote":
            self.quote_depth += 1
            self.parts.append("\n")
        elif tag == "br":
            self.parts.append("\n")
        elif tag == "li":
            self.parts.append("\n• ")
        elif tag == "pre":
            self.pre += 1
            self.parts.append("\n")
        elif tag in self.BLOCKS:
            self.parts.append("\n")
        elif tag == "a":
            self.links.append(dict(attrs).get("href"))
        if tag in ("p", "div", "h1", "h2", "h3", "table"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag == "blockquote":
            self.quote_depth = max(0, self.quote_depth - 1)
            self.parts.append("\n")
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
            self.parts.append("\n")
        elif tag == "li":
            pass  # the next item (or the list's end) starts the next line
        elif tag == "a" and self.links:
            href = self.links.pop()
            if href and href.startswith(("http://", "https://", "mailto:")):
                self.parts.append(f" ({href.removeprefix('mailto:')})")
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self.hidden:
            return
        text = data if self.pre else re.sub(r"\s+", " ", data)
        if self.quote_depth:
            text = text.replace("\n", "\n> ")
            if not self.parts or self.parts[-1].endswith("\n"):
                text = "> " + text.lstrip()
        self.parts.append(text)


_LONE_LT = re.compile(r"<(?![A-Za-z/!?][^<>]*>)")
"""A `<` that does not open a complete tag before the next `<` (the lookahead stops there, so
finding them all is linear)."""


def html_to_text(source: str) -> str:
    """Readable plain text for an HTML body.

    Every `<` that does not start a complete tag is escaped first: the standard library's
    HTMLParser rescans the rest of the document for each unfinished tag (quadratic)."""
    extractor = _TextExtractor()
    extractor.feed(_LONE_LT.sub("&lt;", source))
    extractor.close()
    lines = [line.strip() for line in "".join(extractor.parts).splitlines()]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def body_text(message: EmailMessage) -> str:
    """The mail's text: its text/plain part, else its text/html part converted."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    assert isinstance(part, EmailMessage)
    try:
        content = part.get_content()
    except (LookupError, UnicodeError):
        payload = part.get_payload(decode=True)
        content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    if not isinstance(content, str):
        return ""
    if part.get_content_type() == "text/html":
        return html_to_text(content)
    return content.replace("\r\n", "\n")


def strip_quoted(text: str) -> str:
    """The new part of a reply: quoted history (`>` lines and what follows an attribution
    like "On … wrote:"), forwarded/original blocks and the signature (after `-- `) removed.

    A text that would come out empty is returned whole (it was all quote, so keep it).
    """
    lines = text.replace("\r\n", "\n").split("\n")
    kept: list[str] = []
    for i, line in enumerate(lines):
        stripped = line.rstrip()
        if stripped == "--" or _ORIGINAL.match(line) or _MOBILE_SIGNATURE.match(line):
            break
        if _is_attribution(line.strip()):
            break
        # "On Mon, 1 Jan 2026 at 10:00, Ann <ann@example.com>" wrapped onto two lines.
        if (
            line.strip().lower().startswith("on ")
            and i + 1 < len(lines)
            and lines[i + 1].strip().lower().endswith("wrote:")
        ):
            break
        if _OUTLOOK_FROM.match(line) and any(
            _SENT_LINE.match(following) for following in lines[i + 1 : i + 4]
        ):
            break
        if line.lstrip().startswith(">"):
            continue
        kept.append(stripped)
    result = "\n".join(kept).strip()
    return result or text.strip()


def attachments_of(message: EmailMessage) -> list[tuple[str, str, bytes]]:
    """(filename, MIME type, bytes) of each attachment, in order, then the inline images
    of an HTML body (`multipart/related`) the attachments do not include."""
    out: list[tuple[str, str, bytes]] = []
    parts = list(message.iter_attachments())
    known = {id(p) for p in parts}
    parts += [
        p
        for p in message.walk()
        if p.get_content_maintype() == "image" and not p.is_multipart() and id(p) not in known
    ]
    for index, part in enumerate(parts):
        if not isinstance(part, EmailMessage) or part.is_multipart():
            continue
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes):
            continue
        filename = part.get_filename() or f"attachment-{index + 1}"
        out.append((filename, part.get_content_type(), data))
    return out


def received_at(message: EmailMessage, fallback: datetime) -> datetime:
    """When the mail was written (its Date header, UTC), or `fallback`."""
    value = message.get("Date")
    try:
        when = getattr(value, "datetime", None)
    except (AttributeError, ValueError, TypeError):
        when = None
    if not isinstance(when, datetime):
        return fallback
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC)


def header_block(data: bytes) -> bytes:
    """The header block of a mail (up to and including the blank line ending it)."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := data.find(sep)) >= 0]
    return data[: min(ends)] if ends else data


def over_limits(data: bytes, config: EmailConfig) -> str | None:
    """Why the mail in `data` is too much to read (a line longer than `max_line_bytes`, more
    than `max_parts` MIME parts), or None. Looks at the bytes only, in linear time, so it
    is safe to run before any parsing."""
    longest = max(map(len, data.split(b"\n")), default=0)
    if longest > config.max_line_bytes:
        return f"a line of {longest} bytes (limit {config.max_line_bytes})"
    if _parts_upper_bound(data) > config.max_parts:
        return f"more than {config.max_parts} MIME parts"
    return None


_BOUNDARY = re.compile(
    rb'boundary(\*[0-9*]{0,8})?\s*=\s*(?:"([^"\r\n]{1,200})"|([^"\s;]{1,200}))', re.IGNORECASE
)
_DASH_LINE = re.compile(rb"^--([^\r\n]{0,202})", re.MULTILINE)


def _parts_upper_bound(data: bytes) -> int:
    """At least the number of MIME parts of `data`: its opening boundary delimiter lines
    (every line starting with `--` when a boundary is given in RFC 2231's encoded form)."""
    boundaries: set[bytes] = set()
    encoded = False
    for found in _BOUNDARY.finditer(data):
        encoded = encoded or found.group(1) is not None
        boundaries.add((found.group(2) or found.group(3) or b"").rstrip(b" \t"))
    if not boundaries:
        return 0
    count = 0
    for line in _DASH_LINE.finditer(data):
        text = line.group(1).rstrip(b" \t")
        if encoded or text in boundaries:  # `--b--`, the closing one, opens no part
            count += 1
    return count


def shape(message: EmailMessage) -> tuple[int, int]:
    """(MIME parts, nesting depth) of a parsed mail; the mail itself is part 1 at depth 1."""
    parts, deepest = 0, 0
    stack: list[tuple[Any, int]] = [(message, 1)]
    while stack:
        part, depth = stack.pop()
        parts += 1
        deepest = max(deepest, depth)
        payload = part.get_payload() if part.is_multipart() else None
        if isinstance(payload, list):
            stack.extend((child, depth + 1) for child in payload)
    return parts, deepest


def _refusal(message: EmailMessage, sender: str, config: EmailConfig) -> str | None:
    """Why this mail must not reach the agent (see `to_received`), or None."""
    froms = sum(1 for name, _ in message.raw_items() if name.strip().lower() == "from")
    if froms > 1:
        # RFC 5322 allows one; a second one on top of a signed mail would borrow its DKIM pass.
        return f"{froms} From headers"
    refused = automated(message, config.address)
    if refused is None and config.require_authentication_results:
        authserv_id = config.authserv_id or ""
        if not authenticated(message, sender, authserv_id, config.received_above_results):
            refused = f"no passing DKIM or SPF result from {authserv_id} for the sender's domain"
    return refused


def to_received(
    data: bytes,
    *,
    config: EmailConfig,
    account: AccountId,
    uidvalidity: int,
    uid: int,
    now: datetime,
    unread: str | None = None,
) -> ReceivedMail:
    """Normalize one fetched mail (or only its header block). Odd mail does not raise: what
    cannot be read is left out (the standard library's parser may still trip over badly
    broken mail; the adapter records such a mail as unreadable).

    Automatic mail (see `automated`), with `require_authentication_results` mail without a
    passing DKIM/SPF result, mail over the limits (`over_limits`, `max_parts`, `max_depth`)
    and mail refused by the caller (`unread`: its body is not read) are still returned, with
    the reason under `raw["refused"]`, so the inbox records them as rejected and no one
    answers them. Such a mail's text is its subject only when it was not read.
    """
    too_much = unread or over_limits(data, config)
    if too_much is not None:
        data = header_block(data)
    message = parse(data)
    if too_much is None:
        parts, depth = shape(message)
        if parts > config.max_parts:
            too_much = f"more than {config.max_parts} MIME parts"
        elif depth > config.max_depth:
            too_much = f"MIME parts nested {depth} deep (limit {config.max_depth})"
    sender, name = sender_of(message)
    own_id = bare_id(message.get("Message-ID"))
    key = own_id or f"{NO_MESSAGE_ID}{uidvalidity}:{uid}"
    subject = str(message.get("Subject", "")).strip()
    refused = _refusal(message, sender, config)
    if too_much is not None:
        refused = too_much if unread else f"mail not read: {too_much}"
    text = strip_quoted(body_text(message)) if too_much is None else ""
    files: list[MailFile] = []
    too_large: list[str] = []
    if refused is None:
        for filename, mime, payload in attachments_of(message):
            if len(payload) > config.attachment_max_bytes:
                too_large.append(filename)
            else:
                files.append(MailFile(filename, mime, payload))
    if too_large:
        limit = config.attachment_max_bytes
        notes = [f"[attachment {n} left out: larger than {limit} bytes]" for n in too_large]
        text = "\n".join([text, *notes]) if text else "\n".join(notes)
    if subject and text and config.session_by is SessionBy.SENDER:
        text = f"Subject: {subject}\n\n{text}"
    elif subject and not text:
        text = subject
    thread = (thread_root(message) or key) if config.session_by is SessionBy.THREAD else None
    raw: dict[str, Any] = {"uid": uid, "uidvalidity": uidvalidity}
    if subject:
        raw[SUBJECT] = subject
    if refused is not None:
        raw[REFUSED] = refused
    reply_to = id_list(message.get("In-Reply-To"))
    inbound = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(sender or "unknown"),
        sender=Sender(ExternalUserId(sender or "unknown"), name, is_bot=refused is not None),
        text=text,
        platform_message_id=PlatformMessageId(key),
        is_direct=True,
        mentions_bot=True,
        thread_id=ThreadId(thread) if thread else None,
        reply_to=PlatformMessageId(reply_to[0]) if reply_to else None,
        received_at=received_at(message, now),
        raw=raw,
    )
    return ReceivedMail(inbound, tuple(files), tuple(too_large), thread_references(message))


def is_address(value: str) -> bool:
    """Whether `value` is one plain address (`local@domain`) a mail can be sent to."""
    return re.fullmatch(r"[^@\s<>(),;:\"\[\]]+@[A-Za-z0-9.\-]+\.[A-Za-z0-9\-]+", value) is not None


def unreadable(account: AccountId, uidvalidity: int, uid: int, reason: str) -> ReceivedMail:
    """A stand-in for a mail that could not be read at all, refused with `reason`."""
    key = f"{NO_MESSAGE_ID}{uidvalidity}:{uid}"
    message = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId("unknown"),
        sender=Sender(ExternalUserId("unknown"), is_bot=True),
        text="",
        platform_message_id=PlatformMessageId(key),
        raw={"uid": uid, "uidvalidity": uidvalidity, REFUSED: reason},
    )
    return ReceivedMail(message)


def reply_subject(subject: str) -> str:
    """`Re: <subject>` without piling up prefixes."""
    base = _REPLY_PREFIX.sub("", subject).strip()
    return f"Re: {base}" if base else "Re: your message"


@functools.cache
def _markdown() -> MarkdownIt:
    # Raw HTML in the agent's Markdown is shown as text, never passed into the mail.
    return MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])


def markdown_to_html(markdown: str) -> str:
    """A small HTML document for the text/html part of a reply."""
    body = _markdown().render(markdown)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head>'
        f'<body style="font-family: sans-serif;">\n{body}</body></html>\n'
    )


def new_message_id(address: str) -> str:
    """A fresh Message-ID (with brackets) in Herald's form, on the domain of `address`."""
    domain = address.rpartition("@")[2] or "herald.invalid"
    return make_msgid(idstring=None, domain=domain).replace("<", "<" + HERALD_ID_PREFIX, 1)


def build_reply(
    *,
    config: EmailConfig,
    to: str,
    text: str,
    markdown: bool,
    state: ThreadState | None,
    in_reply_to: str | None,
    message_id: str,
    now: datetime,
) -> EmailMessage:
    """A mail from Herald to `to`: text/plain and (for Markdown) text/html alternatives,
    threaded under `in_reply_to` (else the state's last mail) with References, marked
    `Auto-Submitted: auto-replied`. Attachments are added by the caller."""
    mail = EmailMessage(policy=policy.SMTP)
    mail["From"] = Address(config.display_name, addr_spec=config.address)
    to_name, to_addr = parseaddr(to)
    mail["To"] = Address(to_name, addr_spec=to_addr or to)
    parent = in_reply_to or (state.message_id if state else None)
    if state is not None:
        mail["Subject"] = reply_subject(state.subject)
        refs = list(state.references)
    else:
        mail["Subject"] = f"Message from {config.display_name}"
        refs = []
    if parent:
        if parent not in refs:
            refs.append(parent)
        mail["In-Reply-To"] = f"<{parent}>"
    if refs:
        mail["References"] = " ".join(f"<{r}>" for r in trim_references(refs))
    mail["Message-ID"] = message_id
    mail["Date"] = format_datetime(now.astimezone(UTC))
    mail["Auto-Submitted"] = "auto-replied"
    mail["X-Auto-Response-Suppress"] = "All"
    mail.set_content(text if text.endswith("\n") else text + "\n")
    if markdown:
        mail.add_alternative(markdown_to_html(text), subtype="html")
    return mail


def recipients(mail: EmailMessage) -> list[str]:
    """The addresses a built mail goes to."""
    return [addr for _, addr in getaddresses([str(v) for v in mail.get_all("To") or ()]) if addr]
