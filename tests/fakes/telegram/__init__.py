"""A fake Telegram Bot API for python-telegram-bot, served by uvicorn on 127.0.0.1.

python-telegram-bot talks to it unmodified:
`telegram.Bot(token, base_url=tg.base_url, base_file_url=tg.base_file_url)`. It speaks the real
wire protocol: `GET|POST /bot<token>/<method>` (method names case-insensitive) with form,
multipart, JSON or query-string parameters; answers `{"ok": true, "result": ...}` or
`{"ok": false, "error_code": N, "description": "..."}` with the real HTTP status, Telegram's own
descriptions and `parameters` (`retry_after`, `migrate_to_chat_id`). Wrong token: 401
"Unauthorized"; a method the fake lacks: 404 "Not Found", like an unknown one.

Methods: getMe, getUpdates, sendMessage, editMessageText, deleteMessage, sendChatAction,
answerCallbackQuery, setMessageReaction (recorded in `reactions`), sendPhoto, sendDocument,
sendVoice, getFile (bytes under `GET /file/bot<token>/<file_path>`), setWebhook,
deleteWebhook, getWebhookInfo, setMyCommands, getMyCommands, deleteMyCommands.

Semantics worth knowing:
- getUpdates: an update stays until a call whose `offset` passes it (negative offset: keep only
  the last -offset updates, forget the rest); long polls answer as soon as an update is there;
  a newer getUpdates ends a waiting one with 409 "terminated by other getUpdates request"; 409
  while a webhook is set. `allowed_updates` applies to updates created after the call, as on
  Telegram. With a webhook set, the server POSTs each pending update to it, one at a time in
  order, and retries (after `webhook_retry_delay`) until an answer is 2xx.
- Texts are parsed like Telegram (tdlib) parses them: HTML, MarkdownV2 and legacy Markdown, with
  its error messages ("Bad Request: can't parse entities: ..."); then trimmed of surrounding
  whitespace, refused when empty or over 4096 UTF-16 code units (captions: 1024). One deliberate
  difference: in HTML, a "&" that does not start `&lt;` `&gt;` `&amp;` `&quot;` or a numeric
  entity is refused (Telegram keeps it literally), to catch missing escapes.
- Chats need no setup: an unknown id is a private chat when positive, a supergroup when it
  starts with -100, else a group; injection sets a chat's type, title and forum flag. Message
  ids count per chat, shared by injected and sent messages.
- Forum topics: a message injected with `thread_id` in a forum chat is a topic message and, as
  on Telegram, replies to the topic's creation message when it replies to nothing else. Sends
  to a topic never seen in an injection answer "message thread not found".

In tests: `async with FakeTelegramServer("123:abc") as tg:`, then `tg.inject_message(...)`,
faults (`tg.rate_limit(...)`, `tg.fail(...)`, `tg.drop(...)`, ...; each counts down) and
inspection (`tg.sent`, `tg.edits`, `tg.actions`, `tg.confirmed`, `await tg.wait_for_sent(1)`).
Another process drives the server through `/control/*` routes (see `TelegramServerClient`).
Standalone (crash tests, manual runs):
`python -m tests.fakes.telegram --port 8101 --token T [--bot-username U]` serves until
SIGTERM / SIGINT; its first line on stdout ends with the root URL.
"""

from tests.fakes.telegram.client import TelegramServerClient, main
from tests.fakes.telegram.entities import (
    MARKDOWN_V2_RESERVED,
    PARSERS,
    EntityParseError,
    FormattedText,
    auto_entities,
    parse_html,
    parse_markdown,
    parse_markdown_v2,
    utf16_len,
)
from tests.fakes.telegram.records import (
    BLOCKED_BY_USER,
    CANT_PARSE,
    CAPTION_TOO_LONG,
    CHAT_ACTIONS,
    CHAT_MIGRATED,
    DEFAULT_UPDATE_KINDS,
    EDIT_NOT_FOUND,
    JSON,
    MAX_CAPTION_LENGTH,
    MAX_POLL_TIMEOUT,
    MAX_TEXT_LENGTH,
    MAX_UPDATES,
    NOT_MODIFIED,
    POLL_CONFLICT,
    REJECTED_MARKUP,
    REPLY_NOT_FOUND,
    TEXT_EMPTY,
    TEXT_TOO_LONG,
    THREAD_NOT_FOUND,
    WEBHOOK_CONFLICT,
    WEBHOOK_TIMEOUT,
    Action,
    Call,
    Edit,
    Injected,
    Rejected,
    Sent,
    StoredFile,
    Update,
    Upload,
    Webhook,
    WebhookDelivery,
)
from tests.fakes.telegram.server import FakeTelegramServer

__all__ = [
    "BLOCKED_BY_USER",
    "CANT_PARSE",
    "CAPTION_TOO_LONG",
    "CHAT_ACTIONS",
    "CHAT_MIGRATED",
    "DEFAULT_UPDATE_KINDS",
    "EDIT_NOT_FOUND",
    "JSON",
    "MARKDOWN_V2_RESERVED",
    "MAX_CAPTION_LENGTH",
    "MAX_POLL_TIMEOUT",
    "MAX_TEXT_LENGTH",
    "MAX_UPDATES",
    "NOT_MODIFIED",
    "PARSERS",
    "POLL_CONFLICT",
    "REJECTED_MARKUP",
    "REPLY_NOT_FOUND",
    "TEXT_EMPTY",
    "TEXT_TOO_LONG",
    "THREAD_NOT_FOUND",
    "WEBHOOK_CONFLICT",
    "WEBHOOK_TIMEOUT",
    "Action",
    "Call",
    "Edit",
    "EntityParseError",
    "FakeTelegramServer",
    "FormattedText",
    "Injected",
    "Rejected",
    "Sent",
    "StoredFile",
    "TelegramServerClient",
    "Update",
    "Upload",
    "Webhook",
    "WebhookDelivery",
    "auto_entities",
    "main",
    "parse_html",
    "parse_markdown",
    "parse_markdown_v2",
    "utf16_len",
]
