"""Markdown as an LLM writes it ⇄ Slack `mrkdwn` message text (`chat.postMessage`, `chat.update`).

Pure functions, no state. `adapters.markdown` reads the Markdown (markdown-it-py, CommonMark
with the GFM strikethrough and table rules) into a list of styled runs of visible text, as it
does for `adapters.telegram.markup`; the runs are then written as mrkdwn.

Rules where Slack and CommonMark do not meet:

* Bold `*b*`, italic `_i_`, strikethrough `~s~`, inline code and links `<url|text>` never span a
  line break: a style is closed at the end of each line and reopened on the next. Whitespace at
  the edges of a style is moved outside it (Slack needs a non-space next to each marker).
* Slack formats only at word boundaries, so a marker that touches a letter, digit, emoji or
  other non-punctuation character on its outside gets a zero-width space (U+200B) between them
  (`un*believ*able` → `un`, U+200B, `_believ_`, U+200B, `able`); nowhere else, since it is the
  one thing that makes intra-word formatting work and some clients are reported to dislike it
  elsewhere. A marker that would otherwise read as part of a bare URL before it gets one too.
* Literal `*`, `_`, `~` (text that is not formatting, e.g. `\\*`, `2 * 3`, `snake_case`) are kept
  where Slack cannot pair them. Slack's rules are not published; this module assumes a marker
  opens only after a non-letter-or-digit and before a non-space, and closes only after a
  non-space and before a non-letter-or-digit, and it pairs across lines as well, to be safe. So
  a marker with letters or digits on both sides, or whitespace on both sides, is always kept;
  any other is kept only if nothing it could pair with exists anywhere in the message (no
  formatting marker of the same kind, no same marker in a bare URL or next to it, no other
  literal that could close or open it). Otherwise it becomes a look-alike: `∗` (U+2217), `ˍ`
  (U+02CD), `∼` (U+223C). A zero-width space next to it would not do: Slack takes one as a word
  boundary, which is what makes formatting work. Literal backticks always become `ˋ` (U+02CB),
  also inside inline code (Slack has no way to put one there). Characters of bare `http(s)://`
  and `mailto:` URLs in text are never replaced (Slack links those URLs itself).
* A line of text starting with `>` (or `＞`), which Slack would show as a quote, gets a soft
  hyphen (U+00AD) before it.
* Headings are bold lines, thematic breaks "———", bullets "• ", ordered items keep the number
  written in the source ("7. "); a nested list is indented two spaces per level (never more
  than the source spent on the prefix). Blocks are separated by a blank line when the source
  had one between them, else by a newline.
* Quotes are lines prefixed "> " (a blank quoted line is ">"). Only a top-level blockquote is a
  quote; one nested in a quote or in a list item just shows its content. Code blocks and tables
  inside a quote are written outside it (the quote resumes after them).
* Code blocks are written ```` ```code``` ```` (Slack has no language tag). Backticks that touch
  each other or the fence get a zero-width space between them so the block cannot end early.
* Only http(s) and mailto links become links, written `<url>` when the text is the URL itself.
  The URL is written readably (percent-encoding of non-ASCII undone) with whitespace, `|`, `<`,
  `>` and backticks percent-encoded and `&` escaped. Styles inside a link's text are dropped
  (Slack styles a link as a whole); styles around it apply; a line break in it is a space. An
  autolinked e-mail address is shown as text (Slack links it itself). Images are links whose
  text is the alt text.
* A table becomes a code block with its columns aligned: " | " between cells and a "-+-" rule
  under the header, without the rule if that is too long, and as its source lines if even that
  is longer than the table's source.
* Raw HTML is shown as text. `&`, `<` and `>` are escaped as `&amp;`, `&lt;`, `&gt;` everywhere
  (text, code, link text; `&` also in URLs): the only syntax in the output is this module's own.

Length contract, relied on by the chunker: `to_mrkdwn(markdown)` is never longer than
`markdown` plus 4 characters for each `&`, `<`, `>` and `＞` in it plus `LENGTH_OVERHEAD`,
counted in code points and in UTF-16 code units alike (so at most 5× + 32 for pathological
input; `mrkdwn_length` gives the exact figure). If a rendering would break that, or would show
nothing for a non-blank input, or fails, the input is sent as plain text: escaped, with literal
markers and quote-like lines made safe as above. Blank input gives "" (Slack rejects empty text:
the caller must not send it).

`from_slack` reads what Slack sends: `<@U1>` and `<@U1|name>` become "@" and the name from
`users`, else the one in the token, else the ID; a leading mention of `bot_user_id` (with the
whitespace, ":" or "," after it) is removed; `<#C1|general>` becomes "#general" (else "#C1");
`<!here>`, `<!channel>`, `<!everyone>` become "@here" and so on, `<!subteam^S1|@team>` and
`<!date^…|text>` their text; `<url|text>` becomes "text (url)" unless the text is the URL or
the URL without its scheme (what the user typed), `<url>` the URL; `&lt;`, `&gt;`, `&amp;` are
decoded. Any other text, Slack's own formatting markers included, is kept; it never raises.
"""

