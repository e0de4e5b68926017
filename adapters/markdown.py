"""Markdown as an LLM writes it → styled runs of visible text, shared by the chat renderers.

Pure functions, no state. markdown-it-py reads the Markdown (CommonMark with the GFM
strikethrough and table rules); `render` walks its flat token stream into `Run`s of visible
text, each with the `Mark`s (entities) around it, which a platform module then writes in its own
syntax. `Options` holds where the platforms differ.

Rules common to every platform:

* Headings are bold lines, thematic breaks "———", bullets "• ", ordered items keep the number
  written in the source ("7. "); a nested list is indented two spaces per level, and only the
  first line of each block is indented, never by more characters than the source line spent on
  its prefix.
* Blocks are separated by a blank line when the source had one between them, else by a newline;
  a newline never carries an entity other than the quote.
* Only a top-level blockquote is a quote (the first mark of its runs); one nested in another
  quote or in a list item just shows its content.
* Only URLs matching `Options.linkable` become links; a link with no text shows its URL, code
  in a link is plain link text, a link in a link is text. Images are links whose text is the
  alt text.
* Empty or blank code blocks are left out. A table becomes a code block with its columns
  aligned (`TABLE_STYLES`), or its source lines when the aligned forms are too long.
* Raw HTML is shown as text.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = [
    "ATOMIC",
    "QUOTE",
    "TABLE_STYLES",
    "Mark",
    "MarkKind",
    "Options",
    "Rendering",
    "Run",
    "common",
    "link_text",
    "normalize",
    "parser",
    "quote_lines",
    "render",
    "utf16_len",
]

MarkKind = Literal["quote", "a", "b", "i", "s", "code", "pre"]


class Mark(NamedTuple):
    """One entity around a run; `arg` is the URL of a link or the language of a code block."""

    kind: MarkKind
    arg: str = ""


class Run(NamedTuple):
    """Visible text with the entities around it, outermost first (a quote is always first)."""

    text: str
    marks: tuple[Mark, ...]


QUOTE = Mark("quote")
ATOMIC = frozenset({"code", "pre"})
"""Mark kinds whose content is one unit: never continued from one run to the next."""
TABLE_STYLES = (" | +", " | ")
"""Table layouts, nicest first: cells between " | ", with or without a rule under the header."""

_BOLD = Mark("b")
_CODE = Mark("code")
_STYLE_OPEN = {"strong_open": _BOLD, "em_open": Mark("i"), "s_open": Mark("s")}
_STYLE_CLOSE = frozenset({"strong_close", "em_close", "s_close"})
_BULLET = "•"
_RULE = "———"
_ALIGN = re.compile(r"text-align:\s*(left|center|right)")
_LANG_JUNK = re.compile(r"[^A-Za-z0-9_+-]")


@dataclass(frozen=True)
class Options:
    """What differs between platforms when Markdown becomes runs."""

    linkable: re.Pattern[str]
    """Matches the start of a URL that may become a link."""
    languages: bool
    """Whether a code block's mark keeps its fence language (first word, `[A-Za-z0-9_+-]`)."""
    link_break: str
    """What a line break inside a link's text shows as."""
    measure: Callable[[str], int]
    """The length a table's text and its source lines are compared by."""
    table_overhead: int = 0
    """What writing a table's code block adds to its text (fences), paid for by its source."""


class Rendering(NamedTuple):
    """The runs for a Markdown text, and whether some table came out longer than its source."""

    runs: list[Run]
    padded_tables: bool


def utf16_len(text: str) -> int:
    """The length of `text` in UTF-16 code units."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def normalize(markdown: str) -> str:
    """The input as markdown-it reads it: newlines unified, NUL replaced."""
    return markdown.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")


@functools.cache
def parser() -> MarkdownIt:
    """The shared parser; markdown-it instances are not mutated by parsing."""
    return MarkdownIt("commonmark").enable(["strikethrough", "table"])


def link_text(url: str) -> str:
    """The URL as a reader would write it (percent-encoding and punycode undone)."""
    return parser().normalizeLinkText(url)


def render(
    source: str,
    options: Options,
    *,
    md: MarkdownIt,
    table_level: int = len(TABLE_STYLES),
) -> Rendering:
    """The runs for normalized `source` as parsed by `md`; `TABLE_STYLES` before `table_level`
    are used only where they fit the table's source, the one at it even where it does not."""
    return _Builder(source, options, table_level=table_level).build(md)


def common(old: Sequence[Mark], new: Sequence[Mark]) -> int:
    """How many outer entities two runs share; code and pre entities are never continued."""
    n = 0
    while n < len(old) and n < len(new) and old[n] == new[n] and new[n].kind not in ATOMIC:
        n += 1
    return n


