"""Markdown → Telegram HTML / MarkdownV2: expected outputs, validity checkers and the length
contract over a corpus of nasty and half-streamed inputs."""

from __future__ import annotations

import random
import re
from html.parser import HTMLParser
from typing import NoReturn

import pytest

from adapters.telegram import markup
from adapters.telegram.markup import to_html, to_markdown_v2, visible_text


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# --- An independent reading of what Telegram accepts -------------------------------------------

PLAIN_TAGS = frozenset(
    {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "tg-spoiler", "pre"}
)
NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
ENTITY = re.compile(r"&(?:lt|gt|amp|quot|#[0-9]+|#x[0-9a-fA-F]+);")
LINK = re.compile(r"(?:https?://[^\s/?#]|tg://[A-Za-z]|mailto:\S)", re.IGNORECASE)


class TelegramHTML(HTMLParser):
    """Fails on anything Telegram's HTML mode rejects (or that this module must never write);
    collects the displayed text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.shown = 0
        self.sizes: list[int] = []
        """Visible characters before each open tag, to reject empty entities."""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        parent = self.stack[-1] if self.stack else None
        if tag in PLAIN_TAGS:
            assert attrs == [], (tag, attrs)
        elif tag == "span":
            assert attrs == [("class", "tg-spoiler")], attrs
        elif tag == "a":
            assert [name for name, _ in attrs] == ["href"], attrs
            assert LINK.match(attrs[0][1] or ""), attrs
        elif tag == "code":
            if attrs:
                assert parent == "pre", "a code class outside <pre>"
                assert self.sizes[-1] == self.shown, "text before a code class"
                assert [name for name, _ in attrs] == ["class"], attrs
                assert re.fullmatch(r"language-[A-Za-z0-9_+-]+", attrs[0][1] or ""), attrs
        elif tag == "blockquote":
            assert attrs in ([], [("expandable", None)]), attrs
        else:
            raise AssertionError(f"unsupported tag <{tag}>")
        if parent in ("code", "pre"):
            assert (parent, tag) == ("pre", "code"), f"<{tag}> inside <{parent}>"
        if tag in ("a", "blockquote"):
            assert tag not in self.stack, f"nested <{tag}>"
        if tag in ("code", "pre"):
            assert "a" not in self.stack, f"<{tag}> inside a link"
        if tag == "pre":
            assert set(self.stack) <= {"blockquote"}, f"<pre> inside {self.stack}"
        self.stack.append(tag)
        self.sizes.append(self.shown)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raise AssertionError(f"self-closing <{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1:] == [tag], f"</{tag}> closes {self.stack}"
        self.stack.pop()
        assert self.shown > self.sizes.pop(), f"empty <{tag}>"

    def handle_data(self, data: str) -> None:
        assert not set(data) & set("<>&"), f"unescaped markup character in {data!r}"
        self.add(data)

    def add(self, text: str) -> None:
        self.text.append(text)
        self.shown += len(text)

    def handle_entityref(self, name: str) -> None:
        assert name in NAMED_ENTITIES, f"&{name};"
        self.add(NAMED_ENTITIES[name])

    def handle_charref(self, name: str) -> None:
        self.add(chr(int(name[1:], 16) if name[:1] in "xX" else int(name)))

    def handle_comment(self, data: str) -> None:
        raise AssertionError(f"comment {data!r}")

    def handle_decl(self, decl: str) -> None:
        raise AssertionError(f"declaration {decl!r}")

    def handle_pi(self, data: str) -> None:
        raise AssertionError(f"processing instruction {data!r}")

    def unknown_decl(self, data: str) -> None:
        raise AssertionError(f"declaration {data!r}")


def check_html(text: str) -> str:
    """Asserts `text` is valid Telegram HTML; returns the text Telegram displays."""
    for amp in re.finditer("&", text):
        assert ENTITY.match(text, amp.start()), f"stray & at {amp.start()} in {text!r}"
    parser = TelegramHTML()
    parser.feed(text)
    parser.close()
    assert not parser.stack, f"unclosed {parser.stack} in {text!r}"
    shown = "".join(parser.text)
    assert visible_text(text) == shown
    return shown


V2_RESERVED = frozenset("_*[]()~`>#+-=|{}.!\\")
V2_MARKERS = {"*": "b", "_": "i", "__": "u", "~": "s", "||": "spoiler"}


def read_escaped(text: str, i: int, escapable: str, end: str) -> tuple[str, int]:
    """The content from `i` up to the unescaped `end` (only `escapable` may be escaped), and
    the index after `end`."""
    out: list[str] = []
    while i < len(text):
        if text[i] == "\\":
            assert text[i + 1 : i + 2] in set(escapable), f"bad escape at {i}"
            out.append(text[i + 1])
            i += 2
        elif text[i] == end[0]:
            assert text.startswith(end, i), f"unescaped {text[i]!r} at {i}"
            return "".join(out), i + len(end)
        else:
            out.append(text[i])
            i += 1
    raise AssertionError(f"unclosed entity, missing {end!r}")


def check_v2(text: str) -> str:
    """Asserts `text` is valid MarkdownV2 with every reserved character escaped outside entity
    markers and no entity crossing a line; returns the text Telegram displays."""
    out: list[str] = []
    stack: list[tuple[str, int]] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == ">" and (i == 0 or text[i - 1] == "\n"):
            i += 1  # a quote line
        elif c == "\\":
            assert "\x01" <= text[i + 1 : i + 2] <= "~", f"bad escape at {i}"
            out.append(text[i + 1])
            i += 2
        elif c == "\n":
            assert not stack, f"{stack} crosses a line break at {i}"
            out.append(c)
            i += 1
        elif text.startswith("```", i):
            assert not stack, f"a code block inside {stack}"
            newline = text.find("\n", i)
            assert newline > 0, "a code block without a newline"
            assert re.fullmatch(r"[A-Za-z0-9_+-]*", text[i + 3 : newline]), "language"
            body, i = read_escaped(text, newline + 1, "`\\", "```")
            assert body, "empty code block"
            out.append(body)
        elif c == "`":
            body, i = read_escaped(text, i + 1, "`\\", "`")
            assert body, "empty code"
            out.append(body)
        elif c == "[":
            stack.append(("link", len(out)))
            i += 1
        elif c == "]":
            assert stack[-1:] == [("link", stack[-1][1])], f"] closes {stack} at {i}"
            assert text.startswith("(", i + 1), f"] without ( at {i}"
            url, i = read_escaped(text, i + 2, ")\\", ")")
            assert LINK.match(url), url
            assert len(out) > stack.pop()[1], "empty link"
        elif text[i : i + 2] in V2_MARKERS or c in V2_MARKERS:
            marker = text[i : i + 2] if text[i : i + 2] in V2_MARKERS else c
            kind = V2_MARKERS[marker]
            if any(open_kind == kind for open_kind, _ in stack):
                assert stack[-1][0] == kind, f"{marker} closes {stack} at {i}"
                assert len(out) > stack.pop()[1], f"empty {kind}"
            else:
                stack.append((kind, len(out)))
            i += len(marker)
        else:
            assert c not in V2_RESERVED, f"unescaped {c!r} at {i} in {text!r}"
            out.append(c)
            i += 1
    assert not stack, f"unclosed {stack}"
    return "".join(out)


def check_both(markdown: str) -> str:
    """Both renderings are valid, display the same text, no longer than the input."""
    shown = check_html(to_html(markdown))
    assert check_v2(to_markdown_v2(markdown)) == shown
    assert utf16(shown) <= utf16(markdown), (markdown, shown)
    return shown


@pytest.mark.parametrize(
    ("html", "v2"),
    [
        ("<b>x", "*x"),
        ("x</b>", "x*y"),
        ("<b><i>x</b></i>", "*_x*_"),
        ("<u>x</u><br>", "a.b"),
        ("a < b", "a-b"),
        ("a & b", "(x)"),
        ("&nbsp;", "`x"),
        ('<a href="javascript:x">x</a>', "[x](javascript:x)"),
        ("<code><b>x</b></code>", "```\n`\n```"),
        ("<b></b>x", "**x"),
        ("<pre><i>x</i></pre>", "*x\ny*"),
        ("<blockquote><blockquote>x</blockquote></blockquote>", "x\\"),
        ('<a href="http://x"><code>x</code></a>', "```\nx`"),
    ],
)
def test_checkers_reject_what_telegram_rejects(html: str, v2: str) -> None:
    with pytest.raises(AssertionError):
        check_html(html)
    with pytest.raises(AssertionError):
        check_v2(v2)


def test_checkers_accept_every_entity() -> None:
    html = (
        "<b>b</b><strong>s</strong><i>i</i><em>e</em><u>u</u><ins>n</ins><s>s</s><del>d</del>"
        '<span class="tg-spoiler">p</span><tg-spoiler>t</tg-spoiler><a href="tg://user?id=1">a'
        '</a><code>c</code><pre>p</pre><pre><code class="language-py">x</code></pre>'
        "<blockquote>q</blockquote><blockquote expandable>x</blockquote> &lt;&gt;&amp;&quot;"
    )
    assert check_html(html) == 'bsieunsdptacpxqx <>&"'
    v2 = "*b* _i_ __u__ ~s~ ||p|| [a](http://x/\\)) `c\\`` ```py\nx``` \\.\n>q"
    assert check_v2(v2) == "b i u s p a c` x .\nq"


# --- Expected outputs ------------------------------------------------------------------------

CASES = [
    # Emphasis, strong, strikethrough, inline code.
    ("**bold** __also__", "<b>bold</b> <b>also</b>", "*bold* *also*"),
    ("*it* _also_", "<i>it</i> <i>also</i>", "_it_ _also_"),
    ("***both***", "<i><b>both</b></i>", "_*both*_"),
    ("~~gone~~", "<s>gone</s>", "~gone~"),
    ("*a **b** c*", "<i>a <b>b</b> c</i>", "_a *b* c_"),
    ("*a *b* c*", "<i>a b c</i>", "_a b c_"),
    ("*a*_b_", "<i>ab</i>", "_ab_"),
    ("`a<b>&c`", "<code>a&lt;b&gt;&amp;c</code>", "`a<b>&c`"),
    ("`` a`b\\ ``", "<code>a`b\\</code>", "`a\\`b\\\\`"),
    ("**a `c` b**", "<b>a <code>c</code> b</b>", "*a `c` b*"),
    # Links and images: only http(s), tg and mailto; code inside a link is plain link text.
    (
        "[text](https://example.com/a_b?x=1&y=2)",
        '<a href="https://example.com/a_b?x=1&amp;y=2">text</a>',
        "[text](https://example.com/a_b?x=1&y=2)",
    ),
    ("[t](http://x/(a))", '<a href="http://x/(a)">t</a>', "[t](http://x/(a\\))"),
    ('[a]( http://x/"q" )', '<a href="http://x/%22q%22">a</a>', "[a](http://x/%22q%22)"),
    ('[a](http://x "title")', '<a href="http://x">a</a>', "[a](http://x)"),
    (
        "[**b** `c`](tg://user?id=1)",
        '<a href="tg://user?id=1"><b>b</b> c</a>',
        "[*b* c](tg://user?id=1)",
    ),
    ("[mail](mailto:a@b.c)", '<a href="mailto:a@b.c">mail</a>', "[mail](mailto:a@b.c)"),
    ("[rel](/path) [ftp](ftp://x)", "rel ftp", "rel ftp"),
    (
        "[js](javascript:alert(1))",
        "[js](javascript:alert(1))",
        "\\[js\\]\\(javascript:alert\\(1\\)\\)",
    ),
    (
        "<https://a.b/c_d>",
        '<a href="https://a.b/c_d">https://a.b/c_d</a>',
        "[https://a\\.b/c\\_d](https://a.b/c_d)",
    ),
    (
        "[](https://e.com)",
        '<a href="https://e.com">https://e.com</a>',
        "[https://e\\.com](https://e.com)",
    ),
    (
        "![alt *t*](https://i/p.png)",
        '<a href="https://i/p.png">alt t</a>',
        "[alt t](https://i/p.png)",
    ),
    ("![alt](data:image/png;base64,xx)", "alt", "alt"),
    ("[![img](http://i)](http://l)", '<a href="http://l">img</a>', "[img](http://l)"),
    # Headings, paragraphs and breaks.
    ("# Title\n\nText", "<b>Title</b>\n\nText", "*Title*\n\nText"),
    ("Title\n=====\nText", "<b>Title</b>\nText", "*Title*\nText"),
    ("## A *b* `c`", "<b>A <i>b</i> <code>c</code></b>", "*A _b_ `c`*"),
    ("a\n\n\n\nb", "a\n\nb", "a\n\nb"),
    ("a\nb", "a\nb", "a\nb"),
    ("a  \nb\\\nc", "a\nb\nc", "a\nb\nc"),
    ("**a\nb**", "<b>a</b>\n<b>b</b>", "*a*\n*b*"),
    # Lists.
    (
        "- a\n- b\n  - c\n    - d\n- e",
        "• a\n• b\n  • c\n    • d\n• e",
        "• a\n• b\n  • c\n    • d\n• e",
    ),
    ("* a\n\n* b", "• a\n\n• b", "• a\n\n• b"),
    ("3. x\n4. y", "3. x\n4. y", "3\\. x\n4\\. y"),
    ("1) x\n1) y", "1. x\n1. y", "1\\. x\n1\\. y"),
    ("1. a\n   - b\n2. c", "1. a\n  • b\n2. c", "1\\. a\n  • b\n2\\. c"),
    ("- a\n\n  more\n- b", "• a\n\n  more\n• b", "• a\n\n  more\n• b"),
    ("Intro:\n- a\n- b", "Intro:\n• a\n• b", "Intro:\n• a\n• b"),
    ("- [ ] task", "• [ ] task", "• \\[ \\] task"),
    ("- - x", "• • x", "• • x"),
    ("-", "•", "•"),
    ("- a\n\t- b", "• a\n • b", "• a\n • b"),
    # Thematic breaks.
    ("---", "———", "———"),
    ("a\n\n***\n\nb", "a\n\n———\n\nb", "a\n\n———\n\nb"),
    # Blockquotes: one level; none inside list items; code leaves a MarkdownV2 quote.
    (
        "> quoted *text*\n> line 2",
        "<blockquote>quoted <i>text</i>\nline 2</blockquote>",
        ">quoted _text_\n>line 2",
    ),
    ("> a\n>\n> b", "<blockquote>a\n\nb</blockquote>", ">a\n>\n>b"),
    ("> a\n> > b", "<blockquote>a\nb</blockquote>", ">a\n>b"),
    ("> a\n\n> b", "<blockquote>a</blockquote>\n\n<blockquote>b</blockquote>", ">a\n\n>b"),
    ("> - x\n> - y", "<blockquote>• x\n• y</blockquote>", ">• x\n>• y"),
    (
        "> a\n> <!--\n>\n>\n> -->\n> b",
        "<blockquote>a\n&lt;!--\n\n\n--&gt;\nb</blockquote>",
        ">a\n><\\!\\-\\-\n>\n>\n>\\-\\-\\>\n>b",
    ),
    ("- > q", "• q", "• q"),
    (
        "> a\n>\n> ```\n> code\n> ```\n>\n> b",
        "<blockquote>a\n\n<pre>code</pre>\n\nb</blockquote>",
        ">a\n\n```\ncode```\n\n>b",
    ),
    (
        "> ```\n> x\n> ```\n>\n> b\n\nc",
        "<blockquote><pre>x</pre>\n\nb</blockquote>\n\nc",
        "```\nx```\n\n>b\n\nc",
    ),
    # Code blocks.
    (
        "```python\nprint('<hi>')\n```",
        "<pre><code class=\"language-python\">print('&lt;hi&gt;')</code></pre>",
        "```python\nprint('<hi>')```",
    ),
    ("```c#\nx\n```", '<pre><code class="language-c">x</code></pre>', "```c\nx```"),
    ("~~~ {.rust}\nfn\n~~~", '<pre><code class="language-rust">fn</code></pre>', "```rust\nfn```"),
    ("```!!!\nx\n```", "<pre>x</pre>", "```\nx```"),
    ("```\n`a` \\ b\n```", "<pre>`a` \\ b</pre>", "```\n\\`a\\` \\\\ b```"),
    ("    indented\n    code", "<pre>indented\ncode</pre>", "```\nindented\ncode```"),
    (
        "- x\n\n  ```sh\n  ls\n  ```",
        '• x\n\n  <pre><code class="language-sh">ls</code></pre>',
        "• x\n\n  ```sh\nls```",
    ),
    # Tables: aligned when that fits in the source's length, else the source as-is.
    (
        "| Name | Qty |\n|:-----|----:|\n| Apple | 3 |\n| Kiwi | 12 |",
        "<pre>Name  | Qty\n------+----\nApple |   3\nKiwi  |  12</pre>",
        "```\nName  | Qty\n------+----\nApple |   3\nKiwi  |  12```",
    ),
    (
        "| a | b |\n|:-:|---|\n| c | d |",
        "<pre>a | b\n--+--\nc | d</pre>",
        "```\na | b\n--+--\nc | d```",
    ),
    (
        "|a|b|\n|-|-|\n|long cell|x|",
        "<pre>|a|b|\n|-|-|\n|long cell|x|</pre>",
        "```\n|a|b|\n|-|-|\n|long cell|x|```",
    ),
    (
        "> | a | b |\n> |---|---|\n> | c | d |",
        "<blockquote><pre>a | b\n--+--\nc | d</pre></blockquote>",
        "```\na | b\n--+--\nc | d```",
    ),
    # Raw HTML, entities, escapes and reserved characters are text.
    (
        "<b>x</b> & <script>",
        "&lt;b&gt;x&lt;/b&gt; &amp; &lt;script&gt;",
        "<b\\>x</b\\> & <script\\>",
    ),
    ("<div>\n*x*\n</div>", "&lt;div&gt;\n*x*\n&lt;/div&gt;", "<div\\>\n\\*x\\*\n</div\\>"),
    ("&amp; &copy; &#128512; &bogus;", "&amp; © 😀 &amp;bogus;", "& © 😀 &bogus;"),
    ("\\*not\\* 1\\. \\\\", "*not* 1. \\", "\\*not\\* 1\\. \\\\"),
    (
        "a.b!c-d+e=f{g}h|i#j>k(l)[m]_n*o~p`q",
        "a.b!c-d+e=f{g}h|i#j&gt;k(l)[m]_n*o~p`q",
        "a\\.b\\!c\\-d\\+e\\=f\\{g\\}h\\|i\\#j\\>k\\(l\\)\\[m\\]\\_n\\*o\\~p\\`q",
    ),
    ("😀 𝕏 中文", "😀 𝕏 中文", "😀 𝕏 中文"),
    # Nothing to show, and inputs that would show nothing: sent as escaped text.
    ("", "", ""),
    ("  \n\t ", "", ""),
    ("```", "```", "\\`\\`\\`"),
    ("[]()", "[]()", "\\[\\]\\(\\)"),
    ("#", "#", "\\#"),
]


@pytest.mark.parametrize(("markdown", "html", "v2"), CASES)
def test_expected_output(markdown: str, html: str, v2: str) -> None:
    assert to_html(markdown) == html
    assert to_markdown_v2(markdown) == v2
    check_both(markdown)


def test_tables_are_padded_only_within_the_input_length() -> None:
    ruled = "| a  | b |\n|----|---|\n| aa | x |"
    assert to_html(ruled) == "<pre>a  | b\n---+--\naa | x</pre>"
    # The rule would make it longer than the input: it goes.
    unruled = "| a | b |\n|---|---|\n| a much longer cell | x |"
    assert to_html(unruled) == "<pre>a                  | b\na much longer cell | x</pre>"
    # Even without the rule the padding is too long: the source lines are shown.
    as_is = "|a|b|\n|-|-|\n|long cell|x|"
    assert to_html(as_is) == f"<pre>{as_is}</pre>"
    # What the rest of the message saves on markup can pay for the padding.
    slack = "[x](http://example.com/long/path)\n\n" + unruled
    assert "<pre>a                  | b\n-------------------+--\na much" in to_html(slack)
    # Not enough for two tables: both lose their rule, which is enough here.
    both = to_html(slack + "\n\n" + as_is)
    assert "+" not in both
    assert both.endswith("<pre>a         | b\nlong cell | x</pre>")


def test_table_inside_a_list_as_is_drops_the_indentation() -> None:
    markdown = "- x\n\n  |a|b|\n  |-|-|\n  |a very long cell indeed|y|"
    assert to_html(markdown) == "• x\n\n  <pre>|a|b|\n|-|-|\n|a very long cell indeed|y|</pre>"


def test_wide_characters_are_aligned_by_columns() -> None:
    markdown = "| 名前 | n |\n|------|---|\n| ab | 1 |"
    assert to_html(markdown) == "<pre>名前 | n\n-----+--\nab   | 1</pre>"


def test_input_that_would_display_longer_is_sent_as_plain_text() -> None:
    # markdown-it expands the tab inside the list item's HTML block into spaces.
    markdown = "- <b>\n\t- "
    assert to_html(markdown) == "- &lt;b&gt;\n\t- "
    assert to_markdown_v2(markdown) == "\\- <b\\>\n\t\\- "


def test_a_renderer_failure_sends_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> NoReturn:
        raise RecursionError

    monkeypatch.setattr(markup, "_parser", broken)
    assert to_html("**a** <b>") == "**a** &lt;b&gt;"
    assert to_markdown_v2("**a** <b>") == "\\*\\*a\\*\\* <b\\>"


def test_visible_text() -> None:
    assert visible_text("<b>a &lt; b</b> &amp;amp; &quot;x&quot;") == 'a < b &amp; "x"'
    assert visible_text('<a href="http://x/?a=1&amp;b=&quot;>&quot;">t</a>') == "t"
    assert visible_text("&#128512;&#x41;&#99999999;") == "😀A&#99999999;"
    assert visible_text('<pre><code class="language-py">x</code></pre>') == "x"


# --- The contract over nasty inputs ----------------------------------------------------------

NASTY = [
    "**unclosed bold",
    "*unclosed italic",
    "~~unclosed strike",
    "`unclosed code",
    "```",
    "```py",
    "```py\n",
    "```py\ndef f():\n    return '<x>'",
    "~~~\n`\\`",
    "[dangling link](",
    "[dangling link](http://x",
    "[dangling](http://x) [",
    "![img](",
    "[a][b]",
    "[a]: http://x\n\n[a]",
    "<",
    "<script>alert('x')</script>",
    "<a href='javascript:alert(1)'>x</a>",
    "</b></i></pre>",
    "<!-- comment -->",
    "<![CDATA[ x ]]>",
    "&",
    "&amp;",
    "&amp;amp;",
    "&lt;b&gt;",
    "&#0; &#xD800; &#x110000; &#65;",
    "&nbsp;&copy;&hellip;",
    "\\",
    "\\\\\\",
    "a\\",
    "\\`not code\\`",
    "_*[]()~`>#+-=|{}.!\\",
    "||spoiler||",
    "__underline__ ___triple___",
    "****",
    "* * *",
    "- \n- \n-",
    "1.",
    "99999999999. big",
    "2147483648. x",
    ">",
    "> ",
    ">>>>>>>>>>",
    "> " * 40 + "deep",
    "- " * 40 + "deep",
    "*" * 300 + "x" + "*" * 300,
    "[" * 200 + "x" + "](http://a)" * 200,
    "![" * 50 + "x" + "](http://a)" * 50,
    "|",
    "| a |",
    "| a | b |\n|---|",
    "| a | b |\n|---|---|",
    "| a | b |\n|---|---|\n| c",
    "a | b\n- | -\n1 | 2 | 3 | 4",
    "#",
    "######## not a heading",
    "# ",
    "Setext\n---",
    "\n\n\n",
    " ",
    "\t",
    "\u00a0",
    "\u200b",
    "\u2028\u2029",
    "\r\n\r\n**crlf**\r\nline\r",
    "\0",
    "a\0b **\0**",
    "😀",
    "👩‍👩‍👧‍👦 **family**",
    "🇺🇦🏳️‍🌈 `flags`",
    "𝕳𝖊𝖑𝖑𝖔 *𝖜𝖔𝖗𝖑𝖉*",
    "\U0010ffff\U00010000",
    "\ud83d",
    "[x](http://a/\ud83d)",
    "`\ud800`",
    "中文**粗体**和*斜体*",
    "עברית **מודגש** עם English",
    "مرحبا *بالعالم*",
    "combining é é ñ",
    "tab\tseparated\tvalues",
    "    \tindented tab",
    "- a\n\t- b\n\t\t- c",
    "1. a\n\t```\n\tcode\n\t```",
    "> ```\n> unclosed in quote",
    "- ```\n  unclosed in list",
    "<http://a.b/c?d=e&f=g>",
    "<mailto:a@b.c> <a@b.c>",
    '[x](http://a.b/"><script>)',
    "[x](<http://a b/c>)",
    "[x](tg://resolve?domain=a_b)",
    "[x](HTTP://UPPER.CASE)",
    "[x](http://)",
    "[x](mailto:)",
    "[x](javascript:void(0))",
    "[`code` in link](http://a)",
    "**[bold link](http://a)** and [**link bold**](http://b)",
    "*[a](http://x)*[b](http://y)",
    "[a](http://x)[b](http://x)",
    "***",
    "___",
    "a\n***\nb",
    "a\n---\nb",
    "a\n- b\n# c\n> d\n```\ne\n```\n| f | g |\n|---|---|",
    "- a\n> b",
    "1. one\n\n   two\n\n       code in item\n3. three",
    "- [x] done\n- [ ] todo",
    "Term\n: definition",
    "$$x^2$$ and $y_1$",
    "footnote[^1]\n\n[^1]: note",
    "   - three spaces",
    "  \n  \n**b**  \n  ",
    "line with trailing spaces   \nnext",
    "x" * 5000,
    ("word " * 200 + "\n") * 5,
]


@pytest.mark.parametrize("markdown", NASTY + [case[0] for case in CASES])
def test_nasty_inputs_render_valid_and_no_longer(markdown: str) -> None:
    check_both(markdown)


def test_random_inputs_render_valid_and_no_longer() -> None:
    pieces = [
        *"*_~`[]()<>&\\|#!-+=.{}\n ",
        *["**", "__", "~~", "```", "```py\n", "\n\n", "- ", "1. ", "> ", "# ", "    "],
        *["](http://x.y/", "![", "&amp;", "&#x1F600;", "| a |", "|---|", "\n|-|-|\n"],
        *["<b>", "<div>", "😀", "中", "\t", "\r\n", "\0", "\ud83d", "tg://u", "text"],
    ]
    rng = random.Random(20240611)
    for _ in range(1500):
        check_both("".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))))


# --- Answers as they stream in ---------------------------------------------------------------

ANSWERS = [
    """\
