"""The fake Slack's constants, records of what it saw and sent, its inner state and request
parameters."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from starlette.requests import Request

from tests.fakes.params import Params, Part, read_params

JSON = dict[str, Any]

DEFAULT_BOT_TOKEN = "xoxb-1-herald-bot-token"
DEFAULT_APP_TOKEN = "xapp-1-A1-herald-app-token"
DEFAULT_SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
DEFAULT_USER = "U0HUMAN01"
"""The user of injected messages unless told otherwise."""
MAX_TEXT_LENGTH = 40_000
"""Longest `text` chat.postMessage / chat.update take (`msg_too_long` beyond)."""
DEFAULT_ACK_TIMEOUT = 3.0
"""Seconds Slack waits for a Socket Mode ack (and for an Events API answer)."""
DEFAULT_MAX_RETRIES = 3
"""Redeliveries of an unacknowledged event before Slack gives up."""
STALE_AFTER = 300
"""Seconds after which a signed request is stale (bolt and SignatureVerifier refuse it)."""
MAX_WAIT = 60.0
"""Longest `/control/wait` the server grants, in seconds."""

_CHANNEL_ID = re.compile(r"^[CDG][A-Z0-9]+$")
_USER_ID = re.compile(r"^[UW][A-Z0-9]+$")
_REACTION = re.compile(r"^[a-z0-9_+'\-]+(::skin-tone-[2-6])?$")
_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

ChannelKind = Literal["im", "channel", "group", "mpim"]
Stage = Literal["open", "handshake"]


# -- records --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One Web API request (any token, faulted ones included), parameters as decoded."""

    method: str
    params: JSON
    token: str | None
    received_at: float
    """`time.monotonic()` when the server read it."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """A Web API request answered with an error (a fault, a bad token or a bad request)."""

    method: str
    status: int
    error: str
    params: JSON
    received_at: float


@dataclass(frozen=True, slots=True)
class Posted:
    """One accepted chat.postMessage."""

    channel: str
    ts: str
    text: str
    thread_ts: str | None
    reply_broadcast: bool
    mrkdwn: bool
    blocks: Any
    """The blocks as sent (decoded), None without."""
    params: JSON
    received_at: float


@dataclass(frozen=True, slots=True)
class Updated:
    """One accepted chat.update."""

    channel: str
    ts: str
    text: str
    params: JSON
    received_at: float


@dataclass(frozen=True, slots=True)
class Deleted:
    """One accepted chat.delete."""

    channel: str
    ts: str
    received_at: float


@dataclass(frozen=True, slots=True)
class ReactionChange:
    """One accepted reactions.add or reactions.remove."""

    action: Literal["add", "remove"]
    channel: str
    timestamp: str
    name: str
    received_at: float


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file the server serves: registered by a test (`add_file`) or uploaded by the bot."""

    id: str
    name: str
    title: str
    mimetype: str
    content: bytes
    user: str
    url_private: str
    url_private_download: str
    created: int

    def to_json(self) -> JSON:
        """The file object of message events and files.* answers."""
        filetype = self.name.rsplit(".", 1)[-1].lower() if "." in self.name else "binary"
        return {
            "id": self.id,
            "created": self.created,
            "timestamp": self.created,
            "name": self.name,
            "title": self.title,
            "mimetype": self.mimetype,
            "filetype": filetype,
            "pretty_type": filetype.upper(),
            "user": self.user,
            "user_team": "",
            "editable": False,
            "size": len(self.content),
            "mode": "hosted",
            "is_external": False,
            "external_type": "",
            "is_public": False,
            "public_url_shared": False,
            "display_as_bot": False,
            "username": "",
            "url_private": self.url_private,
            "url_private_download": self.url_private_download,
            "permalink": f"{self.url_private}#permalink",
            "is_starred": False,
            "has_rich_preview": False,
            "file_access": "visible",
        }


