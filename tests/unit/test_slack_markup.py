"""Markdown → Slack mrkdwn and Slack text → plain text: expected outputs, a validity checker and
the length contract over a corpus of nasty and half-streamed inputs."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import ClassVar, NoReturn

import pytest
from markdown_it import MarkdownIt

from adapters.slack import markup
from adapters.slack.markup import LENGTH_OVERHEAD, from_slack, mrkdwn_length, to_mrkdwn

ZWSP = "\u200b"
SHY = "\u00ad"


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# --- An independent reading of Slack mrkdwn ----------------------------------------------------

ENTITY = re.compile(r"&(amp|lt|gt);")
ENTITIES = {"amp": "&", "lt": "<", "gt": ">"}
LINK = re.compile(r"<((?:https?://|mailto:)[^\s|<>]+)(?:\|([^<>\n]*))?>", re.IGNORECASE)
BARE_URL = re.compile(r"(?:https?://|mailto:)[^\s<>`\u200b]+", re.IGNORECASE)
MASK = "\x01"
"""Stands for characters no formatting can see (inside code, a code block or a URL)."""


@dataclass
class Reading:
    shown: str
    """The text Slack displays (markers of formatting removed, entities decoded)."""
    styles: list[tuple[str, str]] = field(default_factory=list)
    """Each piece of formatting Slack applies: its marker and the text it formats, as shown."""


def trim_url(url: str) -> str:
    """A bare URL without the punctuation after it: trailing `.,:;!?'"*_~`, and `)` that
    closes nothing in it."""
    url = url.rstrip(".,:;!?'\"*_~")
    while url.endswith(")") and url.count(")") > url.count("("):
        url = url[:-1].rstrip(".,:;!?'\"*_~")
    return url


def decode(text: str) -> str:
    for amp in re.finditer("&", text):
        assert ENTITY.match(text, amp.start()), f"stray & at {amp.start()} in {text!r}"
    return ENTITY.sub(lambda match: ENTITIES[match.group(1)], text)


def can_open(text: str, k: int) -> bool:
    return k + 1 < len(text) and not text[k + 1].isspace() and (k == 0 or not text[k - 1].isalnum())


def can_close(text: str, k: int) -> bool:
    return k > 0 and not text[k - 1].isspace() and (k + 1 == len(text) or not text[k + 1].isalnum())


def pairs(text: str, marker: str) -> list[tuple[int, int]]:
    """Where Slack could apply `marker` formatting, pairing greedily across lines (a stricter
    reading than Slack's, which stays within a line)."""
    found: list[tuple[int, int]] = []
    positions = [k for k, c in enumerate(text) if c == marker]
    used: set[int] = set()
    for k in positions:
        if k in used or not can_open(text, k):
            continue
        for j in positions:
            if j >= k + 2 and j not in used and can_close(text, j):
                found.append((k, j))
                used.update((k, j))
                break
    return found


class Reader:
    """Walks mrkdwn, keeping what Slack shows and what its formatting sees side by side."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.seen: list[str] = []
        """What formatting sees: text, with what it cannot see (code, URLs) masked."""
        self.owner: list[int] = []
        """For each character of `seen`, the index in `shown` of what shows it, or -1."""
        self.line_start = True

    def put(self, seen: str, shown: str, *, text: bool = False) -> None:
        if seen in ("\n", "> "):
            self.line_start = True
        elif seen.strip():
            quote = text and shown in (">", "＞")
            assert not (self.line_start and quote), "a line reads as a quote"
            self.line_start = False
        self.owner.extend([len(self.shown) if shown else -1] * len(seen))
        self.seen.append(seen)
        self.shown.append(shown)

    def text(self, text: str) -> None:
        """Visible text: entities decoded, each character its own piece."""
        i = 0
        while i < len(text):
            if text[i] == "&":
                entity = ENTITY.match(text, i)
                assert entity, f"stray & at {i} in {text!r}"
                decoded = ENTITIES[entity.group(1)]
                self.put(decoded, decoded, text=True)
                i = entity.end()
            else:
                self.put(text[i], text[i], text=True)
                i += 1


def check(mrkdwn: str) -> Reading:
    """Asserts `mrkdwn` is valid Slack text with only this module's syntax in it: entities for
    every `&`, `<`, `>` outside links and quote prefixes, balanced code fences, links with
    safe URLs, no quote-like line that is not a quote, and no formatting spanning a line break."""
    assert "````" not in mrkdwn, "a fence touching a backtick"
    reader = Reader()
    i = 0
    while i < len(mrkdwn):
        c = mrkdwn[i]
        if mrkdwn.startswith("```", i):
            end = mrkdwn.find("```", i + 3)
            assert end > i + 3, f"unclosed or empty code block at {i} in {mrkdwn!r}"
            body = mrkdwn[i + 3 : end]
            assert "``" not in body, f"touching backticks in code block {body!r}"
            assert body[:1] != "`" != body[-1:], f"a backtick touching a fence in {body!r}"
            assert not set(body) & set("<>"), f"unescaped markup in code block {body!r}"
            reader.put(MASK, re.sub(f"{ZWSP}(?=`)|(?<=`){ZWSP}", "", decode(body)))
            i = end + 3
        elif c == "`":
            end = mrkdwn.find("`", i + 1)
            assert end > i + 1, f"unclosed or empty code at {i} in {mrkdwn!r}"
            body = mrkdwn[i + 1 : end]
            assert "\n" not in body, "inline code spans a line break"
            assert not set(body) & set("<>"), f"unescaped markup in code {body!r}"
            reader.put("`" + MASK * len(body) + "`", decode(body))
            i = end + 1
        elif c == "<":
            link = LINK.match(mrkdwn, i)
            assert link, f"raw < at {i} in {mrkdwn!r}"
            url, label = link.group(1), link.group(2)
            if label is None:
                reader.put("<" + MASK + ">", decode(url))
            else:
                decode(url)
                assert label.strip(), "empty link text"
                reader.put("<" + MASK + "|", "")
                reader.text(label)
                reader.put(">", "")
            i = link.end()
        elif c == ">":
            assert i == 0 or mrkdwn[i - 1] == "\n", f"raw > at {i} in {mrkdwn!r}"
            rest = mrkdwn[i + 1 : i + 2]
            assert rest in ("", " ", "\n"), f"quote prefix without a space at {i}"
            reader.put("> ", "")
            i += len(rest.strip("\n")) + 1
        else:
            end = i + 1
            while end < len(mrkdwn) and mrkdwn[end] not in "`<>":
                end += 1
            reader.text(mrkdwn[i:end])
            i = end
    text = "".join(reader.seen)
    # Slack links bare URLs itself: nothing in them is formatting (nor changed by to_mrkdwn).
    for url in BARE_URL.finditer(text):
        end = url.start() + len(trim_url(url.group(0)))
        text = text[: url.start()] + re.sub("[*_~]", MASK, text[url.start() : end]) + text[end:]
    found = [(marker, *pair) for marker in "*_~" for pair in pairs(text, marker)]
    shown = reader.shown
    for marker, start, end in found:
        assert "\n" not in text[start:end], f"{marker} formatting spans a line in {mrkdwn!r}"
        shown[reader.owner[start]] = shown[reader.owner[end]] = ""
    styles = []
    for marker, start, end in found:
        inside = sorted({n for n in reader.owner[start + 1 : end] if n >= 0})
        styles.append((marker, "".join(shown[n] for n in inside)))
    return Reading(shown="".join(shown), styles=styles)


def within_contract(markdown: str, mrkdwn: str) -> bool:
    extra = 4 * sum(markdown.count(c) for c in "&<>＞") + LENGTH_OVERHEAD
    return len(mrkdwn) <= len(markdown) + extra and utf16(mrkdwn) <= utf16(markdown) + extra


def check_markdown(markdown: str) -> Reading:
    """The rendering of `markdown` is valid and within the length contract."""
    mrkdwn = to_mrkdwn(markdown)
    assert within_contract(markdown, mrkdwn), (markdown, mrkdwn)
    reading = check(mrkdwn)
    if markdown.strip():
        assert reading.shown.strip(), f"{markdown!r} shows nothing"
    assert mrkdwn_length(markdown) == utf16(mrkdwn)
    return reading


@pytest.mark.parametrize(
    "mrkdwn",
    [
        "a < b",
        "a > b",
        "a & b",
        "&nbsp;",
        "<javascript:x|x>",
        "<http://x|>",
        "<@U123>",
        "```",
        "```x",
        "````x```",
        "```a``b```",
        "`x",
        "`a\nb`",
        "``",
        "*a\nb*",
        "_a\n_b_",
        "x\n&gt; y",
        "＞ y",
        ">x",
        "a >b",
    ],
)
def test_checker_rejects_what_slack_would_misread(mrkdwn: str) -> None:
    with pytest.raises(AssertionError):
        check(mrkdwn)


def test_checker_reads_every_construct() -> None:
    reading = check(
        "*b* _i_ ~s~ `c&lt;` <https://x/?a=1&amp;b=2|l &amp; m> <http://y>\n"
        "> q\n>\n```p\n&gt;```\n\u00ad&gt; not a quote a_b 2 * 3"
    )
    assert reading.shown == "b i s c< l & m http://y\nq\n\np\n>\n\u00ad> not a quote a_b 2 * 3"
    assert reading.styles == [("*", "b"), ("_", "i"), ("~", "s")]
    assert check("*a _b_ `c`* <http://x|*d*>").styles == [("*", "a b c"), ("*", "d"), ("_", "b")]


# --- Expected outputs ----------------------------------------------------------------------------

CASES = [
    # Emphasis, strong, strikethrough, inline code.
    ("**bold** __also__", "*bold* *also*"),
    ("*it* _also_", "_it_ _also_"),
    ("***both***", "_*both*_"),
    ("~~gone~~", "~gone~"),
    ("*a **b** c*", "_a *b* c_"),
    ("**a** _b_ ~~c~~", "*a* _b_ ~c~"),
    ("`a<b>&c`", "`a&lt;b&gt;&amp;c`"),
    ("`` a`b ``", "`aˋb`"),
    ("**a `c` b**", "*a `c` b*"),
    ("**`code`**", "*`code`*"),
    ("(**a**): x", "(*a*): x"),
    # Formatting inside a word gets zero-width spaces; nowhere else.
    ("un*believ*able", f"un{ZWSP}_believ_{ZWSP}able"),
    ("foo**bar**baz", f"foo{ZWSP}*bar*{ZWSP}baz"),
    ("a ~~b~~c", f"a ~b~{ZWSP}c"),
    ("x`y`z", f"x{ZWSP}`y`{ZWSP}z"),
    ("😀**a**😀", f"😀{ZWSP}*a*{ZWSP}😀"),
    # Whitespace never touches a marker on its inside; formatting never spans a line.
    ("**a\nb**", "*a*\n*b*"),
    ("**a**  \n**b**", "*a*\n*b*"),
    ("*a **b\nc** d*", "_a *b*_\n_*c* d_"),
    # Literal markers: kept where Slack cannot pair them, else look-alikes.
    ("2 * 3 * 4 = 24, snake_case_name, a~b", "2 * 3 * 4 = 24, snake_case_name, a~b"),
    ("price* and *footnote", "price* and *footnote"),
    ("\\*not bold\\*", "∗not bold∗"),
    ("\\_not italic\\_ and \\~not struck\\~", "ˍnot italicˍ and ∼not struck∼"),
    ("**a\\* b**", "*a∗ b*"),
    ("**a** b*", "*a* b∗"),
    ("**unclosed bold", "∗∗unclosed bold"),
    ("_private_ and _x", "_private_ and ˍx"),
    ("\\`not code\\` and `", "ˋnot codeˋ and ˋ"),
    # (markdown-it reads _a_ as emphasis: the marker gets a space so it is not part of the URL)
    ("see https://x.com/_a_ and *b*", f"see https://x.com/{ZWSP}_a_ and _b_"),
    ("see https://x.com/a_b_ and *b*", "see https://x.com/a_bˍ and _b_"),
    ("**https://x.com/a** **https://x.com/b**, x", f"*https://x.com/a* *https://x.com/b{ZWSP}*, x"),
    ("\\*x https://a.b/c*d", "∗x https://a.b/c*d"),
    ("https://a.b/c_(d)_. \\_x", "https://a.b/c_(d)ˍ. ˍx"),
    ("https://a.b/\\`x\\`", "https://a.b/ˋxˋ"),
    # Links and images: only http(s) and mailto.
    (
        "[text](https://example.com/a_b?x=1&y=2)",
        "<https://example.com/a_b?x=1&amp;y=2|text>",
    ),
    ("[t](http://x/(a))", "<http://x/(a)|t>"),
    ('[a](http://x "title")', "<http://x|a>"),
    ("[a](<http://a b/中|x>)", "<http://a%20b/中%7Cx|a>"),
    ("[a](http://x/%C3%BC%7C%25)", "<http://x/ü%7C%25|a>"),
    ("[**b** `c` > d](https://u?id=1)", "<https://u?id=1|b c &gt; d>"),
    ("**[a](http://x)** and *[b](http://y)*", "*<http://x|a>* and _<http://y|b>_"),
    ("[mail](mailto:a@b.c)", "<mailto:a@b.c|mail>"),
    ("<a@b.c>", "a@b.c"),
    ("<https://a.b/c_d>", "<https://a.b/c_d>"),
    ("[](https://e.com)", "<https://e.com>"),
    ("[rel](/path) [ftp](ftp://x)", "rel ftp"),
    ("[js](javascript:alert(1))", "[js](javascript:alert(1))"),
    ("![alt *t*](https://i/p.png)", "<https://i/p.png|alt t>"),
    ("![](https://i/p.png)", "<https://i/p.png>"),
    ("![alt](data:image/png;base64,xx)", "alt"),
    ("[![img](http://i)](http://l)", "<http://l|img>"),
    ("[a\nb](http://x)", "<http://x|a b>"),
    # Headings, paragraphs and breaks.
    ("# Title\n\nText", "*Title*\n\nText"),
    ("Title\n=====\nText", "*Title*\nText"),
    ("## A *b* `c`", "*A _b_ `c`*"),
    ("a\n\n\n\nb", "a\n\nb"),
    ("a  \nb\\\nc", "a\nb\nc"),
    # Lists.
    ("- a\n- b\n  - c\n    - d\n- e", "• a\n• b\n  • c\n    • d\n• e"),
    ("* a\n\n* b", "• a\n\n• b"),
    ("3. x\n4. y", "3. x\n4. y"),
    ("1) x\n1) y", "1. x\n1. y"),
    ("1. a\n   - b\n2. c", "1. a\n  • b\n2. c"),
    ("- a\n\n  more\n- b", "• a\n\n  more\n• b"),
    ("- [ ] task", "• [ ] task"),
    ("-", "•"),
    ("- **a** b", "• *a* b"),
    # Thematic breaks.
    ("a\n\n***\n\nb", "a\n\n———\n\nb"),
    # Quotes: line prefixes, one level, none inside list items, code blocks outside them.
    ("> quoted *text*\n> line 2", "> quoted _text_\n> line 2"),
    ("> a\n>\n> b", "> a\n>\n> b"),
    ("> a\n> > b", "> a\n> b"),
    ("> a\n\n> b", "> a\n\n> b"),
    ("> - x\n> - y", "> • x\n> • y"),
    ("- > q", "• q"),
    ("> a\n>\n> ```\n> code\n> ```\n>\n> b", "> a\n\n```code```\n\n> b"),
    ("> \\> x", f"> {SHY}&gt; x"),
    ("\\> not a quote\n\\>> nor this", f"{SHY}&gt; not a quote\n{SHY}&gt;&gt; nor this"),
    # Code blocks: no language; nothing inside can end them.
    ("```python\nprint('<hi>')\n```", "```print('&lt;hi&gt;')```"),
    ("```\nline 1\n  line 2\n```", "```line 1\n  line 2```"),
    ("~~~\n```\nnested\n```\n~~~", f"```{ZWSP}`{ZWSP}`{ZWSP}`\nnested\n`{ZWSP}`{ZWSP}`{ZWSP}```"),
    ("    indented\n    code", "```indented\ncode```"),
    ("- x\n\n  ```sh\n  ls\n  ```", "• x\n\n  ```ls```"),
    ("```\n*not bold* & _x_\n```", "```*not bold* &amp; _x_```"),
    # Tables: aligned when that fits in the source's length, else the source as-is.
    (
        "| Name | Qty |\n|:-----|----:|\n| Apple | 3 |\n| Kiwi | 12 |",
        "```Name  | Qty\n------+----\nApple |   3\nKiwi  |  12```",
    ),
    ("| a | b |\n|:-:|---|\n| c | d |", "```a | b\n--+--\nc | d```"),
    (
        "| a | b |\n|------|------|\n| a much longer cell | x |",
        "```a                  | b\na much longer cell | x```",
    ),
    (
        "| a | b |\n|---|---|\n| a much longer cell | x |",
        "```| a | b |\n|---|---|\n| a much longer cell | x |```",
    ),
    ("|a|b|\n|-|-|\n|long cell|x|", "```|a|b|\n|-|-|\n|long cell|x|```"),
    ("| `a` | **b** |\n|---|---|\n| <c> | d&e |", "```a   | b\n----+----\n&lt;c&gt; | d&amp;e```"),
    # Raw HTML, entities, escapes and special characters are text.
    ("<b>x</b> & <script>", "&lt;b&gt;x&lt;/b&gt; &amp; &lt;script&gt;"),
    ("<@U123> <!here> <#C1>", "&lt;@U123&gt; &lt;!here&gt; &lt;#C1&gt;"),
    ("&amp; &copy; &#128512; &bogus;", "&amp; © 😀 &amp;bogus;"),
    ("a.b!c-d+e=f{g}h|i#j(l)[m]", "a.b!c-d+e=f{g}h|i#j(l)[m]"),
    ("😀 𝕏 中文 :smile:", "😀 𝕏 中文 :smile:"),
    # Nothing to show, and inputs that would show nothing: sent as plain text.
    ("", ""),
    ("  \n\t ", ""),
    ("```", "ˋˋˋ"),
    ("[]()", "[]()"),
    (">", f"{SHY}&gt;"),
]


@pytest.mark.parametrize(("markdown", "mrkdwn"), CASES)
def test_expected_output(markdown: str, mrkdwn: str) -> None:
    assert to_mrkdwn(markdown) == mrkdwn
    check_markdown(markdown)


def test_formatting_is_read_as_intended() -> None:
    reading = check(to_mrkdwn("**a** *b* ~~c~~ x**y**z, 2*3 and \\*d\\* e_f"))
    assert reading.styles == [("*", "a"), ("*", "y"), ("_", "b"), ("~", "c")]
    assert reading.shown.replace(ZWSP, "") == "a b c xyz, 2*3 and ∗d∗ e_f"


class Styled(HTMLParser):
    """The text inside each <strong>, <em> and <s> of markdown-it's HTML."""

    KINDS: ClassVar = {"strong": "*", "em": "_", "s": "~"}

    def __init__(self) -> None:
        super().__init__()
        self.open: list[tuple[str, list[str]]] = []
        self.texts: dict[str, list[str]] = {marker: [] for marker in self.KINDS.values()}
        self.closed: set[str] = set()
        """Elements that ended with no text after them: one of the same kind that starts now
        continues it (to_mrkdwn merges them too)."""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.KINDS:
            texts = self.texts[self.KINDS[tag]]
            self.open.append((tag, [texts.pop()] if tag in self.closed else []))
            self.closed.discard(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.KINDS:
            tag, text = self.open.pop()
            self.texts[self.KINDS[tag]].append("".join(text))
            self.closed.add(tag)

    def handle_data(self, data: str) -> None:
        self.closed.clear()
        for _, text in self.open:
            text.append(data)


def bare(text: str) -> str:
    """Text without marker characters, their look-alikes, invisible characters or escapes."""
    return re.sub("[*_~`\u2217\u02cd\u223c\u02cb\u200b\u00ad<>&]", "", text)


def test_literal_markers_never_pair() -> None:
    """Escaped markers in text are never formatting, whatever surrounds them, and never
    capture this module's own formatting: Slack formats only what markdown-it does."""
    pieces = [
        *["\\*", "\\_", "\\~", "\\`", "\\*\\*", " ", " ", "\n", "a", "b", "1", "(", "."],
        *["😀", "中", "é", "**bold**", "_it_", "~~s~~", "\\>", "&", "*", "_", "~"],
    ]
    rng = random.Random(20240612)
    for _ in range(1500):
        markdown = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        reading = check_markdown(markdown)
        html = Styled()
        html.feed(MarkdownIt("commonmark").enable("strikethrough").render(markdown))
        for marker, between in reading.styles:
            assert any(bare(between) in bare(text) for text in html.texts[marker]), (
                markdown,
                reading.styles,
            )


def test_length_bound_for_pathological_input() -> None:
    pathological = ["&" * 1000, "<" * 1000, ">" * 1000, "\\>\n" * 500, "＞\n" * 500]
    for markdown in [*pathological, "a & b\n" * 300, "a*b*c " * 100, ">a\nb\n" * 100]:
        mrkdwn = to_mrkdwn(markdown)
        assert within_contract(markdown, mrkdwn)
        assert len(mrkdwn) <= 5 * len(markdown) + LENGTH_OVERHEAD
        check(mrkdwn)
    assert to_mrkdwn("&" * 1000) == "&amp;" * 1000
    assert mrkdwn_length("&" * 1000) == 5000


def test_output_too_long_for_the_contract_is_sent_as_plain_text() -> None:
    # A one-line indented code block costs two characters more than its source.
    markdown = "    x\n\na\n\n" * 20
    mrkdwn = to_mrkdwn(markdown)
    assert "```" not in mrkdwn
    assert mrkdwn.startswith("    x\n\na\n\n    x")
    assert within_contract(markdown, mrkdwn)
    # Below the overhead the same blocks are rendered.
    assert to_mrkdwn("    x\n\na\n\n" * 3).startswith("```x```\n\na")


def test_a_renderer_failure_sends_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> NoReturn:
        raise RecursionError

    monkeypatch.setattr(markup, "_parser", broken)
    assert to_mrkdwn("**a** <b> \\*c\\* `d`") == "∗∗a∗∗ &lt;b&gt; \\∗c\\∗ ˋdˋ"
    assert to_mrkdwn("2 * 3 a_b > c\n> d") == f"2 * 3 a_b &gt; c\n{SHY}&gt; d"


def test_plain_text_last_resort(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> NoReturn:
        raise RecursionError

    monkeypatch.setattr(markup, "_finish", broken)
    assert to_mrkdwn("**a** <b> & `c`\n > d") == f"∗∗a∗∗ &lt;b&gt; &amp; ˋcˋ\n {SHY}&gt; d"


# --- The contract over nasty inputs ------------------------------------------------------------

NASTY = [
    "**unclosed bold",
    "*unclosed italic",
    "~~unclosed strike",
    "`unclosed code",
    "```",
    "```py",
    "```py\n",
    "```py\ndef f():\n    return '<x>'",
    "```\n`",
    "```\n``",
    "```\nx`",
    "~~~\n```\n~~~",
    "[dangling link](",
    "[dangling link](http://x",
    "[dangling](http://x) [",
    "![img](",
    "[a][b]",
    "[a]: http://x\n\n[a]",
    "[x](http://a|b>c)",
    "[x](<http://a|b>c>)",
    "[x](http://a/b&amp;c)",
    "[x|y](http://a)",
    "[<@U1>](http://a)",
    "[`a|b`](http://a)",
    "[x](mailto:a|b@c)",
    "[x](HTTP://UPPER.CASE)",
    "[x](http://)",
    "[x](mailto:)",
    "<http://a.b/c?d=e&f=g>",
    "<mailto:a@b.c> <a@b.c>",
    "<",
    ">",
    "&",
    "&amp;",
    "&amp;amp;",
    "&lt;b&gt;",
    "<@U123> <!channel> <#C1|x> <https://x|y>",
    "<script>alert('x')</script>",
    "<!-- comment -->",
    "\\",
    "a\\",
    "\\`not code\\`",
    "_*[]()~`>#+-=|{}.!\\",
    "* * *",
    "****",
    "__",
    "___",
    "~",
    "~~",
    "a**b",
    "a__b__",
    "*a**b*",
    "**a*b**",
    "***a*b**",
    "_a_b_",
    "*a*b*c*",
    "a * b * c",
    "x*",
    "*x",
    "~x~",
    "~~~x~~~",
    "`a``b`",
    "` `",
    "``` ```",
    "- \n- \n-",
    "1.",
    "99999999999. big",
    ">",
    "> ",
    ">>>",
    ">>> quote rest",
    "\\>>> not a quote",
    "> " * 40 + "deep",
    "- " * 40 + "deep",
    "*" * 300 + "x" + "*" * 300,
    "_" * 300,
    "[" * 200 + "x" + "](http://a)" * 200,
    "|",
    "| a |",
    "| a | b |\n|---|",
    "| a | b |\n|---|---|",
    "| a | b |\n|---|---|\n| c",
    "| a | b |\n|---|---|\n| `x|y` | ``` |",
    "#",
    "# ",
    "Setext\n---",
    "\n\n\n",
    " ",
    "\t",
    "\u00a0",
    "\u200b",
    "\u00ad>",
    "＞ fullwidth",
    "\\＞ fullwidth",
    "\u2028\u2029",
    "\r\n\r\n**crlf**\r\nline\r",
    "\0",
    "a\0b **\0**",
    "😀",
    "👩‍👩‍👧‍👦 **family**",
    "𝕳𝖊𝖑𝖑𝖔 *𝖜𝖔𝖗𝖑𝖉*",
    "\U0010ffff\U00010000",
    "\ud83d",
    "[x](http://a/\ud83d)",
    "`\ud800`",
    "中文**粗体**和*斜体*",
    "עברית **מודגש** עם English",
    "combining e\u0301**x**e\u0301",
    "tab\tseparated",
    "- a\n\t- b\n\t\t- c",
    "1. a\n\t```\n\tcode\n\t```",
    "> ```\n> unclosed in quote",
    "- ```\n  unclosed in list",
    "**[bold link](http://a)** and [**link bold**](http://b)",
    "*[a](http://x)*[b](http://y)",
    "[a](http://x)[b](http://x)",
    "a\n- b\n# c\n> d\n```\ne\n```\n| f | g |\n|---|---|",
    "https://x.y/a_b_c_ and *x* https://x.y/*a*",
    "(https://x.y/a_(b)_)",
    ":white_check_mark: _done_",
    "x" * 5000,
    ("word " * 200 + "\n") * 5,
]


def test_the_corpus_is_large() -> None:
    assert len(NASTY) >= 50


@pytest.mark.parametrize("markdown", NASTY + [case[0] for case in CASES])
def test_nasty_inputs_render_valid_and_within_the_contract(markdown: str) -> None:
    check_markdown(markdown)


def test_random_inputs_render_valid_and_within_the_contract() -> None:
    pieces = [
        *"*_~`[]()<>&\\|#!-+=.{}\n ",
        *["**", "__", "~~", "```", "```py\n", "\n\n", "- ", "1. ", "> ", "# ", "    "],
        *["](http://x.y/", "![", "&amp;", "&#x1F600;", "| a |", "|---|", "\n|-|-|\n"],
        *["<b>", "<@U1>", "😀", "中", "\t", "\r\n", "\0", "\ud83d", "mailto:", "text"],
        *["https://a.b/_c_", "\\*", "\\_", "\\>", "＞", "\u200b"],
    ]
    rng = random.Random(20240611)
    for _ in range(1500):
        check_markdown("".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))))