from __future__ import annotations

import bisect
import itertools
import re
import string
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

from adapters.markdown import (
    Mark,
    Options,
    Run,
    common,
    link_text,
    normalize,
    quote_lines,
    render,
    utf16_len,
)
from adapters.markdown import parser as _parser

__all__ = ["LENGTH_OVERHEAD", "from_slack", "mrkdwn_length", "to_mrkdwn"]

LENGTH_OVERHEAD = 32
"""What block syntax may add to a message beyond the escapes (code fences, quote prefixes)."""
_ESCAPE_GROWTH = 4
"""The most one `&`, `<`, `>` or `＞` grows: `&amp;`, or a soft hyphen and `&gt;` at a line
start."""

_MARKER = {"b": "*", "i": "_", "s": "~"}

_FENCE = "```"
_ZWSP = "\u200b"
_SOFT_HYPHEN = "\u00ad"
_LOOKALIKE = {"*": "\u2217", "_": "\u02cd", "~": "\u223c", "`": "\u02cb"}
_NO_GAP = frozenset(string.punctuation) | {_ZWSP, _SOFT_HYPHEN}
"""Characters next to which a marker works without a zero-width space (besides whitespace)."""
_OPTIONS = Options(
    linkable=re.compile(r"(?:https?://[^\s/?#]|mailto:\S)", re.IGNORECASE),
    languages=False,
    link_break=" ",
    measure=len,
    table_overhead=2 * len(_FENCE),
)
"""Slack links no app URLs, has no code languages, cannot break a link's line, and pays for a
table's code fences out of its source."""
_BARE_URL = re.compile(r"(?:https?://|mailto:)[^\s<>`\u200b]*", re.IGNORECASE)
_URL_TRAILING = ".,:;!?'\"*_~"
_URL_STOP = re.compile(r"[\s<>`\u200b]|&lt;|&gt;")
_URL_UNSAFE = re.compile(r"[\s|<>`\x00-\x1f\x7f]")
_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_CODE_TICKS = re.compile(r"`(?=`)")


def to_mrkdwn(markdown: str) -> str:
    """Slack mrkdwn for `markdown`: valid for any input, within the module's length contract."""
    try:
        runs = _runs(markdown)
        text = None if runs is None else _write(runs)
    # This runs on every streamed edit of every answer: a parser or renderer bug must degrade
    # to plain text, never lose the message.
    except Exception:
        text = None
    if text is None or not _fits(text, _budget(markdown)):
        return _plain(markdown)
    return text


def mrkdwn_length(markdown: str) -> int:
    """The length of `to_mrkdwn(markdown)` in UTF-16 code units (never less than code points)."""
    return utf16_len(to_mrkdwn(markdown))


def from_slack(
    text: str, *, bot_user_id: str | None = None, users: Mapping[str, str] | None = None
) -> str:
    """Slack message text as the plain text the agent reads (rules in the module doc)."""
    names: Mapping[str, str] = users or {}
    if bot_user_id:
        lead = re.match(r"\s*<@" + re.escape(bot_user_id) + r"(?:\|[^<>]*)?>[\s:,]*", text)
        if lead:
            text = text[lead.end() :]

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        if inner is None:
            return _SLACK_ENTITIES[match.group(2)]
        return _slack_token(inner, names) if inner.partition("|")[0] else _decode(match.group(0))

    return _SLACK_SYNTAX.sub(replace, text)


# --- Slack → text ------------------------------------------------------------------------------

_SLACK_SYNTAX = re.compile(r"<([^<>\n]*)>|&(amp|lt|gt);")
_SLACK_ENTITY = re.compile(r"&(amp|lt|gt);")
_SLACK_ENTITIES = {"amp": "&", "lt": "<", "gt": ">"}
_SPECIAL_MENTIONS = frozenset({"here", "channel", "everyone"})
_SCHEME = re.compile(r"(?:https?://|mailto:)", re.IGNORECASE)


def _scheme_end(url: str) -> int:
    match = _SCHEME.match(url)
    return match.end() if match else 0