@dataclass(frozen=True, slots=True)
class Upload:
    """One file the bot uploaded and completed (files_upload_v2)."""

    file_id: str
    filename: str
    title: str
    content: bytes
    channel: str | None
    thread_ts: str | None
    initial_comment: str | None
    ts: str | None
    """The ts of the file's message in `channel` (None when not shared)."""
    received_at: float


@dataclass(frozen=True, slots=True)
class Download:
    """One request for a file's bytes."""

    file_id: str
    authorized: bool
    status: int
    received_at: float


@dataclass(frozen=True, slots=True)
class Injected:
    """What an injection created: the event(s) queued for the app and the message's ts."""

    event_id: str
    """The id of the (first) event: the app_mention's for a mention."""
    ts: str
    """The ts of the message (for an edit or a delete: of the message changed)."""
    channel: str
    event_ids: tuple[str, ...]
    """Every event queued, in delivery order (a mention: app_mention, then message)."""


@dataclass(slots=True)
class Envelope:
    """One Socket Mode envelope sent (each delivery attempt is a new envelope)."""

    envelope_id: str
    event_id: str
    event_type: str
    retry_attempt: int
    retry_reason: str
    socket_id: int
    sent_at: float
    acked_at: float | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """One acknowledgement a client sent.

    `outcome`: "accepted" (acknowledged the event), "duplicate" (the event was acknowledged
    already), "lost" (`ignore_acks` or a silenced socket), "unknown" (no such envelope).
    """

    envelope_id: str
    socket_id: int
    received_at: float
    outcome: Literal["accepted", "duplicate", "lost", "unknown"]


@dataclass(slots=True)
class SocketInfo:
    """One Socket Mode websocket, open or closed."""

    id: int
    ticket: str
    opened_at: float
    closed_at: float | None = None
    close_reason: str | None = None
    """"client_close", "connection_lost", "dropped", "server_close", "server_stop"."""
    silenced: bool = False
    disconnect_reason: str | None = None
    """The reason of the `disconnect` message sent on it, if any."""
    envelopes: int = 0
    """How many envelopes were sent on it."""

    @property
    def open(self) -> bool:
        """Whether the socket is still open (as the server sees it)."""
        return self.closed_at is None


@dataclass(frozen=True, slots=True)
class HttpDelivery:
    """One attempt to POST an event to the Events API URL."""

    event_id: str
    url: str
    retry_num: int
    retry_reason: str
    status: int | None
    """The endpoint's HTTP status; None when the request failed."""
    error: str | None
    """None on a 2xx, else Slack's retry reason ("http_error", "http_timeout", ...)."""
    received_at: float


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """An Events API request as Slack sends it: the exact body bytes and the headers."""

    body: bytes
    headers: dict[str, str]


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    """`X-Slack-Signature` of `body` sent at `timestamp`: `v0=` hex HMAC-SHA256 of
    `v0:{timestamp}:{body}` keyed with the signing secret."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


# -- internals: state -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Channel:
    id: str
    kind: ChannelKind
    name: str | None = None
    is_member: bool = True
    user: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def display_name(self) -> str:
        return self.name or f"channel-{self.id.lower()}"

    def to_json(self) -> JSON:
        channel: JSON = {
            "id": self.id,
            "created": self.created,
            "is_archived": False,
            "is_im": self.kind == "im",
            "is_mpim": self.kind == "mpim",
            "is_channel": self.kind == "channel",
            "is_group": self.kind == "group",
            "is_private": self.kind != "channel",
            "is_member": self.is_member,
            "is_org_shared": False,
            "is_shared": False,
            "is_ext_shared": False,
        }
        if self.kind == "im":
            channel["user"] = self.user or DEFAULT_USER
            channel["is_open"] = True
        else:
            channel["name"] = channel["name_normalized"] = self.display_name
            channel["topic"] = {"value": "", "creator": "", "last_set": 0}
            channel["purpose"] = {"value": "", "creator": "", "last_set": 0}
        return channel


@dataclass(slots=True)
class _User:
    id: str
    name: str
    real_name: str
    display_name: str
    is_bot: bool = False

    def to_json(self, team_id: str) -> JSON:
        return {
            "id": self.id,
            "team_id": team_id,
            "name": self.name,
            "deleted": False,
            "real_name": self.real_name,
            "tz": "Europe/Berlin",
            "tz_label": "Central European Time",
            "tz_offset": 3600,
            "is_admin": False,
            "is_owner": False,
            "is_bot": self.is_bot,
            "is_app_user": False,
            "updated": 1_700_000_000,
            "profile": {
                "real_name": self.real_name,
                "real_name_normalized": self.real_name,
                "display_name": self.display_name,
                "display_name_normalized": self.display_name,
                "first_name": self.real_name.split(" ", 1)[0],
                "team": team_id,
            },
        }


@dataclass(eq=False, slots=True)
class _Event:
    seq: int
    event_id: str
    body: JSON
    kind: str = "events_api"
    """The envelope type: `events_api`, or `interactive` (a button press)."""
    attempts: int = 0
    """Deliveries made so far (the next one's retry_attempt)."""
    acked: bool = False
    expired: bool = False
    envelope_ids: list[str] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False, slots=True)
