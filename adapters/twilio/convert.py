"""Twilio's webhook forms ⇄ Herald's messages, and Markdown → SMS / WhatsApp text. Pure.

Inbound messages come as `application/x-www-form-urlencoded` posts (`MessageSid`, `From`,
`To`, `Body`, `NumMedia`, `MediaUrl0`…, `ProfileName` on WhatsApp, `OptOutType` with Advanced
Opt-Out); delivery reports as posts with `MessageSid` and `MessageStatus` (`ErrorCode` on a
failure). A chat is the sender's address: `+15551234567` by SMS, `whatsapp:+15551234567` by
WhatsApp; one session per address.

Outbound: SMS is plain text (Markdown markers removed, words kept: `markdown_to_plain`);
WhatsApp keeps its own styles (`*bold*`, `_italic_`, `~strike~`, ```` ```mono``` ````). Either
is cut into parts of at most `MAX_PART` characters at paragraph, line or sentence breaks.
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from urllib.parse import parse_qsl

from adapters.inbound import Skipped
from adapters.markdown import Mark, Options, Run, link_text, normalize, quote_lines, render
from adapters.markdown import parser as markdown_parser
from adapters.twilio import PLATFORM
from adapters.twilio.config import E164, WHATSAPP
from gateway.chunking import markdown_to_plain, split_chunks
from gateway.contracts.errors import (
    AuthError,
    HeraldError,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.ids import AccountId, ChatId, ExternalUserId, PlatformMessageId
from gateway.contracts.messages import InboundMessage, Sender

MAX_PART = 1600
"""Longest message body Twilio takes (characters); longer replies go out in parts."""
MAX_MEDIA = 10
"""Most media one message carries (`MediaUrl0` … `MediaUrl9`)."""


class Keyword(StrEnum):
    """Twilio's standard messaging keywords, by what they do."""

    STOP = "stop"
    START = "start"
    HELP = "help"


KEYWORDS: Mapping[str, Keyword] = {
    **dict.fromkeys(
        ("STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT"),
        Keyword.STOP,
    ),
    **dict.fromkeys(("START", "YES", "UNSTOP"), Keyword.START),
    **dict.fromkeys(("HELP", "INFO"), Keyword.HELP),
}
"""A message that is one of these words (any case, surrounding spaces and `.!` ignored)."""


@dataclass(frozen=True, slots=True)
class MediaRef:
    """One file of an MMS or WhatsApp message, to download with the account's credentials."""

    url: str
    mime_type: str
    filename: str


@dataclass(frozen=True, slots=True)
class Incoming:
    """An inbound message, the media to download for it, and its keyword if it is one."""

    message: InboundMessage
    media: tuple[MediaRef, ...] = ()
    keyword: Keyword | None = None


@dataclass(frozen=True, slots=True)
class StatusReport:
    """A delivery report: the message's sid, its status and, on a failure, what went wrong."""

    message_sid: str
    status: str
    error: str | None = None


ERROR_TEXT: Mapping[str, str] = {
    "21211": "invalid 'To' number",
    "21408": "sending to this region is not enabled",
    "21610": "the recipient replied STOP (unsubscribed)",
    "21612": "the 'To' number cannot be reached from the 'From' number",
    "21614": "the 'To' number is not a mobile number",
    "30003": "unreachable destination handset",
    "30004": "message blocked",
    "30005": "unknown destination handset",
    "30006": "landline or unreachable carrier",
    "30007": "filtered by the carrier",
    "30008": "unknown error",
}
PERMANENT_CODES = frozenset({21211, 21408, 21610, 21612, 21614, 21606, 21659, 63003, 63016})
"""Error codes after which a send can never succeed as it is."""
OPTED_OUT_CODE = 21610


def parse_form(body: bytes) -> list[tuple[str, str]]:
    """The fields of a form body, in order, repeats kept. Raises ValueError when the body is
    not UTF-8 or not a form."""
    text = body.decode("utf-8")
    return parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text), max_num_fields=500)


def keyword(body: str, opt_out_type: str | None = None) -> Keyword | None:
    """The keyword a message is: Twilio's `OptOutType` when it sent one, else the body."""
    if opt_out_type:
        try:
            return Keyword(opt_out_type.strip().lower())
        except ValueError:
            pass
    return KEYWORDS.get(body.strip().strip(".!").strip().upper())


def is_address(chat: str) -> bool:
    """Whether `chat` is a number Twilio can send to: E.164, or `whatsapp:` and E.164."""
    return bool(E164.match(chat.removeprefix(WHATSAPP)))


def _media(form: Mapping[str, str], key: str) -> tuple[MediaRef, ...] | Skipped:
    try:
        count = int(form.get("NumMedia") or "0")
    except ValueError:
        return Skipped("NumMedia is not a number")
    if not 0 <= count <= MAX_MEDIA:
        return Skipped(f"NumMedia {count} is out of range")
    refs: list[MediaRef] = []
    for i in range(count):
        url = form.get(f"MediaUrl{i}")
        if not url or not url.startswith(("https://", "http://")):
            return Skipped(f"MediaUrl{i} is missing")
        mime = (form.get(f"MediaContentType{i}") or "application/octet-stream").strip().lower()
        ext = mimetypes.guess_extension(mime.split(";")[0]) or ".bin"
        refs.append(MediaRef(url, mime, f"{key}-{i}{ext}"))
    return tuple(refs)


