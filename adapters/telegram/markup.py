"""Markdown as an LLM writes it ⇄ Telegram formatted text (`parse_mode` HTML or MarkdownV2).

Pure functions, no state. The Markdown is read by markdown-it-py (CommonMark with the GFM
strikethrough and table rules); its token stream becomes a list of styled runs of visible text,
which is then written in either dialect, so both dialects display exactly the same text.

Rules where Telegram and CommonMark do not meet:

* Headings are bold lines, thematic breaks "———", bullets "• ", ordered items keep the number
  written in the source ("7. "); a nested list is indented two spaces per level, and only the
  first line of each block is indented (so a lazy continuation line costs nothing).
* Blocks are separated by a blank line when the source had one between them, else by a newline.
* Only http(s), tg and mailto links become links; a link with no text shows its URL. Images are
  links whose text is the alt text. Telegram entities other than bold, italic and strikethrough
  cannot contain each other, so code inside a link is shown as plain link text.
* Telegram quotes cannot be nested and are block-level, so only a top-level blockquote is a quote
  entity; one nested in another quote or in a list item just shows its content. In MarkdownV2 a
  code block inside a quote is written outside it (the quote resumes after it).
* Code blocks keep the first word of the fence info as their language, reduced to
  `[A-Za-z0-9_+-]`; empty or blank code blocks are left out.
* A table becomes a preformatted block with its columns aligned: " | " between cells and a
  "-+-" rule under the header. Padding can make that longer than the table's source; if the
  whole message then displays more than the input's length, such tables drop the rule, and
  if that is still too long, such tables show their source lines as-is (container prefixes
  removed), which never displays more than the source.
* Raw HTML is shown as text.

Contract, relied on by the chunker: the visible text (what Telegram displays) is never longer in
UTF-16 code units than the Markdown. If a rendering would break that, or would display nothing
for a non-blank input, or fails, the input is sent as escaped plain text instead.
"""

from __future__ import annotations

import functools
import html
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = ["to_html", "to_markdown_v2", "visible_text"]

_MarkKind = Literal["quote", "a", "b", "i", "s", "code", "pre"]


class _Mark(NamedTuple):
    """One Telegram entity around a run; `arg` is the URL of a link or the language of a pre."""

    kind: _MarkKind
    arg: str = ""


class _Run(NamedTuple):
    """Visible text with the entities around it, outermost first (a quote is always first)."""

    text: str
    marks: tuple[_Mark, ...]


_QUOTE = _Mark("quote")
_BOLD = _Mark("b")
_CODE = _Mark("code")
_STYLE_OPEN = {"strong_open": _BOLD, "em_open": _Mark("i"), "s_open": _Mark("s")}
_STYLE_CLOSE = frozenset({"strong_close", "em_close", "s_close"})
_ATOMIC = frozenset({"code", "pre"})

_TABLE_STYLES = (" | +", " | ")
"""Table layouts, nicest first: cells between " | ", with or without a rule under the header."""
_BULLET = "•"
_RULE = "———"
_ALIGN = re.compile(r"text-align:\s*(left|center|right)")
_LANG_JUNK = re.compile(r"[^A-Za-z0-9_+-]")
_LINKABLE = re.compile(r"(?:https?://[^\s/?#]|tg://[A-Za-z]|mailto:\S)", re.IGNORECASE)
_V2_SPECIAL = re.compile(r"([_*\[\]()~`>#+\-=|{}.!\\])")
_V2_CODE_SPECIAL = re.compile(r"([`\\])")
_V2_URL_SPECIAL = re.compile(r"([)\\])")
_HTML_TAG = re.compile(r"""<(?:[^>"']|"[^"]*"|'[^']*')*>""")
_HTML_ENTITY = re.compile(r"&(lt|gt|amp|quot|#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6});")
_NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def to_html(markdown: str) -> str:
    """Telegram HTML for `markdown`: valid for any input, never displays more UTF-16 than it."""
    runs = _runs(markdown)
    if runs is None:
        return html.escape(_normalize(markdown), quote=False)
    return _write_html(runs)


def to_markdown_v2(markdown: str) -> str:
    """Telegram MarkdownV2 for `markdown`, valid for any input, displaying what `to_html` does."""
    runs = _runs(markdown)
    if runs is None:
        return _V2_SPECIAL.sub(r"\\\1", _normalize(markdown))
    return _write_v2(runs)