# --- Answers as they stream in -----------------------------------------------------------------

ANSWERS = [
    """\
## Reading a file in Python

Use a `with` block so the file is **always closed**, even on errors:

```python
from pathlib import Path

def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:  # closes on exit
        return [line.rstrip("\\n") for line in f if line and not line.startswith("<")]
```

A few notes:

1. `encoding="utf-8"` avoids platform-dependent defaults.
2. For *huge* files, iterate instead of building a list.
3. `Path("data.txt").read_text()` is the one-liner & it's __fast__.
""",
    """\
Here's a comparison of the options:

| Option | Speed | Memory | Notes |
|--------|------:|:------:|-------|
| `list` | fast | high | simple & **common** |
| generator | medium | low | lazy_eval |
| mmap | fastest | OS-managed | needs a real file |

Pros and cons:
- **Lists**
  - random access
  - easy to debug
- **Generators**
  - one pass only
  - ~~no~~ constant memory

> Note: benchmark with *your* data — results vary by 2x-10x!

---

Questions? Ask away. 🙂
""",
    """\
See the [docs](https://docs.python.org/3/library/functions.html#open) and
<https://example.com/a_b?x=1&y=2>, or mail <help@example.com>. Avoid [bad](javascript:alert(1)).

Math-ish: 2 * 3 = 6, a_b_c, 1. not a list, #hashtag, {braces}, [brackets] <kbd>Ctrl</kbd>!
Footnote* and *emphasis* then \\*escaped\\* \\_too\\_ ~approx~ ~~struck~~ `a|b` `x > y`.

> Quote with `code` and a [link](https://x.org/a_b)
> > nested quote
""",
    """\
To build it:

1. Install Go 1.22+:
   ```sh
   curl -LO https://go.dev/dl/go1.22.linux-amd64.tar.gz
   sudo tar -C /usr/local -xzf go1.22.linux-amd64.tar.gz
   ```
2. Write `main.go`:
   ```go
   package main

   func main() {
   \tfor i := 0; i < 3; i++ { fmt.Println(i) }
   }
   ```
3. Run `go run .` — **done** 🎉
""",
]


