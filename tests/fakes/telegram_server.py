"""A fake Telegram Bot API for python-telegram-bot, served by uvicorn on 127.0.0.1.

python-telegram-bot talks to it unmodified:
`telegram.Bot(token, base_url=tg.base_url, base_file_url=tg.base_file_url)`. It speaks the real
wire protocol: `GET|POST /bot<token>/<method>` (method names case-insensitive) with form,
multipart, JSON or query-string parameters; answers `{"ok": true, "result": ...}` or
`{"ok": false, "error_code": N, "description": "..."}` with the real HTTP status, Telegram's own
descriptions and `parameters` (`retry_after`, `migrate_to_chat_id`). Wrong token: 401
"Unauthorized"; a method the fake lacks: 404 "Not Found", like an unknown one.

Methods: getMe, getUpdates, sendMessage, editMessageText, deleteMessage, sendChatAction,
sendPhoto, sendDocument, getFile (bytes under `GET /file/bot<token>/<file_path>`), setWebhook,
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
`python -m tests.fakes.telegram_server --port 8101 --token T [--bot-username U]` serves until
SIGTERM / SIGINT; its first line on stdout ends with the root URL.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import itertools
import json
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes import standalone
from tests.fakes.control import (
    ControlClient,
    ControlError,
    control_endpoint,
    control_json,
    control_object,
    integer_limits,
    wait_answer,
    wait_timeout,
)
from tests.fakes.params import Params, hang_up, jsonable, read_params
from tests.fakes.serving import LocalServer, Served
from tests.fakes.standalone import until_signalled
from tests.fakes.waiting import Changes, Waitable

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


# -- text parsing (after tdlib's MessageEntity.cpp) --------------------------------------------


class EntityParseError(ValueError):
    """Why Telegram refuses the markup: what follows "can't parse entities: "."""


@dataclass(frozen=True, slots=True)
class FormattedText:
    """A text after entity parsing: what the user sees, and its entities (UTF-16 offsets)."""

    text: str
    entities: tuple[JSON, ...] = ()

    def trimmed(self) -> FormattedText:
        """Without leading / trailing whitespace, entities clipped (as Telegram stores texts)."""
        stripped = self.text.strip(_WHITESPACE)
        if stripped == self.text:
            return self
        lead = utf16_len(self.text[: len(self.text) - len(self.text.lstrip(_WHITESPACE))])
        total = utf16_len(stripped)
        entities = []
        for entity in self.entities:
            start = max(0, entity["offset"] - lead)
            end = min(total, entity["offset"] + entity["length"] - lead)
            if end > start:
                entities.append({**entity, "offset": start, "length": end - start})
        return FormattedText(stripped, tuple(entities))


_WHITESPACE = " \t\r\n\x0b\x0c"


def utf16_len(text: str) -> int:
    """Length of `text` in UTF-16 code units (Telegram's unit for lengths and offsets)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _byte_offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8", "surrogatepass"))


class _Builder:
    """Accumulates parsed text and entities."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.offset = 0
        self.entities: list[JSON] = []

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.offset += utf16_len(text)

    def since(self, part: int) -> str:
        return "".join(self.parts[part:])

    def entity(self, kind: str, start: int, **extra: Any) -> None:
        if self.offset > start:
            self.entities.append(
                {"type": kind, "offset": start, "length": self.offset - start, **extra}
            )

    def result(self) -> FormattedText:
        entities = sorted(self.entities, key=lambda e: (e["offset"], -e["length"]))
        return FormattedText("".join(self.parts), tuple(entities))


_HTML_TAGS = {
    "a": "text_link",
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "span": "spoiler",
    "tg-spoiler": "spoiler",
    "tg-emoji": "custom_emoji",
}
_HTML_ENTITY = re.compile(r"&(?:(lt|gt|amp|quot)|#([0-9]{1,8})|#[xX]([0-9a-fA-F]{1,8}));")
_HTML_ENTITY_LIKE = re.compile(r"&#?[0-9A-Za-z]*;")
_HTML_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def _html_entity(text: str, index: int) -> tuple[str, int]:
    """The character the entity at `text[index] == "&"` stands for, and the index after it."""
    match = _HTML_ENTITY.match(text, index)
    if match is not None:
        name, decimal, hexadecimal = match.groups()
        if name is not None:
            return _HTML_NAMED[name], match.end()
        code = int(decimal) if decimal is not None else int(hexadecimal, 16)
        if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
            return chr(code), match.end()
    offset = _byte_offset(text, index)
    like = _HTML_ENTITY_LIKE.match(text, index)
    if like is not None:
        raise EntityParseError(
            f'Unsupported HTML entity "{like.group()}" at byte offset {offset}'
            " (only &lt; &gt; &amp; &quot; and numeric entities are supported)"
        )
    raise EntityParseError(f'Character "&" must be escaped as "&amp;" at byte offset {offset}')


@dataclass(slots=True)
class _OpenTag:
    name: str
    start: int
    attributes: dict[str, str]


def parse_html(text: str) -> FormattedText:
    """Parse `parse_mode=HTML` text like Telegram; EntityParseError with its reason otherwise."""
    out = _Builder()
    stack: list[_OpenTag] = []
    size = len(text)
    i = 0
    while i < size:
        char = text[i]
        if char == "&":
            decoded, i = _html_entity(text, i)
            out.add(decoded)
            continue
        if char != "<":
            out.add(char)
            i += 1
            continue
        begin = i
        if text.startswith("</", i):
            if not stack:
                raise EntityParseError(f"Unexpected end tag at byte offset {_byte_offset(text, i)}")
            j = i + 2
            while j < size and not text[j].isspace() and text[j] != ">":
                j += 1
            name = text[i + 2 : j].lower()
            while j < size and text[j].isspace():
                j += 1
            if j >= size or text[j] != ">":
                raise EntityParseError(
                    f"Unclosed end tag at byte offset {_byte_offset(text, begin)}"
                )
            tag = stack.pop()
            if name and name != tag.name:
                raise EntityParseError(
                    f"Unmatched end tag at byte offset {_byte_offset(text, begin)}, "
                    f'expected "</{tag.name}>", found "</{name}>"'
                )
            i = j + 1
            _close_html_tag(out, tag, stack)
            continue
        j = i + 1
        while j < size and not text[j].isspace() and text[j] != ">":
            j += 1
        if j >= size:
            raise EntityParseError(f"Unclosed start tag at byte offset {_byte_offset(text, begin)}")
        name = text[i + 1 : j].lower()
        if name not in _HTML_TAGS:
            raise EntityParseError(
                f'Unsupported start tag "{name}" at byte offset {_byte_offset(text, begin)}'
            )
        attributes, i = _html_attributes(text, j, name, begin)
        if name == "span" and attributes.get("class") != "tg-spoiler":
            offset = _byte_offset(text, begin)
            raise EntityParseError(
                f'Tag "span" must have class "tg-spoiler" at byte offset {offset}'
            )
        if name == "tg-emoji" and not attributes.get("emoji-id", "").isdigit():
            raise EntityParseError(
                f'Tag "tg-emoji" must have a numeric "emoji-id" at byte offset '
                f"{_byte_offset(text, begin)}"
            )
        stack.append(_OpenTag(name, out.offset, attributes))
    if stack:
        raise EntityParseError(f'Can\'t find end tag corresponding to start tag "{stack[-1].name}"')
    return out.result()


def _html_attributes(text: str, j: int, name: str, begin: int) -> tuple[dict[str, str], int]:
    """Parse a start tag's attributes from `text[j]`; return them and the index after `>`."""
    size = len(text)
    attributes: dict[str, str] = {}
    while True:
        while j < size and text[j].isspace():
            j += 1
        if j >= size:
            raise EntityParseError(f"Unclosed start tag at byte offset {_byte_offset(text, begin)}")
        if text[j] == ">":
            return attributes, j + 1
        start = j
        while j < size and not text[j].isspace() and text[j] not in "=>":
            j += 1
        attribute = text[start:j].lower()
        if not attribute:
            raise EntityParseError(
                f'Empty attribute name in the tag "{name}" at byte offset '
                f"{_byte_offset(text, begin)}"
            )
        while j < size and text[j].isspace():
            j += 1
        if j >= size or text[j] != "=":
            attributes[attribute] = ""  # a bare attribute, like `expandable`
            continue
        j += 1
        while j < size and text[j].isspace():
            j += 1
        if j >= size:
            raise EntityParseError(f"Unclosed start tag at byte offset {_byte_offset(text, begin)}")
        if text[j] in "'\"":
            quote = text[j]
            j += 1
            value: list[str] = []
            while j < size and text[j] != quote:
                if text[j] == "&":
                    decoded, j = _html_entity(text, j)
                    value.append(decoded)
                else:
                    value.append(text[j])
                    j += 1
            if j >= size:
                raise EntityParseError(
                    f"Unclosed start tag at byte offset {_byte_offset(text, begin)}"
                )
            j += 1
            attributes[attribute] = "".join(value)
        else:
            start = j
            while j < size and (text[j].isalnum() or text[j] in ".-"):
                j += 1
            if j >= size or not (text[j].isspace() or text[j] == ">"):
                raise EntityParseError(
                    f"Unexpected end of name token at byte offset {_byte_offset(text, start)}"
                )
            attributes[attribute] = text[start:j].lower()


def _close_html_tag(out: _Builder, tag: _OpenTag, stack: list[_OpenTag]) -> None:
    kind = _HTML_TAGS[tag.name]
    attributes = tag.attributes
    if kind == "text_link":
        url = attributes.get("href", "")
        if url:
            out.entity("text_link", tag.start, url=url)
        return
    if kind == "code":
        language = attributes.get("class", "")
        parent = stack[-1] if stack else None
        if (
            language.startswith("language-")
            and parent is not None
            and parent.name == "pre"
            and parent.start == tag.start
        ):
            parent.attributes["language"] = language.removeprefix("language-")
            return
    if kind == "pre" and attributes.get("language"):
        out.entity("pre", tag.start, language=attributes["language"])
    elif kind == "blockquote" and "expandable" in attributes:
        out.entity("expandable_blockquote", tag.start)
    elif kind == "custom_emoji":
        out.entity("custom_emoji", tag.start, custom_emoji_id=attributes["emoji-id"])
    else:
        out.entity(kind, tag.start)


MARKDOWN_V2_RESERVED = "_*[]()~`>#+-=|{}.!"
"""Characters MarkdownV2 text must escape with a backslash outside code and pre."""
_MARKDOWN_V2_NAMES = {
    "bold": "Bold",
    "italic": "Italic",
    "underline": "Underline",
    "strikethrough": "Strikethrough",
    "spoiler": "Spoiler",
    "text_link": "TextUrl",
    "code": "Code",
    "pre": "Pre",
    "custom_emoji": "CustomEmoji",
}
_CUSTOM_EMOJI_URL = re.compile(r"tg://emoji\?id=([0-9]+)")


@dataclass(slots=True)
class _OpenEntity:
    kind: str
    start: int
    byte_offset: int
    part: int
    language: str = ""


def _escaped(text: str, i: int) -> bool:
    """Whether `text[i]` is a backslash escaping the next character (tdlib: ASCII 1-126)."""
    return text[i] == "\\" and i + 1 < len(text) and 0 < ord(text[i + 1]) <= 126


def parse_markdown_v2(text: str) -> FormattedText:
    """Parse `parse_mode=MarkdownV2` text like Telegram; EntityParseError with its reason."""
    out = _Builder()
    stack: list[_OpenEntity] = []
    quote: tuple[int, bool] | None = None  # (start, expandable) of the open block quote
    quote_end = 0
    size = len(text)
    i = 0
    line_start = True
    while i < size:
        in_code = bool(stack) and stack[-1].kind in ("code", "pre")
        if line_start and not in_code:
            line_start = False
            if text.startswith(">", i):
                if quote is None:
                    quote = (out.offset, False)
                i += 1
                continue
            if quote is None and text.startswith("**>", i):
                quote = (out.offset, True)
                i += 3
                continue
            if quote is not None:
                _close_quote(out, quote, quote_end)
                quote = None
        char = text[i]
        if char == "\n":
            quote_end = out.offset
            out.add(char)
            line_start = True
            i += 1
            continue
        if _escaped(text, i):
            out.add(text[i + 1])
            i += 2
            continue
        reserved = "`" if in_code else MARKDOWN_V2_RESERVED
        if char not in reserved:
            out.add(char)
            i += 1
            continue
        if (
            quote is not None
            and text.startswith("||", i)
            and text[i + 2 : i + 3] in ("", "\n")
            and not (stack and stack[-1].kind == "spoiler")
        ):
            quote = (quote[0], True)  # `||` ending the last line of an expandable quote
            i += 2
            continue
        if stack and _ends_entity(stack[-1].kind, text, i):
            i = _close_markdown_v2(out, stack.pop(), text, i)
            continue
        if in_code:
            raise EntityParseError(
                "Character '`' is reserved and must be escaped with the preceding '\\'"
            )
        i = _open_markdown_v2(out, stack, text, i)
    if stack:
        entity = stack[-1]
        name = _MARKDOWN_V2_NAMES[entity.kind]
        if entity.kind == "pre" and entity.language:
            name = "PreCode"
        raise EntityParseError(
            f"Can't find end of {name} entity at byte offset {entity.byte_offset}"
        )
    if quote is not None:
        _close_quote(out, quote, out.offset)
    return out.result()


def _close_quote(out: _Builder, quote: tuple[int, bool], end: int) -> None:
    start, expandable = quote
    if end > start:
        kind = "expandable_blockquote" if expandable else "blockquote"
        out.entities.append({"type": kind, "offset": start, "length": end - start})


def _ends_entity(kind: str, text: str, i: int) -> bool:
    char = text[i]
    if kind == "italic":
        return char == "_" and not text.startswith("__", i)
    if kind in ("underline", "spoiler"):
        return text.startswith("__" if kind == "underline" else "||", i)
    if kind == "pre":
        return text.startswith("```", i)
    ends = {"bold": "*", "code": "`", "strikethrough": "~", "text_link": "]", "custom_emoji": "]"}
    return char == ends[kind]


def _open_markdown_v2(out: _Builder, stack: list[_OpenEntity], text: str, i: int) -> int:
    """Open the entity whose marker starts at `text[i]`; return the index after the marker."""
    char = text[i]
    byte_offset = _byte_offset(text, i)
    language = ""
    if char == "_" and text.startswith("__", i):
        kind, i = "underline", i + 2
    elif char in "_*~[":
        kind = {"_": "italic", "*": "bold", "~": "strikethrough", "[": "text_link"}[char]
        i += 1
    elif char == "|" and text.startswith("||", i):
        kind, i = "spoiler", i + 2
    elif char == "!" and text.startswith("![", i):
        kind, i = "custom_emoji", i + 2
    elif char == "`" and text.startswith("```", i):
        kind, i = "pre", i + 3
        end = i
        while end < len(text) and not text[end].isspace() and text[end] != "`":
            end += 1
        if end > i and end < len(text) and text[end] != "`":
            language, i = text[i:end], end
        if text.startswith(("\r\n", "\n\r"), i):
            i += 2
        elif text[i : i + 1] in ("\n", "\r"):
            i += 1
    elif char == "`":
        kind, i = "code", i + 1
    else:
        raise EntityParseError(
            f"Character '{char}' is reserved and must be escaped with the preceding '\\'"
        )
    stack.append(_OpenEntity(kind, out.offset, byte_offset, len(out.parts), language))
    return i


def _markdown_v2_url(text: str, i: int) -> tuple[str, int]:
    """The URL in `(...)` starting at `text[i] == "("`, and the index after `)`."""
    i += 1
    begin = i
    url: list[str] = []
    while i < len(text) and text[i] != ")":
        if _escaped(text, i):
            url.append(text[i + 1])
            i += 2
        else:
            url.append(text[i])
            i += 1
    if i >= len(text):
        raise EntityParseError(
            f"Can't find end of a URL at byte offset {_byte_offset(text, begin)}"
        )
    return "".join(url), i + 1


def _close_markdown_v2(out: _Builder, entity: _OpenEntity, text: str, i: int) -> int:
    """Close `entity`, whose end marker starts at `text[i]`; return the index after it."""
    kind = entity.kind
    if kind in ("underline", "spoiler"):
        i += 2
    elif kind == "pre":
        i += 3
    else:
        i += 1
    if kind == "text_link":
        if text.startswith("(", i):
            url, i = _markdown_v2_url(text, i)
        else:
            url = out.since(entity.part)
        if url:
            out.entity("text_link", entity.start, url=url)
        return i
    if kind == "custom_emoji":
        if not text.startswith("(", i):
            raise EntityParseError("Custom emoji entity must contain a tg://emoji URL")
        url, i = _markdown_v2_url(text, i)
        match = _CUSTOM_EMOJI_URL.fullmatch(url)
        if match is None:
            raise EntityParseError("Custom emoji URL must have an emoji identifier")
        out.entity("custom_emoji", entity.start, custom_emoji_id=match.group(1))
        return i
    if kind == "pre" and entity.language:
        out.entity("pre", entity.start, language=entity.language)
    else:
        out.entity(kind, entity.start)
    return i


def parse_markdown(text: str) -> FormattedText:
    """Parse legacy `parse_mode=Markdown` text like Telegram (no nesting, few escapes)."""
    out = _Builder()
    size = len(text)
    i = 0
    while i < size:
        char = text[i]
        if char == "\\" and text[i + 1 : i + 2] in ("_", "*", "`", "["):
            out.add(text[i + 1])
            i += 2
            continue
        if char not in "_*`[":
            out.add(char)
            i += 1
            continue
        begin = i
        end_char = "]" if char == "[" else char
        is_pre = False
        language = ""
        i += 1
        if char == "`" and text.startswith("``", i):
            is_pre = True
            i += 2
            end = i
            while end < size and not text[end].isspace() and text[end] != "`":
                end += 1
            if end > i and end < size and text[end] != "`":
                language, i = text[i:end], end
            if text[i : i + 1] in ("\n", "\r"):
                i += 1
        start = out.offset
        part = len(out.parts)
        while i < size and not (text[i] == end_char and (not is_pre or text.startswith("```", i))):
            out.add(text[i])
            i += 1
        if i >= size:
            raise EntityParseError(
                f"Can't find end of the entity starting at byte offset {_byte_offset(text, begin)}"
            )
        i += 3 if is_pre else 1
        if char == "[":
            url = out.since(part)
            if text.startswith("(", i):
                end = text.find(")", i)
                end = size if end < 0 else end
                url, i = text[i + 1 : end], end + 1
            if url:
                out.entity("text_link", start, url=url)
        elif is_pre:
            if language:
                out.entity("pre", start, language=language)
            else:
                out.entity("pre", start)
        else:
            out.entity({"_": "italic", "*": "bold", "`": "code"}[char], start)
    return out.result()


PARSERS: dict[str, Callable[[str], FormattedText]] = {
    "html": parse_html,
    "markdownv2": parse_markdown_v2,
    "markdown": parse_markdown,
}
"""The parser of each `parse_mode`, by its lower-cased name."""

_MENTION = re.compile(r"(?<![\w@/])@[A-Za-z][A-Za-z0-9_]{2,31}(?![\w@])")
_COMMAND = re.compile(r"/[A-Za-z0-9_]{1,32}(?:@[A-Za-z][A-Za-z0-9_]{2,31})?(?![\w@/])")


def auto_entities(text: str) -> list[JSON]:
    """The entities Telegram gives a user's plain text: `mention`s and a leading `bot_command`."""
    entities: list[JSON] = []
    command = _COMMAND.match(text)
    if command is not None:
        entities.append({"type": "bot_command", "offset": 0, "length": utf16_len(command.group())})
    for match in _MENTION.finditer(text):
        if command is not None and match.start() < command.end():
            continue
        entities.append(
            {
                "type": "mention",
                "offset": utf16_len(text[: match.start()]),
                "length": utf16_len(match.group()),
            }
        )
    return entities


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


# -- the server -----------------------------------------------------------------------------------


class FakeTelegramServer(Served, Waitable):
    """A fake Bot API for one test (or one standalone process).

    Single event loop only: the server runs as tasks of the loop that enters it, and the
    Python API (injection, faults, waits) must be called from that loop.
    """

    def __init__(
        self,
        token: str = "123:abc",
        *,
        bot_username: str = "herald_bot",
        bot_name: str = "Herald",
        port: int = 0,
        webhook_retry_delay: float = 0.2,
        first_update_id: int = 1,
        log_level: str | None = None,
    ) -> None:
        self.token = token
        prefix = token.split(":", 1)[0]
        self.bot_user: JSON = {
            "id": int(prefix) if prefix.isdigit() else 1,
            "is_bot": True,
            "first_name": bot_name,
            "username": bot_username,
        }
        """The bot as `from` of its messages (getMe adds its capabilities)."""
        self.sent: list[Sent] = []
        """Every message the bot sent, in arrival order."""
        self.edits: list[Edit] = []
        """Every accepted editMessageText, in arrival order."""
        self.actions: list[Action] = []
        """Every accepted sendChatAction, in arrival order."""
        self.deleted: list[tuple[int, int]] = []
        """(chat_id, message_id) of every accepted deleteMessage."""
        self.calls: list[Call] = []
        """Every Bot API request with the right token (faulted ones included), in order."""
        self.downloads: list[str] = []
        """The `file_path` of every file download (`GET /file/bot<token>/...`), in order."""
        self.rejected: list[Rejected] = []
        """Every Bot API request answered with an error, in order."""
        self.confirmed: list[int] = []
        """Update ids confirmed (by a later offset or a webhook's 2xx), in confirmation order."""
        self.discarded: list[int] = []
        """Update ids dropped unconfirmed (allowed_updates, negative offset, drop_pending)."""
        self.webhook_deliveries: list[WebhookDelivery] = []
        """Every attempt to push an update to a webhook, in order."""
        self.commands: list[JSON] = []
        """The commands of the last setMyCommands."""
        self.polls = 0
        """How many getUpdates requests arrived (faulted ones included)."""
        self.polls_waiting = 0
        """How many getUpdates requests are being held (long polls and stalled polls)."""
        self._port = port
        self._log_level = log_level
        self._retry_delay = webhook_retry_delay
        self._queue: list[_Queued] = []
        self._updates: dict[int, Update] = {}
        self._update_ids = itertools.count(first_update_id)
        self._chats: dict[int, _Chat] = {}
        self._files: dict[str, StoredFile] = {}
        self._file_numbers = itertools.count(1)
        self._channel_ids = itertools.count(1)
        self._allowed: frozenset[str] = DEFAULT_UPDATE_KINDS
        self._webhook: Webhook | None = None
        self._poll_generation = 0
        self._faults = _Faults()
        self._methods: dict[str, tuple[str, _Handler]] = {
            name.lower(): (name, handler)
            for name, handler in [
                ("getMe", self._get_me),
                ("getUpdates", self._get_updates),
                ("sendMessage", self._send_message),
                ("editMessageText", self._edit_message_text),
                ("deleteMessage", self._delete_message),
                ("sendChatAction", self._send_chat_action),
                ("sendPhoto", self._send_photo),
                ("sendDocument", self._send_document),
                ("getFile", self._get_file),
                ("setWebhook", self._set_webhook),
                ("deleteWebhook", self._delete_webhook),
                ("getWebhookInfo", self._get_webhook_info),
                ("setMyCommands", self._set_my_commands),
                ("getMyCommands", self._get_my_commands),
                ("deleteMyCommands", self._delete_my_commands),
            ]
        }
        self._changes = Changes()
        self._local: LocalServer | None = None
        self._pusher: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None

    # -- where it listens -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port."""
        if self._local is None:
            raise RuntimeError("the server is not started")
        return self._local.port

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`: the root, where `/control/*` lives."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """`Bot(base_url=...)`: python-telegram-bot appends the token."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """`Bot(base_file_url=...)`: python-telegram-bot appends the token."""
        return f"{self.url}/file/bot"

    # -- inbound ----------------------------------------------------------------------------------

    @property
    def pending(self) -> list[Update]:
        """The updates the server still holds, in delivery order."""
        return [queued.update for queued in self._queue]

    @property
    def webhook(self) -> Webhook | None:
        """The webhook set, None while polling."""
        return self._webhook

    def inject_message(
        self,
        chat_id: int,
        text: str = "",
        *,
        sender_id: int,
        sender_name: str = "",
        sender_username: str | None = None,
        sender_is_bot: bool = False,
        chat_type: Literal["private", "group", "supergroup", "channel"] = "private",
        chat_title: str | None = None,
        is_forum: bool = False,
        thread_id: int | None = None,
        reply_to: int | None = None,
        entities: Sequence[Mapping[str, Any]] | None = None,
        photo: str | None = None,
        document: str | None = None,
        date: float | None = None,
        message_id: int | None = None,
        edit_of: int | None = None,
    ) -> Injected:
        """Queue a user's message as a new update; return its update, chat and message ids.

        `entities` default to Telegram's automatic ones (mentions, a leading bot command).
        `photo` / `document`: the file id of an `add_file()`; `text` becomes the caption.
        `thread_id` in a forum makes a topic message. `reply_to`: a message id in this chat
        (the bot's included), embedded as `reply_to_message`. `edit_of`: make an
        `edited_message` update of that earlier message instead (new text, `edit_date`).
        Raises KeyError for an unknown `reply_to`, `edit_of` or file id.
        """
        known = self._chats[chat_id].messages if chat_id in self._chats else {}
        for name, value, where in (
            ("reply_to", reply_to, known),
            ("edit_of", edit_of, known),
            ("photo", photo, self._files),
            ("document", document, self._files),
        ):
            if value is not None and value not in where:
                raise KeyError(f"unknown {name}: {value!r}")
        now = int(time.time() if date is None else date)
        chat = self._chat(chat_id, chat_type)
        chat.type = chat_type
        chat.is_forum = is_forum
        if chat_title is not None:
            chat.title = chat_title
        if chat_type == "private":
            chat.first_name = sender_name or chat.first_name
            chat.username = sender_username or chat.username
        entity_list = None if entities is None else [dict(e) for e in entities]
        if edit_of is not None:
            message = copy.deepcopy(chat.messages[edit_of])
            self._set_content(message, text, entity_list, photo, document)
            message["edit_date"] = now
            chat.messages[edit_of] = message
            kind = "edited_channel_post" if chat.type == "channel" else "edited_message"
            update_id = self._enqueue({kind: copy.deepcopy(message)})
            return Injected(update_id, chat.id, edit_of)
        if thread_id is not None:
            chat.topics.add(thread_id)
            chat.last_message_id = max(chat.last_message_id, thread_id)
        if message_id is None:
            message_id = chat.next_message_id()
        elif message_id in chat.messages:
            raise ValueError(f"message {message_id} already exists in chat {chat.id}")
        chat.last_message_id = max(chat.last_message_id, message_id)
        sender: JSON = {
            "id": sender_id,
            "is_bot": sender_is_bot,
            "first_name": sender_name or f"User {sender_id}",
        }
        if sender_username:
            sender["username"] = sender_username
        message = {"message_id": message_id, "date": now, "chat": chat.to_json()}
        if chat.type != "channel":
            message["from"] = sender
        self._set_content(message, text, entity_list, photo, document)
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            if chat.is_forum:
                message["is_topic_message"] = True
        if reply_to is not None:
            message["reply_to_message"] = _without_reply(chat.messages[reply_to])
        elif thread_id is not None and chat.is_forum:
            message["reply_to_message"] = self._topic_creation(chat, thread_id, now, sender)
        chat.messages[message_id] = message
        kind = "channel_post" if chat.type == "channel" else "message"
        update_id = self._enqueue({kind: copy.deepcopy(message)})
        return Injected(update_id, chat.id, message_id)

    def inject_update(self, raw: Mapping[str, Any]) -> int:
        """Queue `raw` as an update, as is; its `update_id` is kept when given, else assigned.

        Kinds outside `allowed_updates` (by default: chat_member, message_reaction,
        message_reaction_count) are discarded, as Telegram never creates them.
        """
        payload = copy.deepcopy(dict(raw))
        given = payload.get("update_id")
        if isinstance(given, int) and not isinstance(given, bool):
            self._update_ids = itertools.count(max(given + 1, next(self._update_ids)))
            return self._enqueue(payload, update_id=given)
        return self._enqueue(payload)

    def duplicate(self, update_id: int) -> None:
        """Deliver an update again, same id and content, even if already confirmed.

        The copy is delivered once even below the current offset, then confirmed like any
        update. KeyError for an update never created.
        """
        self._queue.append(_Queued(self._updates[update_id], redelivery=True))
        self._changes.notify()

    def add_file(
        self,
        content: bytes,
        *,
        file_path: str | None = None,
        file_name: str | None = None,
        mime_type: str | None = None,
    ) -> str:
        """Register a file getFile serves; return its file id (for `inject_message(photo=...)`)."""
        number = next(self._file_numbers)
        stored = StoredFile(
            file_id=f"BQACAgIAAxkBAAI{number:04d}{secrets.token_urlsafe(12)}",
            file_unique_id=f"AgAD{number:04d}{secrets.token_hex(4)}",
            file_path=file_path or f"files/file_{number}",
            content=content,
            file_name=file_name,
            mime_type=mime_type,
        )
        self._files[stored.file_id] = stored
        return stored.file_id

    def file(self, file_id: str) -> StoredFile:
        """A registered or uploaded file; KeyError if unknown."""
        return self._files[file_id]

    async def wait_until_confirmed(self, *update_ids: int, timeout: float = 10.0) -> None:
        """Wait until these updates (default: every pending one) are confirmed.

        Raises TimeoutError after `timeout` seconds.
        """

        def done() -> bool:
            if not update_ids:
                return not self._queue
            pending = {queued.update.update_id for queued in self._queue}
            return all(u in self.confirmed and u not in pending for u in update_ids)

        await self.wait_for(done, timeout)

    # -- outbound ---------------------------------------------------------------------------------

    def message(self, chat_id: int, message_id: int) -> JSON:
        """The current state of a message (a copy); KeyError if unknown."""
        return copy.deepcopy(self._chats[chat_id].messages[message_id])

    def texts_in(self, chat_id: int) -> list[str]:
        """What the user sees of the bot's messages in `chat_id` (after edits), in send order."""
        chat = self._chats.get(chat_id)
        if chat is None:
            return []
        texts = []
        for sent in self.sent:
            message = chat.messages.get(sent.message_id) if sent.chat_id == chat_id else None
            if message is not None:
                texts.append(str(message.get("text", message.get("caption", ""))))
        return texts

    async def wait_for_sent(
        self,
        expected: int | Callable[[Sent], bool],
        timeout: float = 10.0,
    ) -> list[Sent]:
        """Wait for sends: a count (return all sends) or a predicate (return the matches).

        Raises TimeoutError after `timeout` seconds.
        """
        return await self._changes.wait_for_items(self.sent, expected, timeout)

    # -- faults -----------------------------------------------------------------------------------

    def rate_limit(self, chat_id: int, count: int = 1, retry_after: float = 1) -> None:
        """The next `count` sends, edits and actions in `chat_id` answer 429 `retry_after`.

        `retry_after` must be > 0 (python-telegram-bot ignores a zero).
        """
        if not retry_after > 0:
            raise ValueError("retry_after must be > 0")
        self._faults.rate_limits[chat_id] = (count, retry_after)

    def fail(self, method: str, count: int = 1, status: int = 500) -> None:
        """The next `count` calls of `method` ("*": any) answer `status` (a 5xx) unprocessed."""
        self._faults.failures[method.lower()] = (count, status)

    def drop(self, method: str, count: int = 1) -> None:
        """The next `count` calls of `method` ("*": any) get their connection closed unanswered.

        Nothing is processed (a dropped getUpdates confirms nothing).
        """
        self._faults.drops[method.lower()] = count

    def reject_markup(self, count: int = 1) -> None:
        """The next `count` sends / edits with a parse_mode answer "can't parse entities"."""
        self._faults.reject_markup = count

    def migrate_chat(self, old_chat_id: int, new_chat_id: int) -> None:
        """`old_chat_id` became supergroup `new_chat_id`: calls to the old id answer 400 with
        `migrate_to_chat_id` from now on."""
        old = self._chat(old_chat_id)
        new = self._chat(new_chat_id, "supergroup")
        new.type, new.title = "supergroup", new.title or old.title
        self._faults.migrations[old_chat_id] = new_chat_id

    def block_chat(self, chat_id: int, blocked: bool = True) -> None:
        """Calls in `chat_id` answer 403 (blocked by the user; kicked from a group)."""
        if blocked:
            self._faults.blocked.add(chat_id)
        else:
            self._faults.blocked.discard(chat_id)

    def delete_topic(self, chat_id: int, thread_id: int) -> None:
        """Sends to this forum topic answer "message thread not found"."""
        self._faults.deleted_topics.add((chat_id, thread_id))

    def stall_polls(self, count: int = 1) -> None:
        """The next `count` getUpdates never answer (held until the client leaves); they confirm
        nothing."""
        self._faults.stall_polls = count

    def clear_faults(self) -> None:
        """Switch every fault off (migrations, blocks and deleted topics included)."""
        self._faults = _Faults()

    # -- state as JSON ----------------------------------------------------------------------------

    def webhook_info(self) -> JSON:
        """What getWebhookInfo answers."""
        info: JSON = {
            "url": "",
            "has_custom_certificate": False,
            "pending_update_count": len(self._queue),
        }
        webhook = self._webhook
        if webhook is not None:
            info.update(url=webhook.url, max_connections=webhook.max_connections)
            if webhook.allowed_updates is not None:
                info["allowed_updates"] = list(webhook.allowed_updates)
            if webhook.last_error_date is not None:
                info["last_error_date"] = webhook.last_error_date
                info["last_error_message"] = webhook.last_error_message
        return info

    def state(self) -> JSON:
        """Everything a test inspects, as JSON (what `GET /control/state` answers)."""
        texts = {str(chat_id): self.texts_in(chat_id) for chat_id in {s.chat_id for s in self.sent}}
        return {
            "ok": True,
            "sent": jsonable(self.sent),
            "edits": jsonable(self.edits),
            "actions": jsonable(self.actions),
            "deleted": jsonable(self.deleted),
            "rejected": jsonable(self.rejected),
            "texts": texts,
            "pending": [queued.update.update_id for queued in self._queue],
            "pending_updates": [queued.update.payload for queued in self._queue],
            "confirmed": list(self.confirmed),
            "discarded": list(self.discarded),
            "polls": self.polls,
            "polls_waiting": self.polls_waiting,
            "webhook": self.webhook_info(),
            "webhook_deliveries": jsonable(self.webhook_deliveries),
            "calls": [call.method for call in self.calls],
        }

    # -- lifecycle --------------------------------------------------------------------------------

    async def _start(self) -> None:
        self._local = LocalServer(self._app(), port=self._port, log_level=self._log_level)
        self._http = httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT, trust_env=False)
        await self._local.start()
        self._pusher = asyncio.create_task(self._push_to_webhook())

    async def _stop(self) -> None:
        self._changes.stop()  # ends long polls, stalled polls and control waits
        try:
            if self._pusher is not None:
                self._pusher.cancel()
                await asyncio.gather(self._pusher, return_exceptions=True)
            if self._local is not None:
                await self._local.stop()
        finally:
            if self._http is not None:
                await self._http.aclose()

    # -- internals --------------------------------------------------------------------------------

    def _enqueue(self, payload: JSON, *, update_id: int | None = None) -> int:
        if update_id is None:
            update_id = next(self._update_ids)
        payload = {"update_id": update_id, **{k: v for k, v in payload.items() if k != "update_id"}}
        update = Update(update_id, payload)
        self._updates[update_id] = update
        if update.kind in self._allowed:
            self._queue.append(_Queued(update))
        else:
            self.discarded.append(update_id)
        self._changes.notify()
        return update_id

    def _confirm(self, offset: int) -> None:
        """Forget what a getUpdates `offset` confirms."""
        if offset == 0:
            return
        if offset < 0:
            dropped, self._queue = self._queue[:offset], self._queue[offset:]
            self.discarded.extend(queued.update.update_id for queued in dropped)
        else:
            kept = []
            for queued in self._queue:
                done = queued.update.update_id < offset and (
                    not queued.redelivery or queued.delivered
                )
                if done:
                    self.confirmed.append(queued.update.update_id)
                else:
                    kept.append(queued)
            if len(kept) == len(self._queue):
                return
            self._queue = kept
        self._changes.notify()

    def _deliverable(self, limit: int) -> list[_Queued]:
        """The updates the next getUpdates answer carries: one per update id, in order."""
        batch: list[_Queued] = []
        seen: set[int] = set()
        for queued in self._queue:
            if queued.update.update_id in seen:
                continue
            seen.add(queued.update.update_id)
            batch.append(queued)
            if len(batch) >= limit:
                break
        return batch

    def _chat(self, chat_id: int, chat_type: str | None = None) -> _Chat:
        chat = self._chats.get(chat_id)
        if chat is None:
            if chat_type is None:
                if chat_id > 0:
                    chat_type = "private"
                else:
                    chat_type = "supergroup" if str(chat_id).startswith("-100") else "group"
            chat = self._chats[chat_id] = _Chat(chat_id, chat_type)
        return chat

    def _set_content(
        self,
        message: JSON,
        text: str,
        entities: list[JSON] | None,
        photo: str | None,
        document: str | None,
    ) -> None:
        """Give `message` a text, or a photo / document with `text` as its caption."""
        if entities is None:
            entities = auto_entities(text)
        for key in ("text", "entities", "caption", "caption_entities"):
            message.pop(key, None)
        if photo is not None or document is not None:
            if photo is not None:
                message["photo"] = self._photo_sizes(self._files[photo])
            if document is not None:
                message["document"] = _document_json(self._files[document])
            if text:
                message["caption"] = text
                if entities:
                    message["caption_entities"] = entities
            return
        message["text"] = text
        if entities:
            message["entities"] = entities

    def _photo_sizes(self, stored: StoredFile) -> list[JSON]:
        """PhotoSizes of `stored`: a thumbnail (its own file id, same bytes), then `stored`."""
        thumbnail_id = self.add_file(stored.content, file_path=f"{stored.file_path}.thumb.jpg")
        thumbnail = self._files[thumbnail_id]
        return [
            {
                "file_id": thumbnail.file_id,
                "file_unique_id": thumbnail.file_unique_id,
                "width": 90,
                "height": 90,
                "file_size": len(thumbnail.content),
            },
            {
                "file_id": stored.file_id,
                "file_unique_id": stored.file_unique_id,
                "width": 1280,
                "height": 960,
                "file_size": len(stored.content),
            },
        ]

    def _topic_creation(self, chat: _Chat, thread_id: int, date: int, sender: JSON) -> JSON:
        """The service message that created forum topic `thread_id` (made up when unknown)."""
        created = chat.messages.get(thread_id)
        if created is None:
            created = chat.messages[thread_id] = {
                "message_id": thread_id,
                "date": date,
                "chat": chat.to_json(),
                "from": sender,
                "message_thread_id": thread_id,
                "forum_topic_created": {"name": f"Topic {thread_id}", "icon_color": 7322096},
                "is_topic_message": True,
            }
        return _without_reply(created)

    def _authorized(self, request: Request) -> bool:
        given = str(request.path_params.get("token", ""))
        return secrets.compare_digest(given.encode(), self.token.encode())

    def _app(self) -> Starlette:
        control = [
            ("inject", self._control_inject, "POST"),
            ("file", self._control_file, "POST"),
            ("state", self._control_state, "GET"),
            ("fault", self._control_fault, "POST"),
            ("wait", self._control_wait, "POST"),
        ]
        routes = [
            Route("/bot{token}/{method}", self._bot_endpoint, methods=["GET", "POST"]),
            Route("/file/bot{token}/{file_path:path}", self._download, methods=["GET"]),
        ]
        routes += [
            Route(f"/control/{name}", control_endpoint(h), methods=[m]) for name, h, m in control
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_error})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return _api_error(status, HTTPStatus(status).phrase)

    def _countdown(self, counters: dict[str, int], method: str) -> bool:
        for key in (method.lower(), "*"):
            if counters.get(key, 0) > 0:
                counters[key] -= 1
                return True
        return False

    def _failure(self, method: str) -> int | None:
        failures = self._faults.failures
        for key in (method.lower(), "*"):
            count, status = failures.get(key, (0, 500))
            if count > 0:
                failures[key] = (count - 1, status)
                return status
        return None

    async def _bot_endpoint(self, request: Request) -> Response:
        if not self._authorized(request):
            return _api_error(401, "Unauthorized")
        entry = self._methods.get(str(request.path_params["method"]).lower())
        method = entry[0] if entry is not None else str(request.path_params["method"])
        try:
            params = await _read_params(request)
        except _ApiError as err:
            params = _Params({}, {})
            return self._refuse(method, params, err)
        self.calls.append(Call(method, params.logged(), time.monotonic()))
        if method == "getUpdates":
            self.polls += 1
        self._changes.notify()
        if entry is None:
            return self._refuse(method, params, _ApiError(404, "Not Found"))
        if self._countdown(self._faults.drops, method):
            return await hang_up(request)
        status = self._failure(method)
        if status is not None:
            return self._refuse(method, params, _ApiError(status, HTTPStatus(status).phrase))
        try:
            result = await entry[1](request, params)
        except _ApiError as err:
            return self._refuse(method, params, err)
        if isinstance(result, Response):
            return result
        return JSONResponse({"ok": True, "result": result})

    def _refuse(self, method: str, params: _Params, err: _ApiError) -> Response:
        self.rejected.append(
            Rejected(method, err.status, err.description, params.logged(), time.monotonic())
        )
        self._changes.notify()
        return _api_error(err.status, err.description, err.parameters)

    async def _hold(
        self, request: Request, seconds: float | None, done: Callable[[], bool]
    ) -> bool:
        """Wait until `done()`, `seconds` pass (None: no limit), the client leaves or the
        server stops; False when the client left."""
        if done() or (seconds is not None and seconds <= 0):
            return True

        self.polls_waiting += 1
        self._changes.notify()
        try:
            return await self._changes.hold(request, seconds, done)
        finally:
            self.polls_waiting -= 1
            self._changes.notify()

    # -- chat checks shared by sends, edits and actions ------------------------------------------

    def _target_chat(self, params: _Params) -> _Chat:
        """The chat of `chat_id`, after the chat's faults (migration, block, rate limit)."""
        raw = params.raw("chat_id")
        if raw is None or raw == "":
            raise _ApiError(400, "Bad Request: chat_id is empty")
        if isinstance(raw, str) and raw.startswith("@"):
            chat = next((c for c in self._chats.values() if c.username == raw[1:]), None)
            if chat is None:
                chat = self._chat(-1_000_000_000_000 - next(self._channel_ids), "channel")
                chat.username, chat.title = raw[1:], raw[1:]
        else:
            chat_id = params.integer("chat_id")
            if not chat_id:
                raise _ApiError(400, "Bad Request: chat not found")
            chat = self._chat(chat_id)
        faults = self._faults
        if chat.id in faults.migrations:
            raise _ApiError(400, CHAT_MIGRATED, migrate_to_chat_id=faults.migrations[chat.id])
        if chat.id in faults.blocked:
            raise _ApiError(403, _blocked_description(chat.type))
        left, retry_after = faults.rate_limits.get(chat.id, (0, 0.0))
        if left > 0:
            faults.rate_limits[chat.id] = (left - 1, retry_after)
            raise _ApiError(
                429,
                f"Too Many Requests: retry after {_number(retry_after)}",
                retry_after=_number(retry_after),
            )
        return chat

    def _thread(self, chat: _Chat, params: _Params) -> int | None:
        thread_id = params.integer("message_thread_id")
        if thread_id is None:
            return None
        if (chat.id, thread_id) in self._faults.deleted_topics or (
            chat.is_forum and thread_id not in chat.topics
        ):
            raise _ApiError(400, THREAD_NOT_FOUND)
        return thread_id

    def _format(
        self, params: _Params, key: str, *, caption: bool = False
    ) -> tuple[str, str | None, FormattedText]:
        """The raw text of `key`, its parse_mode and what it parses to; 400 when refused."""
        text = params.string(key) or ""
        parse_mode = params.string("parse_mode") or None
        if parse_mode is not None:
            parser = PARSERS.get(parse_mode.lower())
            if parser is None:
                raise _ApiError(400, "Bad Request: unsupported parse_mode")
            if self._faults.reject_markup > 0:
                self._faults.reject_markup -= 1
                raise _ApiError(400, CANT_PARSE + REJECTED_MARKUP)
            try:
                formatted = parser(text)
            except EntityParseError as err:
                raise _ApiError(400, f"{CANT_PARSE}{err}") from err
        else:
            given = params.json("caption_entities" if caption else "entities", "JSON array")
            entities = tuple(e for e in given if isinstance(e, dict)) if given else ()
            formatted = FormattedText(text, entities)
        formatted = formatted.trimmed()
        if not caption and not formatted.text:
            raise _ApiError(400, TEXT_EMPTY)
        if utf16_len(formatted.text) > (MAX_CAPTION_LENGTH if caption else MAX_TEXT_LENGTH):
            raise _ApiError(400, CAPTION_TOO_LONG if caption else TEXT_TOO_LONG)
        return text, parse_mode, formatted

    def _reply_target(self, chat: _Chat, params: _Params) -> JSON | None:
        """The message a send replies to (None: no reply); 400 when it does not exist."""
        reply = params.json("reply_parameters")
        if reply is not None:
            if not isinstance(reply, dict):
                raise _ApiError(400, "Bad Request: can't parse reply parameters JSON object")
            reply_params = _Params(reply, {})
            message_id = reply_params.integer("message_id")
            allow = reply_params.boolean("allow_sending_without_reply")
            if "chat_id" in reply_params:  # a reply to a message in another chat
                other = self._chats.get(reply_params.integer("chat_id") or 0)
                target = other.messages.get(message_id or 0) if other is not None else None
                if target is None and not allow:
                    raise _ApiError(400, REPLY_NOT_FOUND)
                return None if target is None else _without_reply(target)
        elif "reply_to_message_id" in params:
            message_id = params.integer("reply_to_message_id")
            allow = params.boolean("allow_sending_without_reply")
        else:
            return None
        target = chat.messages.get(message_id) if isinstance(message_id, int) else None
        if target is None:
            if allow:
                return None
            raise _ApiError(400, REPLY_NOT_FOUND)
        return _without_reply(target)

    def _bot_message(self, chat: _Chat, thread_id: int | None, reply: JSON | None) -> JSON:
        message: JSON = {
            "message_id": chat.next_message_id(),
            "from": dict(self.bot_user),
            "chat": chat.to_json(),
            "date": int(time.time()),
        }
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            if chat.is_forum:
                message["is_topic_message"] = True
        if reply is not None:
            message["reply_to_message"] = reply
        if chat.type == "channel":
            message.pop("from")
        return message

    def _record_sent(
        self,
        method: str,
        chat: _Chat,
        message: JSON,
        params: _Params,
        *,
        text: str,
        parse_mode: str | None,
        formatted: FormattedText,
        upload: Upload | None = None,
    ) -> JSON:
        chat.messages[message["message_id"]] = message
        reply = message.get("reply_to_message")
        self.sent.append(
            Sent(
                method=method,
                chat_id=chat.id,
                message_id=message["message_id"],
                text=text,
                parse_mode=parse_mode,
                plain_text=formatted.text,
                entities=formatted.entities,
                message_thread_id=message.get("message_thread_id"),
                reply_to_message_id=reply["message_id"] if reply is not None else None,
                disable_notification=params.boolean("disable_notification"),
                upload=upload,
                received_at=time.monotonic(),
            )
        )
        self._changes.notify()
        return copy.deepcopy(message)

    # -- Bot API methods --------------------------------------------------------------------------

    async def _get_me(self, request: Request, params: _Params) -> Any:
        return {
            **self.bot_user,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }

    async def _get_updates(self, request: Request, params: _Params) -> Any:
        if self._faults.stall_polls > 0:
            self._faults.stall_polls -= 1
            await self._hold(request, None, lambda: False)
            return _api_error(502, "Bad Gateway")  # only if the server stops first
        if self._webhook is not None:
            raise _ApiError(409, WEBHOOK_CONFLICT)
        offset = params.integer("offset") or 0
        limit = min(max(params.integer("limit") or MAX_UPDATES, 1), MAX_UPDATES)
        timeout = min(max(params.number("timeout") or 0.0, 0.0), MAX_POLL_TIMEOUT)
        allowed = params.json("allowed_updates", "JSON array")
        if isinstance(allowed, list):
            kinds = frozenset(str(kind) for kind in allowed)
            self._allowed = kinds or DEFAULT_UPDATE_KINDS
        self._confirm(offset)
        self._poll_generation += 1
        generation = self._poll_generation
        self._changes.notify()  # a waiting older poll ends with 409

        def superseded() -> bool:
            return self._poll_generation != generation

        present = await self._hold(
            request,
            timeout,
            lambda: bool(self._queue) or superseded() or self._webhook is not None,
        )
        if not present:
            return Response(status_code=499)  # nobody to answer: deliver nothing
        if superseded():
            raise _ApiError(409, POLL_CONFLICT)
        if self._webhook is not None:
            raise _ApiError(409, WEBHOOK_CONFLICT)
        batch = self._deliverable(limit)
        for queued in batch:
            queued.delivered = True
        return [copy.deepcopy(queued.update.payload) for queued in batch]

    async def _send_message(self, request: Request, params: _Params) -> Any:
        chat = self._target_chat(params)
        thread_id = self._thread(chat, params)
        text, parse_mode, formatted = self._format(params, "text")
        params.json("link_preview_options")
        message = self._bot_message(chat, thread_id, self._reply_target(chat, params))
        message["text"] = formatted.text
        if formatted.entities:
            message["entities"] = list(formatted.entities)
        return self._record_sent(
            "sendMessage",
            chat,
            message,
            params,
            text=text,
            parse_mode=parse_mode,
            formatted=formatted,
        )

    async def _edit_message_text(self, request: Request, params: _Params) -> Any:
        if "inline_message_id" in params:
            raise _ApiError(400, "Bad Request: inline messages are not supported by the fake")
        chat = self._target_chat(params)
        text, parse_mode, formatted = self._format(params, "text")
        message_id = params.integer("message_id") or 0
        message = chat.messages.get(message_id)
        if message is None:
            raise _ApiError(400, EDIT_NOT_FOUND)
        if message.get("from", self.bot_user).get("id") != self.bot_user["id"]:
            raise _ApiError(400, "Bad Request: message can't be edited")
        if "text" not in message:
            raise _ApiError(400, "Bad Request: there is no text in the message to edit")
        if message["text"] == formatted.text and message.get("entities", []) == list(
            formatted.entities
        ):
            raise _ApiError(400, NOT_MODIFIED)
        message["text"] = formatted.text
        message.pop("entities", None)
        if formatted.entities:
            message["entities"] = list(formatted.entities)
        message["edit_date"] = int(time.time())
        self.edits.append(
            Edit(
                chat.id,
                message_id,
                text,
                parse_mode,
                formatted.text,
                formatted.entities,
                time.monotonic(),
            )
        )
        self._changes.notify()
        return copy.deepcopy(message)

    async def _delete_message(self, request: Request, params: _Params) -> Any:
        chat = self._target_chat(params)
        message_id = params.integer("message_id") or 0
        if chat.messages.pop(message_id, None) is None:
            raise _ApiError(400, "Bad Request: message to delete not found")
        self.deleted.append((chat.id, message_id))
        self._changes.notify()
        return True

    async def _send_chat_action(self, request: Request, params: _Params) -> Any:
        chat = self._target_chat(params)
        thread_id = self._thread(chat, params)
        action = params.string("action") or ""
        if action not in CHAT_ACTIONS:
            raise _ApiError(400, "Bad Request: wrong parameter action in request")
        self.actions.append(Action(chat.id, action, thread_id, time.monotonic()))
        self._changes.notify()
        return True

    async def _send_photo(self, request: Request, params: _Params) -> Any:
        return await self._send_file("sendPhoto", "photo", params)

    async def _send_document(self, request: Request, params: _Params) -> Any:
        return await self._send_file("sendDocument", "document", params)

    async def _send_file(self, method: str, kind: str, params: _Params) -> Any:
        chat = self._target_chat(params)
        thread_id = self._thread(chat, params)
        text, parse_mode, formatted = self._format(params, "caption", caption=True)
        reply = self._reply_target(chat, params)
        upload, stored = self._input_file(params, kind)  # last: it registers the file
        message = self._bot_message(chat, thread_id, reply)
        if kind == "photo":
            message["photo"] = self._photo_sizes(stored)
        else:
            message["document"] = _document_json(stored)
        if formatted.text:
            message["caption"] = formatted.text
            if formatted.entities:
                message["caption_entities"] = list(formatted.entities)
        return self._record_sent(
            method,
            chat,
            message,
            params,
            text=text,
            parse_mode=parse_mode,
            formatted=formatted,
            upload=upload,
        )

    def _input_file(self, params: _Params, kind: str) -> tuple[Upload, StoredFile]:
        """The file a sendPhoto / sendDocument carries; registered so getFile serves it."""
        part = params.files.get(kind)
        value = params.string(kind)
        if part is None and value is not None and value.startswith("attach://"):
            part = params.files.get(value.removeprefix("attach://"))
        if part is not None:
            # Telegram's style: photos/file_3.jpg, documents/file_4.csv
            if kind == "photo":
                folder, suffix = "photos", ".jpg"
            else:
                folder = "documents"
                match = re.search(r"\.[A-Za-z0-9]{1,10}$", part.filename or "")
                suffix = match.group() if match else ""
            file_id = self.add_file(
                part.content,
                file_path=f"{folder}/file_{len(self._files) + 1}{suffix}",
                file_name=part.filename,
                mime_type=part.content_type,
            )
            upload = Upload(kind, "upload", file_id, part.filename, part.content_type, part.content)
            return upload, self._files[file_id]
        if not value:
            raise _ApiError(400, f"Bad Request: there is no {kind} in the request")
        if value in self._files:
            stored = self._files[value]
            upload = Upload(
                kind, "file_id", value, stored.file_name, stored.mime_type, stored.content
            )
            return upload, stored
        if value.startswith(("http://", "https://")):
            file_id = self.add_file(b"", file_name=value.rsplit("/", 1)[-1] or None)
            return Upload(kind, "url", file_id, None, None, b"", url=value), self._files[file_id]
        raise _ApiError(400, "Bad Request: wrong file identifier/HTTP URL specified")

    async def _get_file(self, request: Request, params: _Params) -> Any:
        stored = self._files.get(params.string("file_id") or "")
        if stored is None:
            raise _ApiError(400, "Bad Request: invalid file_id")
        return stored.to_json()

    async def _download(self, request: Request) -> Response:
        path = str(request.path_params["file_path"])
        stored = next((f for f in self._files.values() if f.file_path == path), None)
        if not self._authorized(request) or stored is None:
            return _api_error(404, "Not Found")
        self.downloads.append(path)
        return Response(stored.content, media_type=stored.mime_type or "application/octet-stream")

    async def _set_webhook(self, request: Request, params: _Params) -> Any:
        url = params.string("url") or ""
        if not url:
            return await self._delete_webhook(request, params)
        try:
            scheme = httpx.URL(url).scheme
        except httpx.InvalidURL:
            scheme = ""
        if scheme not in ("http", "https"):  # Telegram wants https; the fake takes http too
            raise _ApiError(400, "Bad Request: bad webhook: HTTPS url must be provided for webhook")
        secret = params.string("secret_token") or None
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
            raise _ApiError(400, "Bad Request: secret token contains unallowed characters")
        allowed = params.json("allowed_updates", "JSON array")
        if isinstance(allowed, list):
            kinds = [str(kind) for kind in allowed]
            self._allowed = frozenset(kinds) or DEFAULT_UPDATE_KINDS
        else:
            kinds = None
        if params.boolean("drop_pending_updates"):
            self._drop_pending()
        self._webhook = Webhook(
            url=url,
            secret_token=secret,
            max_connections=params.integer("max_connections") or 40,
            allowed_updates=kinds,
        )
        self._changes.notify()
        return JSONResponse({"ok": True, "result": True, "description": "Webhook was set"})

    async def _delete_webhook(self, request: Request, params: _Params) -> Any:
        if params.boolean("drop_pending_updates"):
            self._drop_pending()
        was_set = self._webhook is not None
        self._webhook = None
        self._changes.notify()
        description = "Webhook was deleted" if was_set else "Webhook is already deleted"
        return JSONResponse({"ok": True, "result": True, "description": description})

    async def _get_webhook_info(self, request: Request, params: _Params) -> Any:
        return self.webhook_info()

    async def _set_my_commands(self, request: Request, params: _Params) -> Any:
        commands = params.json("commands", "JSON array")
        if not isinstance(commands, list):
            raise _ApiError(400, "Bad Request: can't parse commands JSON array")
        self.commands = [dict(c) for c in commands if isinstance(c, dict)]
        self._changes.notify()
        return True

    async def _get_my_commands(self, request: Request, params: _Params) -> Any:
        return list(self.commands)

    async def _delete_my_commands(self, request: Request, params: _Params) -> Any:
        self.commands = []
        self._changes.notify()
        return True

    def _drop_pending(self) -> None:
        self.discarded.extend(queued.update.update_id for queued in self._queue)
        self._queue = []
        self._changes.notify()

    # -- webhook pusher ---------------------------------------------------------------------------

    async def _push_to_webhook(self) -> None:
        """While a webhook is set, push pending updates to it one at a time, in order."""
        while True:
            await self.wait_for(lambda: self._webhook is not None and bool(self._queue), None)
            webhook = self._webhook
            queued = self._queue[0]
            assert webhook is not None
            status, error = await self._post_update(webhook, queued.update)
            self.webhook_deliveries.append(
                WebhookDelivery(
                    queued.update.update_id, webhook.url, status, error, time.monotonic()
                )
            )
            if error is None:
                if queued in self._queue:
                    self._queue.remove(queued)
                    self.confirmed.append(queued.update.update_id)
                self._changes.notify()
                continue
            webhook.last_error_date = int(time.time())
            webhook.last_error_message = error
            self._changes.notify()
            await self._pause_pushing(webhook)

    async def _pause_pushing(self, webhook: Webhook) -> None:
        """Wait `webhook_retry_delay` before retrying, less if the webhook changes."""
        with contextlib.suppress(TimeoutError):
            await self.wait_for(lambda: self._webhook is not webhook, self._retry_delay)

    async def _post_update(self, webhook: Webhook, update: Update) -> tuple[int | None, str | None]:
        """POST one update; (status, None) on a 2xx, else the error Telegram would report."""
        assert self._http is not None
        headers = {}
        if webhook.secret_token is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = webhook.secret_token
        try:
            response = await self._http.post(webhook.url, json=update.payload, headers=headers)
        except httpx.ConnectError:
            return None, "Connection refused"
        except httpx.TimeoutException:
            return None, "Read timeout expired"
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            return None, f"{type(err).__name__}: {err}"
        if 200 <= response.status_code < 300:
            return response.status_code, None
        phrase = response.reason_phrase or HTTPStatus(response.status_code).phrase
        return (
            response.status_code,
            f"Wrong response from the webhook: {response.status_code} {phrase}",
        )

    # -- control routes ---------------------------------------------------------------------------

    async def _control_inject(self, request: Request) -> Response:
        body = await control_json(request)
        specs = [body] if isinstance(body, dict) else body
        if not isinstance(specs, list) or not specs:
            raise ControlError("expected a message spec or a non-empty list of them")
        calls = [_inject_arguments(spec) for spec in specs]  # all valid, or none injected
        injected: list[JSON] = []
        for args in calls:
            try:
                if "update" in args:
                    injected.append({"update_id": self.inject_update(args["update"])})
                else:
                    chat_id, text = args.pop("chat_id"), args.pop("text", "")
                    made = self.inject_message(chat_id, text, **args)
                    injected.append(jsonable(made))
            except (KeyError, ValueError) as err:
                raise ControlError(f"cannot inject {args}: {err!r}") from err
        return JSONResponse({"ok": True, "injected": injected})

    async def _control_file(self, request: Request) -> Response:
        spec = await control_json(request)
        if not isinstance(spec, dict) or not isinstance(spec.get("content_b64"), str):
            raise ControlError("expected {content_b64, file_path?, file_name?, mime_type?}")
        try:
            content = base64.b64decode(spec["content_b64"], validate=True)
        except ValueError as err:
            raise ControlError("content_b64 is not base64") from err
        names = ("file_path", "file_name", "mime_type")
        options = {k: spec.get(k) for k in names if isinstance(spec.get(k), str)}
        return JSONResponse({"ok": True, "file_id": self.add_file(content, **options)})

    async def _control_state(self, request: Request) -> Response:
        return JSONResponse(self.state())

    async def _control_fault(self, request: Request) -> Response:
        spec = await control_object(request)
        kind = spec.get("fault")

        def integer(name: str, default: int | None = None) -> int:
            value = spec.get(name, default)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ControlError(f"{kind} needs an integer {name}")
            return value

        def number(name: str, default: float) -> float:
            value = spec.get(name, default)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ControlError(f"{kind} needs a number {name} > 0")
            return float(value)

        def method() -> str:
            value = spec.get("method")
            if not isinstance(value, str) or not value:
                raise ControlError(f"{kind} needs a method")
            return value

        if kind == "rate_limit":
            self.rate_limit(integer("chat_id"), integer("count", 1), number("retry_after", 1.0))
        elif kind == "fail":
            self.fail(method(), integer("count", 1), integer("status", 500))
        elif kind == "drop":
            self.drop(method(), integer("count", 1))
        elif kind == "reject_markup":
            self.reject_markup(integer("count", 1))
        elif kind == "migrate_chat":
            self.migrate_chat(integer("old_chat_id"), integer("new_chat_id"))
        elif kind == "block_chat":
            self.block_chat(integer("chat_id"), bool(spec.get("blocked", True)))
        elif kind == "delete_topic":
            self.delete_topic(integer("chat_id"), integer("thread_id"))
        elif kind == "stall_polls":
            self.stall_polls(integer("count", 1))
        elif kind == "duplicate":
            update_id = integer("update_id")
            if update_id not in self._updates:
                raise ControlError(f"no update {update_id}")
            self.duplicate(update_id)
        elif kind == "clear":
            self.clear_faults()
        else:
            raise ControlError(f"unknown fault {kind!r}")
        return JSONResponse({"ok": True})

    async def _control_wait(self, request: Request) -> Response:
        spec = await control_object(request)
        limits = integer_limits(
            spec, ("min_sent", "min_edits", "min_actions", "min_polls", "max_pending")
        )
        confirmed = spec.get("confirmed", [])
        if not isinstance(confirmed, list) or not all(isinstance(u, int) for u in confirmed):
            raise ControlError("confirmed must be a list of update ids")
        timeout = wait_timeout(spec)

        def met() -> bool:
            pending = {queued.update.update_id for queued in self._queue}
            return (
                len(self.sent) >= limits.get("min_sent", 0)
                and len(self.edits) >= limits.get("min_edits", 0)
                and len(self.actions) >= limits.get("min_actions", 0)
                and self.polls >= limits.get("min_polls", 0)
                and len(self._queue) <= limits.get("max_pending", len(self._queue))
                and all(u in self.confirmed and u not in pending for u in confirmed)
            )

        return await wait_answer(self._changes, met, min(timeout, MAX_POLL_TIMEOUT), self.state)


def _without_reply(message: JSON) -> JSON:
    """A copy of `message` to embed as `reply_to_message` (Telegram does not nest them)."""
    embedded = copy.deepcopy(message)
    embedded.pop("reply_to_message", None)
    return embedded


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


def _blocked_description(chat_type: str) -> str:
    if chat_type == "private":
        return BLOCKED_BY_USER
    if chat_type == "channel":
        return "Forbidden: bot is not a member of the channel chat"
    return f"Forbidden: bot was kicked from the {chat_type} chat"


_INJECT_FIELDS: dict[str, tuple[type, ...]] = {
    "chat_id": (int,),
    "text": (str,),
    "sender_id": (int,),
    "sender_name": (str,),
    "sender_username": (str,),
    "sender_is_bot": (bool,),
    "chat_type": (str,),
    "chat_title": (str,),
    "is_forum": (bool,),
    "thread_id": (int,),
    "reply_to": (int,),
    "entities": (list,),
    "photo": (str,),
    "document": (str,),
    "date": (int, float),
    "message_id": (int,),
    "edit_of": (int,),
}
"""The fields of a control-route message spec and their JSON types."""


def _inject_arguments(spec: Any) -> JSON:
    """The `inject_message()` keyword arguments (or `{"update": raw}`) a spec stands for."""
    if not isinstance(spec, dict):
        raise ControlError("a message spec must be a JSON object")
    if "update" in spec:
        if set(spec) != {"update"} or not isinstance(spec["update"], dict):
            raise ControlError('a raw update spec is {"update": {...}} alone')
        return {"update": spec["update"]}
    unknown = set(spec) - set(_INJECT_FIELDS)
    if unknown:
        raise ControlError(f"unknown message fields {sorted(unknown)}")
    for name in ("chat_id", "sender_id"):
        if name not in spec:
            raise ControlError(f"{name} is required")
    for name, value in spec.items():
        kinds = _INJECT_FIELDS[name]
        if value is None and name not in ("chat_id", "sender_id"):
            continue
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ControlError(f"{name} must be {' or '.join(k.__name__ for k in kinds)}")
    return {k: v for k, v in spec.items() if v is not None}


class TelegramServerClient(ControlClient):
    """Drives a `FakeTelegramServer` in another process through its `/control/*` routes.

    `async with TelegramServerClient("http://127.0.0.1:8101") as tg:`; every method raises
    `httpx.HTTPStatusError` when the server refuses the request.
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        super().__init__(url, timeout=timeout, max_wait=MAX_POLL_TIMEOUT)

    @property
    def base_url(self) -> str:
        """`Bot(base_url=...)` for this server."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """`Bot(base_file_url=...)` for this server."""
        return f"{self.url}/file/bot"

    async def inject(
        self, chat_id: int, text: str = "", *, sender_id: int, **fields: Any
    ) -> Injected:
        """Like `FakeTelegramServer.inject_message`."""
        spec = {"chat_id": chat_id, "text": text, "sender_id": sender_id, **fields}
        return (await self.inject_many([spec]))[0]

    async def inject_many(self, specs: Iterable[Mapping[str, Any]]) -> list[Injected]:
        """Inject several messages in order (all or none, if the specs are invalid)."""
        body = await self._call("POST", "/control/inject", [dict(s) for s in specs])
        return [Injected(**made) for made in body["injected"]]

    async def inject_update(self, raw: Mapping[str, Any]) -> int:
        """Like `FakeTelegramServer.inject_update`; the update id."""
        body = await self._call("POST", "/control/inject", [{"update": dict(raw)}])
        update_id: int = body["injected"][0]["update_id"]
        return update_id

    async def add_file(self, content: bytes, **fields: str) -> str:
        """Like `FakeTelegramServer.add_file`; the file id."""
        spec = {"content_b64": base64.b64encode(content).decode(), **fields}
        file_id: str = (await self._call("POST", "/control/file", spec))["file_id"]
        return file_id

    async def fault(self, fault: str, **params: Any) -> None:
        """Switch a fault on: `fault("rate_limit", chat_id=5, count=2, retry_after=1)`.

        Names and parameters as `FakeTelegramServer`'s methods, plus `duplicate`
        (`update_id`) and `clear`.
        """
        await self._call("POST", "/control/fault", {"fault": fault, **params})

    async def duplicate(self, update_id: int) -> None:
        """Like `FakeTelegramServer.duplicate`."""
        await self.fault("duplicate", update_id=update_id)

    async def clear_faults(self) -> None:
        """Like `FakeTelegramServer.clear_faults`."""
        await self.fault("clear")

    async def wait(
        self,
        timeout: float = 10.0,
        *,
        min_sent: int = 0,
        min_edits: int = 0,
        min_actions: int = 0,
        min_polls: int = 0,
        max_pending: int | None = None,
        confirmed: Sequence[int] = (),
    ) -> JSON:
        """Wait until every condition holds; return the state. TimeoutError after `timeout`."""
        spec = {
            "timeout": timeout,
            "min_sent": min_sent,
            "min_edits": min_edits,
            "min_actions": min_actions,
            "min_polls": min_polls,
            "max_pending": max_pending,
            "confirmed": list(confirmed),
        }
        return await self._wait(spec, lambda error: f"telegram server: {error} for {spec}")


async def _main(port: int, token: str, bot_username: str) -> None:
    server = FakeTelegramServer(token, bot_username=bot_username, port=port, log_level="warning")
    async with server:
        print(f"telegram server serving {server.url}", flush=True)
        await until_signalled()


def main(argv: list[str] | None = None) -> None:
    """Serve on `--port` (0: any free port, printed) until SIGINT or SIGTERM."""
    parser = standalone.parser(
        "tests.fakes.telegram_server",
        __doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument("--token", default="123:abc")
    parser.add_argument("--bot-username", default="herald_bot")
    args = parser.parse_args(argv)
    standalone.run(_main(args.port, args.token, args.bot_username))


if __name__ == "__main__":
    main()
