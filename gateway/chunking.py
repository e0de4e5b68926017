"""Splitting an assistant reply into platform-sized chunks, and its plain-text fallback.

Pure functions over strings: no I/O, no state. Lengths are counted either in code points or,
for platforms that count so, in UTF-16 code units (`SendLimits.count_utf16`).
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left
from dataclasses import dataclass
from itertools import compress
from typing import NamedTuple

MIN_CHUNK = 16
"""The smallest `max_len` that `split_chunks` accepts."""

_WS = " \t\n\r\f\v"
_WS_RUN = re.compile(r"[ \t\n\r\f\v]+")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
# CommonMark fence opener: up to 3 spaces, then ``` (no backtick in the info string) or ~~~.
_FENCE_OPEN = re.compile(r"^( {0,3})(`{3,}(?=[^`\r\n]*\r?$)|~{3,})([^\r\n]*?)\r?$", re.M)
_CJK_SENTENCE_END = re.compile("[。！？．][」』”’）]*")
_CJK_SOFT_BREAK = re.compile("[，、；：]")
_SENTENCE_END = frozenset(".!?…")
_CLOSING_QUOTES = frozenset("\"')]}»”’」』）")
_ZWJ = "\u200d"
_FENCE_MARKS = ("```", "~~~")
_FENCE_LIKE = re.compile(r" {0,3}(?:```|~~~)")
_NEWLINE = re.compile("\n")
# Break classes, best first: blank line, line break, sentence end, space, hard cut.
_PARAGRAPH, _LINE, _SENTENCE, _SPACE = 4, 3, 2, 1


def text_length(text: str, *, utf16: bool) -> int:
    """The length of `text` in code points, or in UTF-16 code units (astral = 2) if `utf16`."""
    if not utf16:
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def split_chunks(text: str, max_len: int, *, utf16: bool = False) -> list[str]:
    """Split a Markdown reply into chunks of `text_length(chunk) <= max_len`.

    Text that fits comes back unchanged as one chunk; blank text gives `[]`. Breaks prefer a
    blank line, then a line break, then a space after a sentence, then any space; a word is cut
    only when it alone is too long, never inside a `\\r\\n` (nor, counting UTF-16, a surrogate
    pair). Whitespace at each break is dropped. A chunk that ends inside a fenced code block
    gets the fence closed, and the next chunk reopens it with the same opening line (shortened
    to its language, then to the bare fence, when that line would leave too little room).
    Raises ValueError when `max_len < MIN_CHUNK`.
    """
    if max_len < MIN_CHUNK:
        raise ValueError(f"max_len must be at least {MIN_CHUNK}, got {max_len}")
    if not text.strip():
        return []
    if text_length(text, utf16=utf16) <= max_len:
        return [text]
    return _Splitter(text, max_len, utf16).run()


class _Fence(NamedTuple):
    """One fenced code block, as offsets into the text."""

    line_start: int
    """Start of the opening line."""
    marker_start: int
    """First fence character of the opening line (after its indentation)."""
    content_start: int
    """Just after the opening line's line break."""
    close_start: int
    """Start of the closing line; `len(text)` when the fence is never closed."""
    close_end: int
    """Just after the closing fence's characters; `len(text)` when never closed."""
    after: int
    """Just after the closing line and its line break; `len(text)` when never closed."""
    opener: str
    """The opening line, without its line break."""
    marker: str
    """The fence characters, e.g. "```" or "~~~~"."""


def _scan_fences(text: str) -> list[_Fence]:
    """Every fenced code block in `text`, in order (CommonMark rules, top level only)."""
    fences: list[_Fence] = []
    closers: dict[str, re.Pattern[str]] = {}
    end = len(text)
    pos = 0
    while (m := _FENCE_OPEN.search(text, pos)) is not None:
        marker = m.group(2)
        content_start = min(m.end() + 1, end)
        closer = closers.get(marker)
        if closer is None:
            closer = closers[marker] = re.compile(
                rf"^ {{0,3}}{re.escape(marker[0])}{{{len(marker)},}}[ \t]*\r?$", re.MULTILINE
            )
        c = closer.search(text, content_start)
        close_start = c.start() if c is not None else end
        close_end = c.start() + len(c.group().rstrip(" \t\r")) if c is not None else end
        after = min(c.end() + 1, end) if c is not None else end
        fences.append(
            _Fence(
                line_start=m.start(),
                marker_start=m.start(2),
                content_start=content_start,
                close_start=close_start,
                close_end=close_end,
                after=after,
                opener=m.group(0).rstrip("\r"),
                marker=marker,
            )
        )
        if c is None:
            break
        pos = c.end()
    return fences