@pytest.mark.parametrize("answer", ANSWERS, ids=["python", "table", "links", "go"])
def test_every_prefix_of_a_streamed_answer(answer: str) -> None:
    for end in range(len(answer) + 1):
        check_markdown(answer[:end])


def test_complete_answers_are_formatted() -> None:
    python = to_mrkdwn(ANSWERS[0])
    assert python.startswith("*Reading a file in Python*\n\nUse a `with` block")
    assert "```from pathlib import Path\n\ndef read_lines" in python
    assert 'line.startswith("&lt;")]```\n\nA few notes:' in python
    assert python.endswith("is the one-liner &amp; it's *fast*.")
    table = to_mrkdwn(ANSWERS[1])
    rows = "Option    |   Speed |   Memory   | Notes\nlist      |    fast |    high    |"
    assert table.startswith(f"Here's a comparison of the options:\n\n```{rows}")
    assert "\n\nPros and cons:\n• *Lists*\n  • random access\n" in table
    assert "  • ~no~ constant memory\n\n> Note: benchmark with _your_ data" in table
    links = to_mrkdwn(ANSWERS[2])
    assert links.startswith(
        "See the <https://docs.python.org/3/library/functions.html#open|docs> and\n"
        "<https://example.com/a_b?x=1&amp;y=2>, or mail help@example.com. "
        "Avoid [bad](javascript:alert(1)).\n\nMath-ish: 2 * 3 = 6, a_b_c,"
    )
    assert "Footnote* and _emphasis_ then ∗escaped∗ ˍtooˍ ∼approx∼ ~struck~ `a|b` `x &gt; y`" in (
        links
    )
    assert links.endswith("> Quote with `code` and a <https://x.org/a_b|link>\n> nested quote")
    go = to_mrkdwn(ANSWERS[3])
    assert go.startswith("To build it:\n\n1. Install Go 1.22+:\n  ```curl -LO https://go.dev")
    assert "\tfor i := 0; i &lt; 3; i++ { fmt.Println(i) }\n}```\n3. Run `go run .`" in go