def visible_text(html_text: str) -> str:
    """The text Telegram displays for an HTML-mode message: tags removed, entities decoded."""
    return _HTML_ENTITY.sub(_decode_entity, _HTML_TAG.sub("", html_text))


def _decode_entity(match: re.Match[str]) -> str:
    name = match.group(1)
    if name in _NAMED_ENTITIES:
        return _NAMED_ENTITIES[name]
    code = int(name[2:], 16) if name[1] in "xX" else int(name[1:])
    return chr(code) if code <= 0x10FFFF else match.group(0)


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _normalize(markdown: str) -> str:
    """The input as markdown-it reads it: newlines unified, NUL replaced."""
    return markdown.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")


@functools.cache
def _parser() -> MarkdownIt:
    """The shared parser; markdown-it instances are not mutated by parsing."""
    return MarkdownIt("commonmark").enable(["strikethrough", "table"])


def _runs(markdown: str) -> list[_Run] | None:
    """The styled runs for `markdown`, or None when it must be sent as plain text."""
    source = _normalize(markdown)
    limit = _utf16_len(markdown)
    for table_level in range(len(_TABLE_STYLES) + 1):
        builder = _Builder(source, table_level=table_level)
        try:
            runs = builder.build()
        # This runs on every streamed edit of every answer: a parser or renderer bug must
        # degrade to plain text, never lose the message.
        except Exception:
            return None
        shown = "".join(run.text for run in runs)
        if not shown.strip() and markdown.strip():
            return None
        if _utf16_len(shown) <= limit:
            return runs
        if not builder.padded_tables:
            return None
    return None


@dataclass(eq=False)
class _Frame:
    """A container block being rendered (the document, a blockquote, a list or a list item)."""

    indent: str
    """What starts each child block after the first (list indentation)."""
    quoted: bool
    """Whether the children's runs carry the quote entity."""
    quote_depth: int
    """Blockquotes around this container, quoting or not (for stripping `>` from source)."""
    in_item: bool
    start: int = 1
    index: int = 0
    prev_map: tuple[int, int] | None = None
    """Source lines of the last child that displayed something."""
    ordered: bool = False
    source_map: tuple[int, int] | None = None
    """The container's own source lines."""
    entry: tuple[list[_Run] | None, int] = (None, 0)
    """`_Builder.begin`'s state for this container as a child of its parent."""


