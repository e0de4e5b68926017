"""The fake Bot API's constants, records of what it saw and sent, and its request parameters."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.fakes.params import Params, read_params

JSON = dict[str, Any]

MAX_UPDATES = 100
"""Most updates one getUpdates returns (its `limit` caps at this)."""
MAX_POLL_TIMEOUT = 60.0
"""Longest long poll the server grants, in seconds."""
MAX_TEXT_LENGTH = 4096
"""Longest message text, in UTF-16 code units after entity parsing."""
MAX_CAPTION_LENGTH = 1024
"""Longest caption, in UTF-16 code units after entity parsing."""
WEBHOOK_TIMEOUT = 10.0
"""How long the server waits for a webhook's answer."""
DEFAULT_UPDATE_KINDS = frozenset(
    {
        "message",
        "edited_message",
        "channel_post",
        "edited_channel_post",
        "business_connection",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
        "inline_query",
        "chosen_inline_result",
        "callback_query",
        "shipping_query",
        "pre_checkout_query",
        "purchased_paid_media",
        "poll",
        "poll_answer",
        "my_chat_member",
        "chat_join_request",
        "chat_boost",
        "removed_chat_boost",
    }
)
"""Update kinds delivered when `allowed_updates` is unset or empty (as on Telegram)."""
CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)

# Telegram's descriptions, for tests that match them.
CANT_PARSE = "Bad Request: can't parse entities: "
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)
EDIT_NOT_FOUND = "Bad Request: message to edit not found"
REPLY_NOT_FOUND = "Bad Request: message to be replied not found"
TEXT_EMPTY = "Bad Request: message text is empty"
TEXT_TOO_LONG = "Bad Request: message is too long"
CAPTION_TOO_LONG = "Bad Request: message caption is too long"
THREAD_NOT_FOUND = "Bad Request: message thread not found"
CHAT_MIGRATED = "Bad Request: group chat was upgraded to a supergroup chat"
BLOCKED_BY_USER = "Forbidden: bot was blocked by the user"
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete "
    "the webhook first"
)
POLL_CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is "
    "running"
)
REJECTED_MARKUP = "Can't find end of the entity starting at byte offset 0"
"""What `reject_markup()` makes the server answer after `CANT_PARSE`."""


# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Update:
    """One update as getUpdates returns it (`payload` includes `update_id`)."""

    update_id: int
    payload: JSON

    @property
    def kind(self) -> str:
        """The update's type: the first field besides `update_id` (e.g. `message`)."""
        return next((key for key in self.payload if key != "update_id"), "")

    @property
    def message_id(self) -> int | None:
        """The id of the message the update carries, if any."""
        body = self.payload.get(self.kind)
        value = body.get("message_id") if isinstance(body, Mapping) else None
        return value if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class Injected:
    """What `inject_message` created."""

    update_id: int
    chat_id: int
    message_id: int


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file getFile knows: registered by a test or uploaded by the bot."""

    file_id: str
    file_unique_id: str
    file_path: str
    content: bytes
    file_name: str | None = None
    mime_type: str | None = None

    def to_json(self) -> JSON:
        """The File object getFile returns."""
        return {
            "file_id": self.file_id,
            "file_unique_id": self.file_unique_id,
            "file_size": len(self.content),
            "file_path": self.file_path,
        }


@dataclass(frozen=True, slots=True)
class Upload:
    """The file of a sendPhoto / sendDocument: uploaded bytes, a known file_id or a URL."""

    field: str
    source: Literal["upload", "file_id", "url"]
    file_id: str
    filename: str | None
    content_type: str | None
    content: bytes
    """The uploaded bytes (those of the file for a file_id; empty for a URL)."""
    url: str | None = None


@dataclass(frozen=True, slots=True)
class Sent:
    """One message the bot sent (sendMessage, sendPhoto, sendDocument)."""

    method: str
    chat_id: int
    message_id: int
    text: str
    """The text or caption as the bot sent it (markup included)."""
    parse_mode: str | None
    plain_text: str
    """What the user sees: `text` after entity parsing and trimming."""
    entities: tuple[JSON, ...]
    message_thread_id: int | None
    reply_to_message_id: int | None
    disable_notification: bool
    upload: Upload | None
    received_at: float
    """`time.monotonic()` when the server accepted it."""
    reply_markup: JSON | None = None
    """The inline keyboard sent with it, if any."""


@dataclass(frozen=True, slots=True)
class Edit:
    """One accepted editMessageText."""

    chat_id: int
    message_id: int
    text: str
    parse_mode: str | None
    plain_text: str
    entities: tuple[JSON, ...]
    received_at: float


@dataclass(frozen=True, slots=True)
class Action:
    """One accepted sendChatAction."""

    chat_id: int
    action: str
    message_thread_id: int | None
    received_at: float


@dataclass(frozen=True, slots=True)
class ReactionSet:
    """One accepted setMessageReaction: the bot's reactions on a message from then on."""

    chat_id: int
    message_id: int
    emoji: tuple[str, ...]
    """Empty: the bot's reaction taken off."""


@dataclass(frozen=True, slots=True)
class Call:
    """One Bot API request with a valid token, as the server decoded its parameters."""

    method: str
    params: JSON
    received_at: float


@dataclass(frozen=True, slots=True)
class Rejected:
    """A Bot API request answered with an error (a fault or a bad request)."""

    method: str
    status: int
    description: str
    params: JSON
    received_at: float