class _Socket:
    info: SocketInfo
    ws: web.WebSocketResponse
    transport: asyncio.Transport | None
    outbox: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    """Frames to send, in order; None: close the socket (after what was queued before)."""
    ready: bool = False
    retiring: bool = False
    closing: bool = False
    """The server is closing it (`send_disconnect(close_after=...)`)."""
    close_done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def closed(self) -> bool:
        return self.info.closed_at is not None

    @property
    def deliverable(self) -> bool:
        return (
            self.ready
            and not self.closed
            and not self.retiring
            and not self.closing
            and not self.info.silenced
        )


@dataclass(slots=True)
class _Faults:
    """The faults switched on; counters count down per affected request or connection."""

    rate_limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    failures: dict[str, tuple[int, int]] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    ignore_acks: int = 0
    refuse_open: int = 0
    refuse_handshake: int = 0


class _ApiError(Exception):
    """A request the Web API refuses: Slack's `error`, the HTTP status, extra headers."""

    def __init__(
        self, error: str, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.headers = dict(headers or {})


def _random_id(prefix: str, length: int = 10) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def _rich_text(text: str) -> list[JSON]:
    """The `blocks` a Slack client attaches to a typed message (mentions as user elements)."""
    if not text:
        return []
    elements: list[JSON] = []
    position = 0
    for match in _MENTION.finditer(text):
        if match.start() > position:
            elements.append({"type": "text", "text": text[position : match.start()]})
        elements.append({"type": "user", "user_id": match.group(1)})
        position = match.end()
    if position < len(text):
        elements.append({"type": "text", "text": text[position:]})
    section = {"type": "rich_text_section", "elements": elements}
    return [{"type": "rich_text", "block_id": _random_id("", 5), "elements": [section]}]


# -- internals: request parameters ----------------------------------------------------------------


class _Params(Params):
    """A request's parameters: query string, then the body (form, multipart or JSON)."""

    def __init__(self, values: Mapping[str, Any], files: Mapping[str, Part]) -> None:
        super().__init__({k: v for k, v in values.items() if v is not None}, files)

    def decoded(self, key: str) -> Any:
        """The value decoded from JSON when it came as a string (form bodies)."""
        value = self.values.get(key)
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError as err:
            raise _ApiError("invalid_arguments") from err

    def logged(self) -> JSON:
        """The parameters as a test reads them (files described, not included)."""
        return {**self.values, **self.described_files()}


async def _read_params(request: Request) -> _Params:
    values, files = await read_params(
        request,
        max_part_size=64 * 1024 * 1024,
        invalid_json=lambda: _ApiError("invalid_json"),
        not_object=lambda: _ApiError("json_not_object"),
    )
    return _Params(values, files)


_Handler = Callable[[_Params], Awaitable[JSON]]