@dataclass(frozen=True, slots=True)
class _Repair:
    """The lines added around a break inside one fence."""

    reopen: str
    close: str
    reopen_width: int
    close_width: int


@dataclass(frozen=True, slots=True)
class _Cut:
    """Where one chunk ends and the next begins."""

    end: int
    """End of this chunk's content (trailing whitespace excluded)."""
    next_start: int
    """Where the next chunk's content begins."""
    closes: int | None
    """Index of the fence this chunk closes (and the next reopens), if any."""


def _is_extender(ch: str) -> bool:
    """True for a code point that belongs to the character before it (mark, joiner, modifier)."""
    cp = ord(ch)
    return (
        unicodedata.category(ch) in ("Mn", "Mc", "Me")
        or ch == _ZWJ
        or 0xFE00 <= cp <= 0xFE0F
        or 0x1F3FB <= cp <= 0x1F3FF
        or 0xE0020 <= cp <= 0xE007F
    )


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


class _Splitter:
    """One `split_chunks` call: the text, its fences and the limit."""

    def __init__(self, text: str, max_len: int, utf16: bool) -> None:
        self.text = text
        self.max_len = max_len
        self.utf16 = utf16
        self.fences = _scan_fences(text)
        self.fence_starts = [f.line_start for f in self.fences]
        self.opener_at = {f.marker_start: f.line_start for f in self.fences}
        self.closer_ends = {f.close_end for f in self.fences}
        self.repairs: dict[int, _Repair | None] = {}

    def _width(self, s: str) -> int:
        return text_length(s, utf16=self.utf16)

    def _repair(self, index: int) -> _Repair | None:
        """The reopen/close lines for fence `index`, or None if none leaves room for content."""
        if index not in self.repairs:
            self.repairs[index] = self._repair_for(self.fences[index])
        return self.repairs[index]

    def _repair_for(self, fence: _Fence) -> _Repair | None:
        close = "\n" + fence.marker
        indent = fence.opener[: fence.marker_start - fence.line_start]
        info = fence.opener[fence.marker_start - fence.line_start + len(fence.marker) :].split()
        lang = info[0] if info else ""
        if lang.startswith(fence.marker[0]):
            lang = " " + lang  # glued on, it would lengthen the fence
        min_body = max(8, self.max_len // 4)
        heads = [fence.opener, indent + fence.marker + lang, fence.marker]
        for head in heads:
            reopen = head + "\n"
            widths = self._width(reopen), self._width(close)
            if sum(widths) + min_body <= self.max_len:
                return _Repair(reopen, close, *widths)
        return None

    def _fit(self, start: int, budget: int) -> int:
        """The largest end such that `text[start:end]` is at most `budget` long."""
        end = min(len(self.text), start + max(budget, 0))
        if not self.utf16:
            return end
        seg = self.text[start:end]
        units = seg.encode("utf-16-le", "surrogatepass")
        if len(units) <= 2 * budget:
            return end
        units = units[: 2 * budget]
        if 0xD800 <= int.from_bytes(units[-2:], "little") <= 0xDBFF:
            units = units[:-2]
        return start + len(units.decode("utf-16-le", "surrogatepass"))

    def _rstrip(self, pos: int, floor: int) -> int:
        """`pos` moved back over whitespace, not below `floor`."""
        while pos > floor and self.text[pos - 1] in _WS:
            pos -= 1
        return pos

    def _skip_ws(self, pos: int) -> int:
        m = _WS_RUN.match(self.text, pos)
        return m.end() if m is not None else pos

    def _fence_at(self, pos: int) -> int | None:
        """Index of the fence whose opening line starts before `pos` and is open at `pos`."""
        i = bisect_left(self.fence_starts, pos) - 1
        if i >= 0 and pos <= self.fences[i].close_start:
            return i
        return None

    def _closing(self, end: int, start: int, reopened: int | None) -> int | None:
        """The fence a chunk `text[start:end]` must close, if any."""
        i = self._fence_at(end)
        if i is None or self._repair(i) is None:
            return None
        if self.fences[i].line_start >= start or i == reopened:
            return i
        return None

    def _next_start(self, brk: int, in_code: bool) -> int:
        """Where the next chunk begins after a break at `brk`: past the whitespace, but at the
        start of the line when that line is code, or when stripping its indentation would
        turn it into a fence (a real one, or a 4-space-indented ``` that is not)."""
        text = self.text
        first = self._skip_ws(brk)
        line_start = text.rfind("\n", brk, first) + 1 or (0 if brk == 0 else -1)
        if line_start < 0 or first >= len(text):
            return first
        if in_code or first in self.opener_at or text.startswith(_FENCE_MARKS, first):
            return line_start
        return first

    def _opens_fence_mid_line(self, brk: int, next_start: int) -> bool:
        """True when a chunk starting at `next_start`, cut mid-line, would begin with a fence."""
        return (
            self.text.startswith(_FENCE_MARKS, next_start) and "\n" not in self.text[brk:next_start]
        )

    def run(self) -> list[str]:
        text = self.text
        end = len(text.rstrip(_WS))
        start = self._next_start(0, in_code=False)
        reopened: int | None = None
        chunks: list[str] = []
        while start < end:
            repair = self._repair(reopened) if reopened is not None else None
            prefix = repair.reopen if repair is not None else ""
            room = self.max_len - (repair.reopen_width if repair is not None else 0)
            window = self._fit(start, room)
            if window >= end:
                chunks.append(prefix + text[start:end])
                break
            first = self._skip_ws(start)
            if window <= first:
                start = first  # indentation alone fills the chunk: drop it
                continue
            cut = self._soft_cut(start, first, window, room, reopened)
            if cut is None:
                cut = self._hard_cut(start, first, room, reopened)
            closing = self._repair(cut.closes) if cut.closes is not None else None
            chunks.append(prefix + text[start : cut.end] + (closing.close if closing else ""))
            reopened = cut.closes
            start = cut.next_start
        return chunks

    def _soft_cut(  # noqa: C901, PLR0912 - the cut preferences, tried in order
        self, start: int, first: int, window: int, room: int, reopened: int | None
    ) -> _Cut | None:
        """The best break at whitespace or CJK punctuation within `text[start:window]`."""
        text = self.text
        astral: list[int] = []
        if self.utf16:
            astral = [m.start() for m in _ASTRAL.finditer(text, start, window)]
        # (class, break position, end of whitespace after it)
        found: list[tuple[int, int, int]] = []
        for m in _WS_RUN.finditer(text, start, window + 1):
            gap_start, gap_end = m.span()
            if gap_start <= first:
                continue
            if gap_end == window + 1:
                gap_end = self._skip_ws(gap_end)
            newlines = text.count("\n", gap_start, gap_end)
            if newlines >= 2 or (
                newlines == 1 and (gap_end in self.opener_at or gap_start in self.closer_ends)
            ):
                kind = _PARAGRAPH
            elif newlines == 1:
                kind = _LINE
            elif self._after_sentence(gap_start, first):
                kind = _SENTENCE
            else:
                kind = _SPACE
            found.append((kind, gap_start, gap_end))
        for m in _CJK_SENTENCE_END.finditer(text, first, window):
            found.append((_SENTENCE, m.end(), m.end()))
        for m in _CJK_SOFT_BREAK.finditer(text, first, window):
            found.append((_SPACE, m.end(), m.end()))
        found.sort(reverse=True)
        line_breaks = [m.start() for m in _NEWLINE.finditer(text, start, window)]
        for kind, brk, _gap_end in found:
            cut_end = brk
            i = self._fence_at(cut_end)
            if i is not None and cut_end < self.fences[i].content_start:
                continue  # would end on a fence's opening line
            if kind <= _SENTENCE:
                line = bisect_left(line_breaks, cut_end) - 1
                if _FENCE_LIKE.match(text, line_breaks[line] + 1 if line >= 0 else start):
                    continue  # cut short, a ``` line could become a fence or a closing one
            closes = self._closing(cut_end, start, reopened)
            next_start = self._next_start(brk, closes is not None)
            if self._opens_fence_mid_line(brk, next_start):
                continue
            need = 0
            if closes is not None:
                if next_start >= self.fences[closes].close_start:
                    continue  # nothing but the closing line would be left to reopen
                repair = self._repair(closes)
                assert repair is not None
                need = repair.close_width
            if (cut_end - start) + bisect_left(astral, cut_end) + need <= room:
                return _Cut(cut_end, next_start, closes)
        return None

    def _after_sentence(self, pos: int, floor: int) -> bool:
        """True when `text[:pos]` ends a sentence (., !, ? or …, maybe before quotes)."""
        i = pos - 1
        while i > floor and self.text[i] in _CLOSING_QUOTES:
            i -= 1
        return i >= floor and self.text[i] in _SENTENCE_END

    def _hard_cut(self, start: int, first: int, room: int, reopened: int | None) -> _Cut:
        """Cut inside a word: as late as fits, but not inside a character cluster."""
        reserve = 0
        while True:
            brk = self._fit(start, room - reserve)
            last = self._last_code_end(brk)
            if last is not None and last - 1 > first:
                brk = last - 1  # leave the next chunk some code, not a bare closing line
            brk = self._cluster_boundary(brk, first + 1)
            if self._opens_fence_mid_line(brk, self._skip_ws(brk)):
                # Start the next chunk before the run of fence characters, not with it.
                back = self._rstrip(brk, first + 1)
                while back > first + 1 and self.text[back - 1] in "`~":
                    back -= 1
                if back - 1 > first:
                    brk = self._cluster_boundary(back - 1, first + 1)
            cut_end = self._rstrip(brk, first + 1)
            line = self.text.rfind("\n", start, cut_end) + 1 or start
            if (
                line - 1 > first
                and _FENCE_LIKE.match(self.text, line)
                and "\n" not in self.text[cut_end : self._skip_ws(brk)]
            ):
                brk = line  # cut short, a ``` line could become a fence: cut before it
                cut_end = self._rstrip(brk, first + 1)
            closes = self._closing(cut_end, start, reopened)
            repair = self._repair(closes) if closes is not None else None
            need = repair.close_width if repair is not None else 0
            if need <= reserve:
                break
            if self._fit(start, room - need) <= first:
                closes = None  # no room to close the fence here: leave it open
                break
            reserve = need
        return _Cut(cut_end, self._next_start(brk, closes is not None), closes)

    def _last_code_end(self, pos: int) -> int | None:
        """If `pos` is past the last code in a fence but before its closing fence's end, the
        end of that code (a cut there would strand or split the closing line)."""
        i = bisect_left(self.fence_starts, pos) - 1
        if i < 0 or self.fences[i].close_start == len(self.text):
            return None
        fence = self.fences[i]
        if not fence.content_start < pos < fence.close_end:
            return None
        last = fence.close_start
        while last > fence.content_start and self.text[last - 1] in _WS:
            last -= 1
        return last if pos >= last > fence.content_start else None

    def _cluster_boundary(self, pos: int, floor: int) -> int:
        """`pos`, moved back (not below `floor`) off a combining mark, joiner or flag half."""
        text = self.text
        if pos <= floor or pos >= len(text):
            return max(pos, floor)
        cut = pos
        for _ in range(32):
            if cut <= floor:
                return pos
            if _is_extender(text[cut]) or text[cut - 1] == _ZWJ:
                cut -= 1
                continue
            if _is_regional(text[cut]) and _is_regional(text[cut - 1]):
                run = cut  # pairs are counted from the chunk's start, itself a pair boundary
                while run >= floor and _is_regional(text[run - 1]):
                    run -= 1
                if (cut - run) % 2 == 1:
                    cut -= 1
                    continue
            return cut
        return pos


# A heading, a thematic break, or a `*`/`+` bullet, at the start of a line.
_LINE_MARK = re.compile(
    r"^(?: {0,3}#{1,6}(?:[ \t]+(?P<title>[^\n]*?))??(?:[ \t]+#+)?[ \t]*(?=\r?$)"
    r"|(?P<rule> {0,3}(?P<ch>[-*_])(?:[ \t]*(?P=ch)){2,}[ \t]*(?=\r?$))"
    r"|(?P<indent>[ \t]*)[*+](?=[ \t]))",
    re.MULTILINE,
)
_BLANK_LINE = re.compile(r"(\n[ \t\r]*\n)")
_LINK = re.compile(
    r"(!?)\[((?:[^\[\]\\\n]|\\.|\[[^\[\]\n]*\])*)\]"
    r"\([ \t]*(?:<([^<>\n]*)>|((?:[^\s()\\]|\\.|\([^\s()]*\))+))"
    r"""(?:[ \t]+(?:"[^"\n]*"|'[^'\n]*'|\([^()\n]*\)))?[ \t]*\)"""
)
_INLINE = re.compile(
    r"(?P<escape>\\[!-/:-@\[-`{-~])"
    r"|(?P<hardbreak>\\(?=\r?\n))"
    r"|(?P<code>`+)"
    r"|(?P<autolink><(?:https?|ftp|mailto):[^<>\s]*>)"
    r"|(?P<link>!?\[)"
    r"|(?P<url>(?<![\w/])(?:https?|ftp)://[^\s<>`]+)"
)
_INLINE_MARK = re.compile(r"[*_~`\[\\<]|://")
_DELIMITER_RUN = re.compile(r"\*+|_+|~~")
_URL_TRAILING = ".,;:!?'\"*_~"


def markdown_to_plain(text: str) -> str:
    """Markdown as readable plain text, keeping every word.

    Emphasis and strikethrough markers, inline-code backticks, heading marks, backslash
    escapes and code-fence lines are removed; `[text](url)` becomes `text (url)`; `*`/`+`
    bullets become `-`; code (fenced or inline) and URLs are kept verbatim.
    """
    parts: list[str] = []
    pos = 0
    for fence in _scan_fences(text):
        parts.append(_plain_blocks(text[pos : fence.line_start]))
        indent = fence.marker_start - fence.line_start
        body = text[fence.content_start : fence.close_start]
        if indent:
            body = re.sub(rf"(?m)^ {{1,{indent}}}", "", body)
        parts.append(body)
        pos = fence.after
    parts.append(_plain_blocks(text[pos:]))
    return "".join(parts)


def _plain_blocks(text: str) -> str:
    """`markdown_to_plain` for text with no fenced code: line marks, then inline markup."""
    if not text.strip():
        return text
    pieces = _BLANK_LINE.split(_LINE_MARK.sub(_plain_line_mark, text))
    return "".join(
        _plain_inline(p) if i % 2 == 0 and _INLINE_MARK.search(p) else p
        for i, p in enumerate(pieces)
    )


def _plain_line_mark(m: re.Match[str]) -> str:
    if m.group("indent") is not None:
        return m.group("indent") + "-"
    if m.group("rule") is not None:
        return "---"
    return m.group("title") or ""


def _plain_inline(text: str) -> str:
    """One paragraph's inline markup removed."""
    sentinel = next((chr(cp) for cp in range(0xE000, 0xF900) if chr(cp) not in text), None)
    if sentinel is None:  # every private-use character is taken: leave the markup in place
        return text
    literals: list[str] = []
    marked = _protect(text, sentinel, literals)
    stripped = _strip_emphasis(marked)
    found = iter(literals)
    return re.sub(re.escape(sentinel), lambda _m: next(found), stripped)


def _protect(text: str, sentinel: str, literals: list[str]) -> str:
    """`text` with code, escapes and URLs replaced by `sentinel` (their text appended to
    `literals` in order) and links rewritten, so emphasis can be stripped from the rest."""
    out: list[str] = []
    pos = 0

    def literal(value: str) -> None:
        literals.append(value)
        out.append(sentinel)

    while (m := _INLINE.search(text, pos)) is not None:
        out.append(text[pos : m.start()])
        pos = m.end()
        kind = m.lastgroup
        if kind == "escape":
            literal(m.group()[1])
        elif kind == "hardbreak":
            pass
        elif kind == "code":
            ticks = m.group()
            close = re.compile(rf"(?<!`){ticks}(?!`)").search(text, pos)
            if close is None:
                literal(ticks)
                continue
            code = text[pos : close.start()]
            if len(code) >= 2 and code[0] == code[-1] == " " and code.strip(" "):
                code = code[1:-1]
            literal(code)
            pos = close.end()
        elif kind == "autolink":
            literal(m.group()[1:-1])
        elif kind == "url":
            url = m.group()
            while url and (
                url[-1] in _URL_TRAILING or (url[-1] == ")" and url.count("(") < url.count(")"))
            ):
                url = url[:-1]
            literal(url)
            pos = m.start() + len(url)
        else:
            link = _LINK.match(text, m.start())
            if link is None:
                out.append(m.group())
                continue
            label, url = link.group(2), link.group(3) or link.group(4) or ""
            url = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", url)
            if label.strip(" `<>") in ("", url):
                literal(url or label)
            else:
                out.append(_protect(label, sentinel, literals) + " (")
                literal(url)
                out.append(")")
            pos = link.end()
    out.append(text[pos:])
    return "".join(out)


@dataclass(slots=True)
class _Delimiters:
    """A run of `*`, `_` or `~~`: which of its characters are still unmatched."""

    char: str
    start: int
    end: int
    length: int
    can_open: bool
    can_close: bool


def _is_punctuation(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "PS"


def _strip_emphasis(text: str) -> str:
    """`text` without the `*`, `_` and `~~` runs that pair up as emphasis (CommonMark rules)."""
    runs: list[_Delimiters] = []
    for m in _DELIMITER_RUN.finditer(text):
        start, end = m.span()
        before = text[start - 1] if start > 0 else " "
        after = text[end] if end < len(text) else " "
        space_before, space_after = before.isspace(), after.isspace()
        punct_before, punct_after = _is_punctuation(before), _is_punctuation(after)
        left = not space_after and (not punct_after or space_before or punct_before)
        right = not space_before and (not punct_before or space_after or punct_after)
        if m.group()[0] == "_":
            can_open = left and (not right or punct_before)
            can_close = right and (not left or punct_after)
        else:
            can_open, can_close = left, right
        runs.append(_Delimiters(m.group()[0], start, end, end - start, can_open, can_close))

    keep = bytearray(b"\x01") * len(text)
    openers: list[_Delimiters] = []
    # Per kind of closer, how far down the stack is known to hold no opener for it; this
    # keeps the search linear (CommonMark's "openers_bottom").
    bottom: dict[tuple[str, int, bool], int] = {}
    for run in runs:
        if run.can_close:
            key = (run.char, run.length % 3, run.can_open)
            floor = bottom.get(key, 0)
            j = len(openers) - 1
            while j >= floor and run.end > run.start:
                opener = openers[j]
                if opener.char != run.char or _rule_of_three(opener, run):
                    j -= 1
                    continue
                used = 2 if min(opener.end - opener.start, run.end - run.start) >= 2 else 1
                keep[opener.end - used : opener.end] = bytes(used)
                keep[run.start : run.start + used] = bytes(used)
                opener.end -= used
                run.start += used
                del openers[j + (opener.end > opener.start) :]
                for seen, depth in bottom.items():
                    bottom[seen] = min(depth, len(openers))
                j = len(openers) - 1
            if run.end > run.start:
                bottom[key] = len(openers)
        if run.can_open and run.end > run.start:
            openers.append(run)
    return "".join(compress(text, keep))


def _rule_of_three(opener: _Delimiters, closer: _Delimiters) -> bool:
    """CommonMark's rule: a run that can both open and close pairs only in multiples of 3."""
    both = (opener.can_open and opener.can_close) or (closer.can_open and closer.can_close)
    total = opener.length + closer.length
    return both and total % 3 == 0 and not (opener.length % 3 == 0 and closer.length % 3 == 0)


def split_spoken(text: str, max_len: int, *, utf16: bool = False) -> tuple[str, str]:
    """(the first part of a Markdown reply, at most `max_len` long, the rest): the part a
    voice reply speaks and the text that follows it, cut where `split_chunks` would cut."""
    pieces = split_chunks(text, max_len, utf16=utf16)
    if len(pieces) < 2:
        return (pieces[0] if pieces else ""), ""
    first = pieces[0]
    if text.startswith(first):
        return first, text[len(first) :].strip()
    # The cut fell inside a code block (closed in the first part, reopened in the next).
    return first, "\n".join(pieces[1:])