def quote_lines(runs: Sequence[Run]) -> list[tuple[list[Run], bool]]:
    """The runs split at line breaks (a code block is one unit), each line with whether it is
    written as a quoted line: all its runs quoted and none a code block, or blank between two
    quoted lines with quoted breaks."""
    lines: list[list[Run]] = [[]]
    breaks_quoted: list[bool] = []
    for run in runs:
        if run.text == "\n" and run.marks in ((), (QUOTE,)):
            breaks_quoted.append(run.marks == (QUOTE,))
            lines.append([])
        else:
            lines[-1].append(run)
    prefixed = [
        bool(line) and all(r.marks[:1] == (QUOTE,) and r.marks[-1].kind != "pre" for r in line)
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
    return list(zip(lines, prefixed, strict=True))


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
    entry: tuple[list[Run] | None, int] = (None, 0)
    """`_Builder.begin`'s state for this container as a child of its parent."""


class _Builder:
    """Turns one normalized Markdown string into runs by walking markdown-it's flat tokens."""

    def __init__(self, source: str, options: Options, *, table_level: int) -> None:
        self.source = source
        self.options = options
        self.table_level = table_level
        """Styles in `TABLE_STYLES` before this index are used only where they fit the source."""
        self.padded_tables = False
        """Whether some table came out longer than its source lines."""
        self.lines = source.split("\n")
        self.runs: list[Run] = []
        self.shown = 0
        """Code points of visible text emitted so far."""
        self.pending: list[Run] | None = None
        """The separator before the next block, written only if the block displays something."""
        self.frames = [_Frame(indent="", quoted=False, quote_depth=0, in_item=False)]

    def build(self, md: MarkdownIt) -> Rendering:
        tokens = md.parse(self.source)
        i = 0
        while i < len(tokens):
            i = self.block(tokens, i) + 1
        return Rendering(self.runs, self.padded_tables)

    @property
    def base(self) -> tuple[Mark, ...]:
        return (QUOTE,) if self.frames[-1].quoted else ()

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
                self.pre(text, self.language(tok.info))
        elif kind == "hr":
            self.emit(_RULE, self.base)
        elif kind == "inline":
            self.inline(tok.children or [], self.base)
        else:  # html_block and anything unknown: the source text, shown as text
            self.emit(tok.content.rstrip("\n"), self.base)
        self.end(entry, tok.map)
        return i

    def language(self, info: str) -> str:
        """A code block's language from its fence info, if the platform keeps one."""
        if not self.options.languages or not info.strip():
            return ""
        return _LANG_JUNK.sub("", info.split(maxsplit=1)[0])

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
            self.pending = [Run(" ", self.base)]
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

    def begin(self, tok: Token) -> tuple[list[Run] | None, int]:
        """Starts a child block of the current container: queues the separator before it."""
        frame = self.frames[-1]
        entry = (self.pending, self.shown)
        if frame.prev_map is not None and tok.map is not None:
            gap = self.lines[max(frame.prev_map[1] - 1, 0) : tok.map[0]]
            blank = any(not line.strip(" \t>") for line in gap)
            sep = [Run("\n", self.base)] * (2 if blank else 1)
            # Never indent by more characters than the source line spent on its prefix (a tab
            # is one character but four columns).
            line = self.lines[tok.map[0]] if tok.map[0] < len(self.lines) else ""
            indent = frame.indent[: len(line) - len(line.lstrip(" \t>"))]
            self.pending = sep + ([Run(indent, self.base)] if indent else [])
        return entry

    def end(self, entry: tuple[list[Run] | None, int], source_map: Sequence[int] | None) -> None:
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

    def emit(self, text: str, marks: tuple[Mark, ...]) -> None:
        """Appends visible text; a newline never carries an entity other than the quote."""
        if not text:
            return
        self.flush()
        line_marks = marks[:1] if marks[:1] == (QUOTE,) else ()
        for n, piece in enumerate(text.split("\n")):
            if n:
                self.runs.append(Run("\n", line_marks))
            if piece:
                self.runs.append(Run(piece, marks))
        self.shown += len(text)

    def pre(self, text: str, lang: str) -> None:
        self.flush()
        self.runs.append(Run(text, (*self.base, Mark("pre", lang))))
        self.shown += len(text)

    def linkable(self, url: str) -> bool:
        return self.options.linkable.match(url) is not None

    def inline(self, children: Sequence[Token], base: tuple[Mark, ...]) -> None:
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
                ok = self.linkable(href) and not _in_link(marks)
                links.append((ok, href, self.shown))
                stack.append((*marks, Mark("a", href)) if ok else marks)
            elif kind == "link_close":
                if links:
                    ok, href, shown = links.pop()
                    if ok and self.shown == shown:
                        self.emit(link_text(href), marks)
                if len(stack) > 1:
                    stack.pop()
            elif kind == "code_inline":
                self.emit(tok.content, marks if _in_link(marks) else (*marks, _CODE))
            elif kind in ("softbreak", "hardbreak"):
                self.emit(self.options.link_break if _in_link(marks) else "\n", marks)
            elif kind == "image":
                alt = _plain_text(tok.children or [])
                src = str(tok.attrGet("src") or "")
                if _in_link(marks) or not self.linkable(src):
                    self.emit(alt, marks)
                else:
                    self.emit(alt or link_text(src), (*marks, Mark("a", src)))
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
        measure = self.options.measure
        budget = measure("\n".join(lines)) - self.options.table_overhead
        for level, style in enumerate(TABLE_STYLES):
            text = _aligned(rows, aligns, style)
            if measure(text) <= budget:
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


def _in_link(marks: tuple[Mark, ...]) -> bool:
    return any(mark.kind == "a" for mark in marks)


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