## Reading a file in Python

Use a `with` block so the file is **always closed**, even on errors:

```python
from pathlib import Path

def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:  # closes on exit
        return [line.rstrip("\\n") for line in f]

print(read_lines("data.txt")[:3])
```

A few notes:

1. `encoding="utf-8"` avoids platform-dependent defaults.
2. For *huge* files, iterate instead of building a list.
3. `Path("data.txt").read_text()` is the one-liner.

See the [docs](https://docs.python.org/3/library/functions.html#open) for modes (`r`, `rb`, `a+`).
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
To build it:

1. Install Go 1.22+:
   ```sh
   curl -LO https://go.dev/dl/go1.22.linux-amd64.tar.gz
   sudo tar -C /usr/local -xzf go1.22.linux-amd64.tar.gz
   ```
2. Write `main.go`:
   ```go
   package main

   import "fmt"

   func main() {
   \tfor i := 0; i < 3; i++ {
   \t\tfmt.Printf("%d! = %d\\n", i, fact(i))
   \t}
   }
   ```
3. Run `go run .` — output ends with `2! = 2`.

If it fails with `exit status 2`, check `$PATH` (e.g. `echo $PATH | tr ':' '\\n'`).
""",
    """\
# Summary 📋

**TL;DR:** use <kbd>Ctrl</kbd>+<kbd>C</kbd> & then `q`. The "safe" way is *not* the default.

- [x] step one (done)
- [ ] step two — see ![diagram](https://example.com/d.png "diagram")
* mixed * markers **with _nested_ emphasis**

Links: <https://example.com/a_b?x=1&y=2>, [tg](tg://user?id=42), [bad](javascript:alert(1)).

Math-ish: 2 * 3 = 6, a_b_c, 1. not a list, #hashtag, {braces}, [brackets], (parens)!

中文内容 **加粗** 和 `代码`。 Emoji: 👩‍💻🚀 \\*escaped\\* \\_too\\_

***

> Quote with `code` and a [link](https://x.org)
> > nested quote
""",
]


@pytest.mark.parametrize("answer", ANSWERS, ids=["python", "table", "go", "mixed"])
def test_every_prefix_of_a_streamed_answer(answer: str) -> None:
    for end in range(len(answer) + 1):
        check_both(answer[:end])


@pytest.mark.parametrize("answer", ANSWERS, ids=["python", "table", "go", "mixed"])
def test_complete_answers_are_formatted(answer: str) -> None:
    html = to_html(answer)
    assert "<b>" in html or "<pre>" in html
    assert "**" not in visible_text(html).replace("\\*", "")


def test_complete_answer_rendering() -> None:
    html = to_html(ANSWERS[1])
    table = "Option    |   Speed |   Memory   | Notes\nlist      |    fast |    high    | simple"
    assert html.startswith(f"Here's a comparison of the options:\n\n<pre>{table}")
    assert "• <b>Lists</b>\n  • random access\n" in html
    assert "<blockquote>Note: benchmark with <i>your</i> data — results vary by 2x-10x!" in html
    assert html.endswith("———\n\nQuestions? Ask away. 🙂")
    go = to_markdown_v2(ANSWERS[2])
    assert "1\\. Install Go 1\\.22\\+:\n  ```sh\ncurl -LO" in go
    assert "\tfor i := 0; i < 3; i++ {\n" in go