class _Builder:
    """Turns one normalized Markdown string into runs by walking markdown-it's flat tokens."""

    def __init__(self, source: str, *, table_level: int) -> None:
        self.source = source
        self.table_level = table_level
        """Styles in `_TABLE_STYLES` before this index are used only where they fit the source."""
        self.padded_tables = False
        """Whether some table came out longer than its source lines."""
        self.lines = source.split("\n")
        self.runs: list[_Run] = []
        self.shown = 0
        """Code points of visible text emitted so far."""
        self.pending: list[_Run] | None = None
        """The separator before the next block, written only if the block displays something."""
        self.frames = [_Frame(indent="", quoted=False, quote_depth=0, in_item=False)]

    def build(self) -> list[_Run]:
        tokens = _parser().parse(self.source)
        i = 0
        while i < len(tokens):
            i = self.block(tokens, i) + 1
        return self.runs

    @property
    def base(self) -> tuple[_Mark, ...]:
        return (_QUOTE,) if self.frames[-1].quoted else ()

    def block(self, tokens: Sequence[Token], i: int) -> int:
        """Renders the block token at `i`; returns the index of the last token it consumed."""
        tok = tokens[i]
        kind = tok.type
        if kind in ("paragraph_open", "heading_open"):
            entry = self.begin(tok)
            end = i + 1
            base = self.base + ((_BOLD,) if kind == "heading_open" else ())
            while end < len(tokens) and tokens[end].nesting != -1:
                if tokens[end].type == "inline":
                    self.inline(tokens[end].children or [], base)
                end += 1
            self.end(entry, tok.map)
            return end
        if kind == "table_open":
            entry = self.begin(tok)
            end = self.table(tokens, i)
            self.end(entry, tok.map)
            return end
        if kind in ("blockquote_open", "bullet_list_open", "ordered_list_open", "list_item_open"):
            self.open_container(tok)
            return i
        if kind in ("blockquote_close", "bullet_list_close", "ordered_list_close"):
            self.close_container(tok)
            return i
        if kind == "list_item_close":
            self.close_container(tok)
            self.frames[-1].index += 1
            return i
        if tok.nesting != 0:
            return i  # an unknown container: its children render in place
        entry = self.begin(tok)
        if kind in ("fence", "code_block"):
            text = tok.content[:-1] if tok.content.endswith("\n") else tok.content
            if text.strip():
                lang = _LANG_JUNK.sub("", tok.info.split()[0]) if tok.info.strip() else ""
                self.pre(text, lang)
        elif kind == "hr":
            self.emit(_RULE, self.base)
        elif kind == "inline":
            self.inline(tok.children or [], self.base)
        else:  # html_block and anything unknown: the source text, shown as text
            self.emit(tok.content.rstrip("\n"), self.base)
        self.end(entry, tok.map)
        return i

    def open_container(self, tok: Token) -> None:
        parent = self.frames[-1]
        entry = self.begin(tok)
        if tok.type == "blockquote_open":
            quoting = not parent.quoted and not parent.in_item
            frame = _Frame(
                indent=parent.indent,
                quoted=parent.quoted or quoting,
                quote_depth=parent.quote_depth + 1,
                in_item=parent.in_item,
            )
        elif tok.type == "list_item_open":
            number = tok.info or str(parent.start + parent.index)
            marker = number + "." if parent.ordered else _BULLET
            frame = _Frame(
                indent=parent.indent + "  ",
                quoted=parent.quoted,
                quote_depth=parent.quote_depth,
                in_item=True,
            )
            self.emit(marker, self.base)
            # The first block of the item starts on the marker's line.
            self.pending = [_Run(" ", self.base)]
        else:
            start = tok.attrGet("start")
            frame = _Frame(
                indent=parent.indent,
                quoted=parent.quoted,
                quote_depth=parent.quote_depth,
                in_item=parent.in_item,
                start=start if isinstance(start, int) else 1,
                ordered=tok.type == "ordered_list_open",
            )
        frame.entry = entry
        frame.source_map = (tok.map[0], tok.map[1]) if tok.map else None
        self.frames.append(frame)

    def close_container(self, tok: Token) -> None:
        if len(self.frames) == 1:
            return
        frame = self.frames.pop()
        if tok.type == "list_item_close":
            self.pending = None  # the space after the marker of an empty item
        self.end(frame.entry, frame.source_map)

    def begin(self, tok: Token) -> tuple[list[_Run] | None, int]:
        """Starts a child block of the current container: queues the separator before it."""
        frame = self.frames[-1]
        entry = (self.pending, self.shown)
        if frame.prev_map is not None and tok.map is not None:
            gap = self.lines[max(frame.prev_map[1] - 1, 0) : tok.map[0]]
            blank = any(not line.strip(" \t>") for line in gap)
            sep = [_Run("\n", self.base)] * (2 if blank else 1)
            # Never indent by more characters than the source line spent on its prefix (a tab
            # is one character but four columns).
            line = self.lines[tok.map[0]] if tok.map[0] < len(self.lines) else ""
            indent = frame.indent[: len(line) - len(line.lstrip(" \t>"))]
            self.pending = sep + ([_Run(indent, self.base)] if indent else [])
        return entry

    def end(self, entry: tuple[list[_Run] | None, int], source_map: Sequence[int] | None) -> None:
        """Ends a child block: drops its separator if it displayed nothing."""
        pending, shown = entry
        if self.shown == shown:
            self.pending = pending
        elif source_map is not None:
            self.frames[-1].prev_map = (source_map[0], source_map[1])

    def flush(self) -> None:
        if self.pending:
            self.runs.extend(self.pending)
            self.shown += sum(len(run.text) for run in self.pending)
        self.pending = None

    def emit(self, text: str, marks: tuple[_Mark, ...]) -> None:
        """Appends visible text; a newline never carries an entity other than the quote."""
        if not text:
            return
        self.flush()
        line_marks = marks[:1] if marks[:1] == (_QUOTE,) else ()
        for n, piece in enumerate(text.split("\n")):
            if n:
                self.runs.append(_Run("\n", line_marks))
            if piece:
                self.runs.append(_Run(piece, marks))
        self.shown += len(text)

    def pre(self, text: str, lang: str) -> None:
        self.flush()
        self.runs.append(_Run(text, (*self.base, _Mark("pre", lang))))
        self.shown += len(text)

    def inline(self, children: Sequence[Token], base: tuple[_Mark, ...]) -> None:
        stack = [base]
        links: list[tuple[bool, str, int]] = []
        for tok in children:
            marks = stack[-1]
            kind = tok.type
            style = _STYLE_OPEN.get(kind)
            if style is not None:
                stack.append(marks if style in marks else (*marks, style))
            elif kind in _STYLE_CLOSE:
                if len(stack) > 1:
                    stack.pop()
            elif kind == "link_open":
                href = str(tok.attrGet("href") or "")
                ok = _linkable(href) and not _in_link(marks)
                links.append((ok, href, self.shown))
                stack.append((*marks, _Mark("a", href)) if ok else marks)
            elif kind == "link_close":
                if links:
                    ok, href, shown = links.pop()
                    if ok and self.shown == shown:
                        self.emit(_link_text(href), marks)
                if len(stack) > 1:
                    stack.pop()
            elif kind == "code_inline":
                self.emit(tok.content, marks if _in_link(marks) else (*marks, _CODE))
            elif kind in ("softbreak", "hardbreak"):
                self.emit("\n", marks)
            elif kind == "image":
                alt = _plain_text(tok.children or [])
                src = str(tok.attrGet("src") or "")
                if _in_link(marks) or not _linkable(src):
                    self.emit(alt, marks)
                else:
                    self.emit(alt or _link_text(src), (*marks, _Mark("a", src)))
            else:  # text, html_inline (shown as text) and anything unknown
                self.emit(tok.content, marks)

    def table(self, tokens: Sequence[Token], i: int) -> int:
        """Renders the table opening at `i`; returns the index of its `table_close`."""
        rows: list[list[str]] = []
        aligns: list[str] = []
        end = i + 1
        while end < len(tokens) and tokens[end].type != "table_close":
            tok = tokens[end]
            if tok.type == "tr_open":
                rows.append([])
            elif tok.type == "th_open":
                match = _ALIGN.search(str(tok.attrGet("style") or ""))
                aligns.append(match.group(1) if match else "left")
            elif tok.type == "inline" and rows:
                rows[-1].append(_plain_text(tok.children or []).replace("\n", " "))
            end += 1
        if not rows:
            return end
        source_map = tokens[i].map
        lines = self.lines[source_map[0] : source_map[1]] if source_map else []
        budget = _utf16_len("\n".join(lines))
        for level, style in enumerate(_TABLE_STYLES):
            text = _aligned(rows, aligns, style)
            if _utf16_len(text) <= budget:
                break
            if level >= self.table_level:
                self.padded_tables = True
                break
        else:
            text = self.as_is(lines)
        if text.strip():
            self.pre(text, "")
        return end

    def as_is(self, lines: Sequence[str]) -> str:
        """Source lines without their container prefixes (indentation, `>`) or blank lines."""
        out = []
        for line in lines:
            text = line
            for _ in range(self.frames[-1].quote_depth):
                text = text.lstrip(" \t").removeprefix(">")
            if text.strip():
                out.append(text.strip())
        return "\n".join(out)