@dataclass(slots=True)
class Webhook:
    """The webhook currently set."""

    url: str
    secret_token: str | None
    max_connections: int
    allowed_updates: list[str] | None
    last_error_date: int | None = None
    last_error_message: str | None = None


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """One attempt to push an update to the webhook."""

    update_id: int
    url: str
    status: int | None
    """The webhook's HTTP status; None when the request failed."""
    error: str | None
    received_at: float


@dataclass(slots=True, eq=False)
class _Queued:
    update: Update
    redelivery: bool = False
    """A `duplicate()`: delivered even below the current offset, once."""
    delivered: bool = False


@dataclass(slots=True)
class _Chat:
    id: int
    type: str
    title: str | None = None
    username: str | None = None
    first_name: str | None = None
    is_forum: bool = False
    last_message_id: int = 0
    messages: dict[int, JSON] = field(default_factory=dict)
    topics: set[int] = field(default_factory=set)

    def to_json(self) -> JSON:
        chat: JSON = {"id": self.id, "type": self.type}
        if self.type == "private":
            chat["first_name"] = self.first_name or f"User {self.id}"
        else:
            chat["title"] = self.title or f"Chat {self.id}"
        if self.username:
            chat["username"] = self.username
        if self.is_forum:
            chat["is_forum"] = True
        return chat

    def next_message_id(self) -> int:
        self.last_message_id += 1
        return self.last_message_id


@dataclass(slots=True)
class _Faults:
    """The faults switched on; counters count down per affected request."""

    rate_limits: dict[int, tuple[int, float]] = field(default_factory=dict)
    failures: dict[str, tuple[int, int]] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    reject_markup: int = 0
    migrations: dict[int, int] = field(default_factory=dict)
    blocked: set[int] = field(default_factory=set)
    deleted_topics: set[tuple[int, int]] = field(default_factory=set)
    stall_polls: int = 0
    held: set[str] = field(default_factory=set)
    """Lower-case method names whose calls wait unanswered until released."""
    failed_downloads: tuple[int, int] = (0, 404)
    """How many file downloads (`/file/bot<token>/...`) still fail, and with which status."""


class _ApiError(Exception):
    """A request the Bot API refuses: HTTP `status`, Telegram's `description`."""

    def __init__(self, status: int, description: str, **parameters: Any) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters


def _api_error(
    status: int, description: str, parameters: Mapping[str, Any] | None = None
) -> Response:
    body: JSON = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = dict(parameters)
    return JSONResponse(body, status_code=status)


def _number(value: float) -> int | float:
    """`value` as an int when whole (how Telegram writes numbers)."""
    return int(value) if float(value).is_integer() else value


# -- request parameters ---------------------------------------------------------------------------

_STRING_PARAMS = frozenset(
    {
        "text",
        "caption",
        "parse_mode",
        "url",
        "secret_token",
        "action",
        "file_id",
        "ip_address",
        "language_code",
        "business_connection_id",
        "inline_message_id",
        "message_effect_id",
    }
)
"""Parameters whose values are strings even when they look like JSON numbers."""


class _Params(Params):
    """A request's parameters (body over query string), read the way the Bot API reads them."""

    def __contains__(self, key: str) -> bool:
        return key in self.values or key in self.files

    def raw(self, key: str) -> Any:
        return self.values.get(key)

    def integer(self, key: str) -> int | None:
        """The value as an integer; garbage reads as 0, as on Telegram."""
        value = self.values.get(key)
        if value is None:
            return None
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return int(value) if math.isfinite(value) else 0
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return int(value.strip())
            with contextlib.suppress(ValueError, OverflowError):
                return int(float(value))
        return 0

    def number(self, key: str) -> float | None:
        value = self.values.get(key)
        if value is None:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
                return number if math.isfinite(number) else 0.0
        return 0.0

    def json(self, key: str, what: str = "JSON object") -> Any:
        """The value decoded from JSON (already decoded in a JSON body)."""
        value = self.values.get(key)
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError as err:
            raise _ApiError(400, f"Bad Request: can't parse {key} {what}") from err

    def logged(self) -> JSON:
        """The parameters as a test reads them: JSON-looking values decoded, files described."""
        decoded: JSON = {}
        for key, value in self.values.items():
            decoded[key] = value
            if isinstance(value, str) and key not in _STRING_PARAMS:
                with contextlib.suppress(ValueError):
                    decoded[key] = json.loads(value)
        return {**decoded, **self.described_files()}


async def _read_params(request: Request) -> _Params:
    values, files = await read_params(
        request,
        max_part_size=16 * 1024 * 1024,
        invalid_json=lambda: _ApiError(400, "Bad Request: can't parse JSON encoded request body"),
        not_object=lambda: _ApiError(
            400, "Bad Request: JSON encoded request body must be an object"
        ),
    )
    return _Params(values, files)


_Handler = Callable[[Request, _Params], Awaitable[Any]]


def _document_json(stored: StoredFile) -> JSON:
    document: JSON = {
        "file_id": stored.file_id,
        "file_unique_id": stored.file_unique_id,
        "file_size": len(stored.content),
    }
    if stored.file_name is not None:
        document["file_name"] = stored.file_name
    if stored.mime_type is not None:
        document["mime_type"] = stored.mime_type
    return document