def _decode(text: str) -> str:
    return _SLACK_ENTITY.sub(lambda match: _SLACK_ENTITIES[match.group(1)], text)


def _slack_token(inner: str, users: Mapping[str, str]) -> str:
    """The plain text for the inside of one `<...>` token."""
    target, _, label = inner.partition("|")
    label = _decode(label)
    if target.startswith("@"):
        user = target[1:]
        return "@" + (users.get(user) or label or user).removeprefix("@")
    if target.startswith("#"):
        return "#" + (label or target[1:]).removeprefix("#")
    if target.startswith("!"):
        command, _, argument = target[1:].partition("^")
        if command in _SPECIAL_MENTIONS:
            return "@" + command
        if label:
            return label  # a user group's handle, a date's fallback text
        return "@" + (argument.partition("^")[0] if command == "subteam" else command)
    url = _decode(target)
    if not label or label == url:
        return url
    typed = url[_scheme_end(url) :]
    if label in (typed, typed.removesuffix("/")):
        return label  # what the user typed, linked by Slack
    return f"{label} ({url})"


# --- Markdown → runs ---------------------------------------------------------------------------


def _budget(markdown: str) -> tuple[int, int]:
    """The longest output allowed for `markdown`, in code points and in UTF-16 code units."""
    extra = _ESCAPE_GROWTH * sum(markdown.count(c) for c in "&<>＞") + LENGTH_OVERHEAD
    return len(markdown) + extra, utf16_len(markdown) + extra


def _fits(text: str, budget: tuple[int, int]) -> bool:
    return len(text) <= budget[0] and utf16_len(text) <= budget[1]


def _runs(markdown: str) -> list[Run] | None:
    """The styled runs for `markdown`, or None when it must be sent as plain text."""
    runs = render(normalize(markdown), _OPTIONS, md=_parser()).runs
    shown = "".join(run.text for run in runs)
    if not shown.strip() and markdown.strip():
        return None
    return runs


# --- Runs → mrkdwn -----------------------------------------------------------------------------

_Role = Literal["syntax", "prefix", "open", "close", "text", "code", "pre", "url", "bare"]
"""What a piece of output is: this module's syntax (`prefix` starts a quoted line, `open` and
`close` are style and code markers), visible text, inline code or code block content, a link's
URL, or a bare URL inside text."""


class _Piece(NamedTuple):
    text: str
    role: _Role


class _Item(NamedTuple):
    """One element of a line: a style marker, text, inline code, a link or a code block."""

    kind: Literal["open", "close", "text", "code", "link", "pre"]
    text: str
    url: str = ""


def _write(runs: Sequence[Run]) -> str:
    # Quotes are lines starting with ">".
    pieces: list[_Piece] = []
    for n, (line, quoted) in enumerate(quote_lines(runs)):
        if n:
            pieces.append(_Piece("\n", "syntax"))
        if quoted:
            pieces.append(_Piece("> " if line else ">", "prefix"))
        for item in _tidy(_items(line)):
            pieces.extend(_item_pieces(item))
    return _finish(pieces)


def _items(line: Sequence[Run]) -> list[_Item]:
    """The line's runs as style markers around text and atoms (code, links, code blocks)."""
    items: list[_Item] = []
    opened: tuple[Mark, ...] = ()
    for run in line:
        marks = tuple(mark for mark in run.marks if mark.kind != "quote")
        styles, atom = marks, None
        for n, mark in enumerate(marks):
            if mark.kind in ("a", "code", "pre"):
                # Styles inside a link are dropped: Slack styles a link as a whole.
                styles, atom = marks[:n], mark
                break
        keep = common(opened, styles)
        items.extend(_Item("close", _MARKER[mark.kind]) for mark in reversed(opened[keep:]))
        items.extend(_Item("open", _MARKER[mark.kind]) for mark in styles[keep:])
        opened = styles
        last = items[-1] if items else None
        if atom is None:
            items.append(_Item("text", run.text))
        elif atom.kind == "a":
            if last is not None and last.kind == "link" and last.url == atom.arg:
                items[-1] = last._replace(text=last.text + run.text)
            else:
                items.append(_Item("link", run.text, atom.arg))
        elif atom.kind == "code":
            if last is not None and last.kind == "code":
                items[-1] = last._replace(text=last.text + run.text)
            else:
                items.append(_Item("code", run.text))
        else:
            items.append(_Item("pre", run.text))
    items.extend(_Item("close", _MARKER[mark.kind]) for mark in reversed(opened))
    return items


