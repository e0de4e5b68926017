"""Markdown as an LLM writes it ⇄ Telegram formatted text (`parse_mode` HTML or MarkdownV2).

Pure functions, no state. `adapters.markdown` reads the Markdown (markdown-it-py, CommonMark
with the GFM strikethrough and table rules) into a list of styled runs of visible text, which is
then written in either dialect, so both dialects display exactly the same text.

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

import html
import re
from collections.abc import Sequence

from adapters.markdown import (
    ATOMIC,
    TABLE_STYLES,
    Mark,
    Options,
    Run,
    common,
    normalize,
    quote_lines,
    render,
    utf16_len,
)
from adapters.markdown import parser as _parser

__all__ = ["to_html", "to_markdown_v2", "visible_text"]

_OPTIONS = Options(
    linkable=re.compile(r"(?:https?://[^\s/?#]|tg://[A-Za-z]|mailto:\S)", re.IGNORECASE),
    languages=True,
    link_break="\n",
    measure=utf16_len,
)
"""Telegram links tg:// URLs, keeps code languages, and measures tables as displayed."""
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
        return html.escape(normalize(markdown), quote=False)
    return _write_html(runs)


def to_markdown_v2(markdown: str) -> str:
    """Telegram MarkdownV2 for `markdown`, valid for any input, displaying what `to_html` does."""
    runs = _runs(markdown)
    if runs is None:
        return _V2_SPECIAL.sub(r"\\\1", normalize(markdown))
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


def _runs(markdown: str) -> list[Run] | None:
    """The styled runs for `markdown`, or None when it must be sent as plain text."""
    source = normalize(markdown)
    limit = utf16_len(markdown)
    for table_level in range(len(TABLE_STYLES) + 1):
        try:
            rendering = render(source, _OPTIONS, md=_parser(), table_level=table_level)
        # This runs on every streamed edit of every answer: a parser or renderer bug must
        # degrade to plain text, never lose the message.
        except Exception:
            return None
        shown = "".join(run.text for run in rendering.runs)
        if not shown.strip() and markdown.strip():
            return None
        if utf16_len(shown) <= limit:
            return rendering.runs
        if not rendering.padded_tables:
            return None
    return None


def _html_open(mark: Mark) -> str:
    if mark.kind == "quote":
        return "<blockquote>"
    if mark.kind == "a":
        return '<a href="' + html.escape(mark.arg, quote=False).replace('"', "&quot;") + '">'
    if mark.kind == "pre":
        return f'<pre><code class="language-{mark.arg}">' if mark.arg else "<pre>"
    return f"<{mark.kind}>"


def _html_close(mark: Mark) -> str:
    if mark.kind == "quote":
        return "</blockquote>"
    if mark.kind == "pre":
        return "</code></pre>" if mark.arg else "</pre>"
    return f"</{mark.kind}>"


def _write_html(runs: Sequence[Run]) -> str:
    out: list[str] = []
    opened: tuple[Mark, ...] = ()
    for run in runs:
        keep = common(opened, run.marks)
        out.extend(_html_close(mark) for mark in reversed(opened[keep:]))
        out.extend(_html_open(mark) for mark in run.marks[keep:])
        out.append(html.escape(run.text, quote=False))
        opened = run.marks
    out.extend(_html_close(mark) for mark in reversed(opened))
    return "".join(out)


_V2_OPEN = {"b": "*", "i": "_", "s": "~", "code": "`", "a": "["}


def _v2_open(mark: Mark) -> str:
    return f"```{mark.arg}\n" if mark.kind == "pre" else _V2_OPEN[mark.kind]


def _v2_close(mark: Mark) -> str:
    if mark.kind == "pre":
        # Right after the content: whether Telegram keeps a newline before the closing fence
        # is not documented, and the length contract cannot afford one.
        return "```"
    if mark.kind == "a":
        return "](" + _V2_URL_SPECIAL.sub(r"\\\1", mark.arg) + ")"
    return _V2_OPEN[mark.kind]


def _write_v2(runs: Sequence[Run]) -> str:
    # MarkdownV2 quotes are lines starting with ">".
    out: list[str] = []
    for n, (line, quoted) in enumerate(quote_lines(runs)):
        if n:
            out.append("\n")
        if quoted:
            out.append(">")
        opened: tuple[Mark, ...] = ()
        for run in line:
            marks = tuple(mark for mark in run.marks if mark.kind != "quote")
            keep = common(opened, marks)
            out.extend(_v2_close(mark) for mark in reversed(opened[keep:]))
            out.extend(_v2_open(mark) for mark in marks[keep:])
            special = _V2_CODE_SPECIAL if marks and marks[-1].kind in ATOMIC else _V2_SPECIAL
            out.append(special.sub(r"\\\1", run.text))
            opened = marks
        out.extend(_v2_close(mark) for mark in reversed(opened))
    return "".join(out)