def _in_link(marks: tuple[_Mark, ...]) -> bool:
    return any(mark.kind == "a" for mark in marks)


def _linkable(url: str) -> bool:
    return _LINKABLE.match(url) is not None


def _link_text(url: str) -> str:
    """The URL as a reader would write it (percent-encoding and punycode undone)."""
    return _parser().normalizeLinkText(url)


def _plain_text(tokens: Sequence[Token]) -> str:
    """The text of inline tokens with all markup dropped (alt text, table cells)."""
    out: list[str] = []
    todo: list[Iterator[Token]] = [iter(tokens)]
    while todo:
        tok = next(todo[-1], None)
        if tok is None:
            todo.pop()
        elif tok.type == "image":
            todo.append(iter(tok.children or []))
        elif tok.type in ("softbreak", "hardbreak"):
            out.append("\n")
        else:
            out.append(tok.content)
    return "".join(out)


def _width(text: str) -> int:
    """Columns `text` takes in a monospace font: wide East Asian characters count twice."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def _aligned(rows: list[list[str]], aligns: list[str], style: str) -> str:
    """The table in columns; `style` is the cell separator, followed by "+" when the header
    gets a rule."""
    columns = max(len(row) for row in rows)
    widths = [max(1, *(_width(row[c]) for row in rows if c < len(row))) for c in range(columns)]
    lines = []
    for n, row in enumerate(rows):
        cells = []
        for c, width in enumerate(widths):
            cell = row[c] if c < len(row) else ""
            gap = width - _width(cell)
            align = aligns[c] if c < len(aligns) else "left"
            left = gap if align == "right" else gap // 2 if align == "center" else 0
            cells.append(" " * left + cell + " " * (gap - left))
        lines.append(style.rstrip("+").join(cells).rstrip())
        if n == 0 and style.endswith("+"):
            rule = style.rstrip("+").replace(" ", "-").replace("|", "+")
            lines.append(rule.join("-" * width for width in widths))
    return "\n".join(lines)


def _common(old: Sequence[_Mark], new: Sequence[_Mark]) -> int:
    """How many outer entities two runs share; code and pre entities are never continued."""
    n = 0
    while n < len(old) and n < len(new) and old[n] == new[n] and new[n].kind not in _ATOMIC:
        n += 1
    return n


def _html_open(mark: _Mark) -> str:
    if mark.kind == "quote":
        return "<blockquote>"
    if mark.kind == "a":
        return '<a href="' + html.escape(mark.arg, quote=False).replace('"', "&quot;") + '">'
    if mark.kind == "pre":
        return f'<pre><code class="language-{mark.arg}">' if mark.arg else "<pre>"
    return f"<{mark.kind}>"


def _html_close(mark: _Mark) -> str:
    if mark.kind == "quote":
        return "</blockquote>"
    if mark.kind == "pre":
        return "</code></pre>" if mark.arg else "</pre>"
    return f"</{mark.kind}>"


def _write_html(runs: Sequence[_Run]) -> str:
    out: list[str] = []
    opened: tuple[_Mark, ...] = ()
    for run in runs:
        keep = _common(opened, run.marks)
        out.extend(_html_close(mark) for mark in reversed(opened[keep:]))
        out.extend(_html_open(mark) for mark in run.marks[keep:])
        out.append(html.escape(run.text, quote=False))
        opened = run.marks
    out.extend(_html_close(mark) for mark in reversed(opened))
    return "".join(out)


_V2_OPEN = {"b": "*", "i": "_", "s": "~", "code": "`", "a": "["}


def _v2_open(mark: _Mark) -> str:
    return f"```{mark.arg}\n" if mark.kind == "pre" else _V2_OPEN[mark.kind]


def _v2_close(mark: _Mark) -> str:
    if mark.kind == "pre":
        # Right after the content: whether Telegram keeps a newline before the closing fence
        # is not documented, and the length contract cannot afford one.
        return "```"
    if mark.kind == "a":
        return "](" + _V2_URL_SPECIAL.sub(r"\\\1", mark.arg) + ")"
    return _V2_OPEN[mark.kind]


def _write_v2(runs: Sequence[_Run]) -> str:
    # MarkdownV2 quotes are lines starting with ">": split the runs into lines (a code block is
    # one unit), then decide which lines carry the ">".
    lines: list[list[_Run]] = [[]]
    breaks_quoted: list[bool] = []
    for run in runs:
        if run.text == "\n" and run.marks in ((), (_QUOTE,)):
            breaks_quoted.append(run.marks == (_QUOTE,))
            lines.append([])
        else:
            lines[-1].append(run)
    prefixed = [
        bool(line) and all(r.marks[:1] == (_QUOTE,) and r.marks[-1].kind != "pre" for r in line)
        for line in lines
    ]
    # A blank line inside a quote stays in it only between two quoted lines.
    after = prefixed.copy()
    for n in reversed(range(len(lines) - 1)):
        if not lines[n]:
            after[n] = after[n + 1]
    before = False
    for n, line in enumerate(lines):
        if line:
            before = prefixed[n]
        elif n:
            prefixed[n] = before and after[n] and breaks_quoted[n - 1]
    out: list[str] = []
    for n, line in enumerate(lines):
        if n:
            out.append("\n")
        if prefixed[n]:
            out.append(">")
        opened: tuple[_Mark, ...] = ()
        for run in line:
            marks = tuple(mark for mark in run.marks if mark.kind != "quote")
            keep = _common(opened, marks)
            out.extend(_v2_close(mark) for mark in reversed(opened[keep:]))
            out.extend(_v2_open(mark) for mark in marks[keep:])
            special = _V2_CODE_SPECIAL if marks and marks[-1].kind in _ATOMIC else _V2_SPECIAL
            out.append(special.sub(r"\\\1", run.text))
            opened = marks
        out.extend(_v2_close(mark) for mark in reversed(opened))
    return "".join(out)