def _tidy(items: list[_Item]) -> list[_Item]:
    """Moves whitespace at the edges of styles outside them and drops styles left empty."""
    i = 0
    while i < len(items):
        if items[i].kind not in ("open", "close"):
            i += 1
            continue
        j = i
        while j < len(items) and items[j].kind in ("open", "close"):
            j += 1
        closes = [item for item in items[i:j] if item.kind == "close"]
        opens = [item for item in items[i:j] if item.kind == "open"]
        moved = ""
        if closes and i and items[i - 1].kind == "text":
            text = items[i - 1].text
            kept = text.rstrip()
            moved = text[len(kept) :]
            items[i - 1] = _Item("text", kept)
        if opens and j < len(items) and items[j].kind == "text":
            text = items[j].text
            kept = text.lstrip()
            moved += text[: len(text) - len(kept)]
            items[j] = _Item("text", kept)
        block = closes + ([_Item("text", moved)] if moved else []) + opens
        items[i:j] = block
        i += len(block)
    out: list[_Item] = []
    for item in items:
        if item.kind == "text" and not item.text:
            continue
        if item.kind == "close" and out and out[-1] == _Item("open", item.text):
            out.pop()
            continue
        out.append(item)
    return out


def _item_pieces(item: _Item) -> list[_Piece]:
    if item.kind in ("open", "close"):
        return [_Piece(item.text, "open" if item.kind == "open" else "close")]
    if item.kind == "pre":
        return [_Piece(_FENCE, "syntax"), _Piece(item.text, "pre"), _Piece(_FENCE, "syntax")]
    if item.kind == "code":
        if not item.text.strip():
            return _text_pieces(item.text)
        return [_Piece("`", "open"), _Piece(item.text, "code"), _Piece("`", "close")]
    if item.kind == "link":
        label = item.text.replace("\n", " ")
        if item.url[:7].lower() == "mailto:" and label == item.url[7:]:
            return _text_pieces(label)  # an autolinked address: Slack links it itself
        url = _slack_url(item.url)
        if not label.strip() or label == link_text(item.url):
            return [_Piece("<", "syntax"), _Piece(url, "url"), _Piece(">", "syntax")]
        return [
            _Piece("<", "syntax"),
            _Piece(url, "url"),
            _Piece("|", "syntax"),
            _Piece(label, "text"),
            _Piece(">", "syntax"),
        ]
    return _text_pieces(item.text)


def _text_pieces(text: str) -> list[_Piece]:
    """Visible text, with bare URLs in it set apart so their characters are never replaced."""
    pieces: list[_Piece] = []
    start = 0
    for match in _BARE_URL.finditer(text):
        url = match.group(0).rstrip(_URL_TRAILING)
        while url.endswith(")") and url.count(")") > url.count("("):
            url = url[:-1].rstrip(_URL_TRAILING)
        if match.start() > start:
            pieces.append(_Piece(text[start : match.start()], "text"))
        pieces.append(_Piece(url, "bare"))
        start = match.start() + len(url)
    if start < len(text):
        pieces.append(_Piece(text[start:], "text"))
    return pieces


def _slack_url(href: str) -> str:
    """The link target as written inside `<...|...>`: readable, nothing that ends the token."""
    return _URL_UNSAFE.sub(
        lambda match: "".join(f"%{byte:02X}" for byte in match.group(0).encode()),
        link_text(href),
    )


def _word(c: str) -> bool:
    return c.isalnum()


def _can_open(text: str, k: int) -> bool:
    """Whether the marker at `k` could open formatting: a boundary before, no space after."""
    return k + 1 < len(text) and not text[k + 1].isspace() and (k == 0 or not _word(text[k - 1]))


def _can_close(text: str, k: int) -> bool:
    """Whether the marker at `k` could close formatting: no space before, a boundary after."""
    return k > 0 and not text[k - 1].isspace() and (k + 1 == len(text) or not _word(text[k + 1]))


def _unsafe_literals(pieces: Sequence[_Piece]) -> list[int]:
    """Offsets (in the joined pieces) of literal `*`, `_`, `~` that Slack could pair with
    something; a literal that can neither open nor close is always safe."""
    text = "".join(piece.text for piece in pieces)
    roles: list[_Role] = []
    for piece in pieces:
        roles.extend([piece.role] * len(piece.text))
    unsafe: list[int] = []
    for marker in "*_~":
        if marker not in text:
            continue
        ours = False
        literals: list[tuple[int, bool, bool, bool]] = []
        k = text.find(marker)
        while k >= 0:
            if roles[k] in ("open", "close", "bare"):
                ours = True  # formatting, or a marker in a URL that must not change
            elif roles[k] == "text":
                opens, closes = _can_open(text, k), _can_close(text, k)
                touching = marker in (text[k - 1 : k], text[k + 1 : k + 2])
                if opens or closes or touching:
                    literals.append((k, opens, closes, touching))
            k = text.find(marker, k + 1)
        last_closer = max((k for k, _, closes, _ in literals if closes), default=-1)
        first_opener = min((k for k, opens, _, _ in literals if opens), default=len(text))
        for k, opens, closes, touching in literals:
            if (
                ours
                or touching
                or (opens and last_closer >= k + 2)
                or (closes and first_opener <= k - 2)
            ):
                unsafe.append(k)
    unsafe.sort()
    return unsafe