def to_inbound(form: Mapping[str, str], *, account: AccountId, now: datetime) -> Incoming | Skipped:
    """The message a webhook form carries (one session per sender address)."""
    sid = form.get("MessageSid") or form.get("SmsMessageSid") or form.get("SmsSid")
    sender = (form.get("From") or "").strip()
    if not sid:
        return Skipped("no MessageSid")
    if not is_address(sender):
        return Skipped(f"From {sender!r} is not a phone number")
    media = _media(form, sid)
    if isinstance(media, Skipped):
        return media
    body = form.get("Body") or ""
    message = InboundMessage(
        platform=PLATFORM,
        account=account,
        chat_id=ChatId(sender),
        sender=Sender(ExternalUserId(sender), (form.get("ProfileName") or "").strip()),
        text=body,
        platform_message_id=PlatformMessageId(sid),
        is_direct=True,
        received_at=now,
        raw=dict(form),
    )
    found = keyword(body, form.get("OptOutType")) if not media else None
    return Incoming(message, media, found)


def to_status(form: Mapping[str, str]) -> StatusReport | Skipped:
    """The delivery report a status callback form carries."""
    sid = form.get("MessageSid") or form.get("SmsSid")
    status = (form.get("MessageStatus") or form.get("SmsStatus") or "").strip().lower()
    if not sid or not status:
        return Skipped("no MessageSid or MessageStatus")
    code = (form.get("ErrorCode") or "").strip()
    error = None
    if code and code != "0":
        error = f"twilio {status}: error {code}"
        text = form.get("ErrorMessage") or ERROR_TEXT.get(code)
        if text:
            error += f" ({text})"
    elif status in ("failed", "undelivered"):
        error = f"twilio {status}"
    return StatusReport(sid, status, error)


def error_from(status: int, code: int | None, message: str, what: str) -> HeraldError:
    """The Herald error for a Twilio REST error answer."""
    detail = f"twilio: {what}: HTTP {status}" + (f", error {code}" if code else "")
    detail += f": {message}" if message else ""
    if status == 429 or code == 20429:
        return RateLimited(1.0, detail)
    if status == 401 or code == 20003:
        return AuthError(detail)
    if status >= 500:
        return NotReady(detail)
    if code in PERMANENT_CODES or 400 <= status < 500:
        return PermanentSendError(detail)
    return NotReady(detail)


# --- Markdown → text ----------------------------------------------------------------------------


def to_sms(markdown: str) -> str:
    """Readable plain text: markers removed, every word kept, links as `text (url)`."""
    return markdown_to_plain(normalize(markdown)).strip()


_OPTIONS = Options(
    linkable=re.compile(r"(?:https?://[^\s/?#]|mailto:\S)", re.IGNORECASE),
    languages=False,
    link_break=" ",
    measure=len,
    table_overhead=6,
)
_STYLE = {"b": "*", "i": "_", "s": "~"}
_FENCE = "```"


def to_whatsapp(markdown: str) -> str:
    """WhatsApp text: `*bold*`, `_italic_`, `~strike~`, ```` ```mono``` ````, `> ` quotes,
    links as `text (url)`; plain text (`to_sms`) if the Markdown cannot be rendered."""
    try:
        runs = render(normalize(markdown), _OPTIONS, md=markdown_parser()).runs
        text = _write(runs).strip()
    # A renderer bug must degrade to plain text, never lose the answer.
    except Exception:
        return to_sms(markdown)
    return text if text or not markdown.strip() else to_sms(markdown)


def _write(runs: Sequence[Run]) -> str:
    lines: list[str] = []
    for line, quoted in quote_lines(runs):
        out: list[str] = []
        link: tuple[str, str] | None = None  # (url, label so far) of the link being written
        for run in line:
            marks = [m for m in run.marks if m.kind != "quote"]
            url = next((m.arg for m in marks if m.kind == "a"), None)
            if link is not None and url != link[0]:
                out.append(_link_end(*link))
                link = None
            if url is not None:
                link = (url, (link[1] if link else "") + run.text)
                if not run.text.strip():
                    continue
            out.append(_styled(run.text, marks))
        if link is not None:
            out.append(_link_end(*link))
        text = "".join(out)
        lines.append(("> " + text if text else ">") if quoted else text)
    return "\n".join(lines)


def _link_end(url: str, label: str) -> str:
    """What follows a link's text: its URL in brackets, unless the text is the URL."""
    shown = link_text(url)
    return f" ({shown})" if label.strip() and label.strip() != shown else ""


def _styled(text: str, marks: Sequence[Mark]) -> str:
    kinds = [m.kind for m in marks]
    if "pre" in kinds:
        return f"{_FENCE}{text.rstrip(chr(10))}{_FENCE}"
    if "code" in kinds:
        return f"{_FENCE}{text}{_FENCE}" if text.strip() else text
    core = text.strip()
    if not core:
        return text
    lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
    opening = "".join(_STYLE[k] for k in kinds if k in _STYLE)
    return lead + opening + core + opening[::-1] + trail


def parts(text: str, limit: int = MAX_PART) -> list[str]:
    """`text` in parts of at most `limit` characters, cut at paragraph, line or sentence
    breaks where possible; [] for blank text."""
    return split_chunks(text, limit)
