"""Telegram's text parsing (HTML, MarkdownV2, Markdown, automatic entities), after tdlib."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fakes.telegram.records import (
    JSON,
)

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