def _escape(text: str) -> str:
    return text.translate(_ESCAPES)


def _pre_text(code: str) -> str:
    """Code block content that cannot end the block: no two backticks touch, nor the fence."""
    code = _CODE_TICKS.sub("`" + _ZWSP, _escape(code))
    if code.startswith("`"):
        code = _ZWSP + code
    if code.endswith("`"):
        code += _ZWSP
    return code


def _finish(pieces: Sequence[_Piece]) -> str:  # noqa: C901, PLR0912 - one branch per mrkdwn token kind
    """Joins the pieces: unsafe literals replaced, text escaped, quote-like line starts and
    markers that touch a word guarded."""
    unsafe = _unsafe_literals(pieces)
    out: list[_Piece] = []
    offset = 0
    line_start = True
    for raw, role in pieces:
        end = offset + len(raw)
        text = raw
        if role == "text":
            lo, hi = bisect.bisect_left(unsafe, offset), bisect.bisect_left(unsafe, end)
            if lo < hi:
                chars = list(text)
                for k in unsafe[lo:hi]:
                    chars[k - offset] = _LOOKALIKE[chars[k - offset]]
                text = "".join(chars)
            text = _escape(text.replace("`", _LOOKALIKE["`"]))
            if line_start:
                body = text.lstrip()
                if body.startswith(("&gt;", "＞")):
                    text = text[: len(text) - len(body)] + _SOFT_HYPHEN + body
                line_start = not body
        elif role == "code":
            text = _escape(text.replace("`", _LOOKALIKE["`"]))
        elif role == "pre":
            text = _pre_text(text)
        elif role == "url":
            text = text.replace("&", "&amp;")
        elif role == "bare":
            text = _escape(text)
        if role == "prefix" or (role == "syntax" and text == "\n"):
            line_start = True
        elif role != "text":
            line_start = False
        if text:
            out.append(_Piece(text, role))
        offset = end
    # Markers touching a word on their outside get a zero-width space, so Slack sees a boundary;
    # so do markers that would otherwise read as part of a bare URL before them.
    joined: list[str] = []
    word = ""
    """The output since the last character that ends a URL."""
    for n, (text, role) in enumerate(out):
        before = out[n - 1] if n else None
        if (
            role == "open"
            and before is not None
            and before.role != "open"
            and (_gap(before.text[-1]) or _SCHEME.search(word))
        ):
            joined.append(_ZWSP)
            word = ""
        if role == "close" and _SCHEME.search(word):
            rest = next((p.text for p in itertools.islice(out, n, None) if p.role != "close"), " ")
            if not rest[0].isspace():
                joined.append(_ZWSP)
                word = ""
        joined.append(text)
        stops = list(_URL_STOP.finditer(text))
        word = text[stops[-1].end() :] if stops else word + text
        after = out[n + 1] if n + 1 < len(out) else None
        if role == "close" and after is not None and after.role != "close" and _gap(after.text[0]):
            joined.append(_ZWSP)
            word = ""
    return "".join(joined)


def _gap(c: str) -> bool:
    """Whether a marker next to `c` needs a zero-width space to count as at a word boundary."""
    return not c.isspace() and c not in _NO_GAP


def _plain(markdown: str) -> str:
    """`markdown` as plain text: escaped, literal markers made safe, nothing formatted."""
    try:
        pieces: list[_Piece] = []
        for n, line in enumerate(normalize(markdown).split("\n")):
            if n:
                pieces.append(_Piece("\n", "syntax"))
            pieces.extend(_text_pieces(line))
        return _finish(pieces)
    except Exception:
        # Never reached in practice; the last resort keeps every guarantee but keeps nothing.
        text = _escape(normalize(markdown))
        for marker, lookalike in _LOOKALIKE.items():
            text = text.replace(marker, lookalike)
        return re.sub(r"(?m)^(\s*)(&gt;|＞)", "\\1" + _SOFT_HYPHEN + "\\2", text)