# --- Slack → text --------------------------------------------------------------------------------

USERS = {"U1": "alice", "U2": "@bob"}


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("<@UBOT> hello", "hello"),
        ("  <@UBOT|herald>: hello", "hello"),
        ("<@UBOT>, <@UBOT> twice", "@UBOT twice"),
        ("<@UBOT>", ""),
        ("hi <@UBOT>", "hi @UBOT"),
        ("<@U1> and <@U2> and <@U3> and <@U4|carol>", "@alice and @bob and @U3 and @carol"),
        ("<@W9>", "@W9"),
        ("<#C1|general> <#C2> <#C3|>", "#general #C2 #C3"),
        ("<https://x.com/a?b=1&amp;c=2|a &amp; b>", "a & b (https://x.com/a?b=1&c=2)"),
        ("<https://x.com>", "https://x.com"),
        ("<https://x.com|https://x.com>", "https://x.com"),
        ("<http://example.com|example.com>", "example.com"),
        ("<http://example.com/|example.com>", "example.com"),
        ("<mailto:a@b.c|a@b.c>", "a@b.c"),
        ("<mailto:a@b.c|write>", "write (mailto:a@b.c)"),
        ("<!here> <!channel> <!everyone> <!here|@here>", "@here @channel @everyone @here"),
        ("<!subteam^S1|@devs> <!subteam^S2>", "@devs @S2"),
        ("<!date^1392734382^{date}|Feb 18, 2014>", "Feb 18, 2014"),
        ("a &lt;b&gt; &amp;amp; &amp; &quot;", "a <b> &amp; & &quot;"),
        ("<> and a < b", "<> and a < b"),
        ("*bold* _it_ `code`", "*bold* _it_ `code`"),
        ("", ""),
    ],
)
def test_from_slack(text: str, plain: str) -> None:
    assert from_slack(text, bot_user_id="UBOT", users=USERS) == plain


def test_from_slack_without_a_bot_or_users() -> None:
    assert from_slack("<@UBOT> hi <@U1>") == "@UBOT hi @U1"


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "a < b && c > d; x = y & z",
        "snake_case and 2 * 3 and ~5 minutes",
        "Prices: $5 (approx.) — 中文, emoji 😀, tabs\tand\nnew lines",
        "<@U1> is not a mention here & <!here> neither",
        "see https://example.com/a_b?x=1&y=2 now",
    ],
)
def test_round_trip_keeps_the_words(text: str) -> None:
    assert re.findall(r"\w+", from_slack(to_mrkdwn(text))) == re.findall(r"\w+", text)
