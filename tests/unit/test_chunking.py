"""split_chunks, text_length and markdown_to_plain: examples and seeded random properties."""

from __future__ import annotations

import random
import re
import time

import pytest

from gateway.chunking import MIN_CHUNK, markdown_to_plain, split_chunks, text_length
from gateway.contracts.messages import SendLimits

WS = " \t\n\r\f\v"
OPENER = re.compile(r" {0,3}(`{3,}|~{3,})([^\n]*)")
ADDED_CLOSE = re.compile(r"\n(`{3,}|~{3,})\Z")
CPU_SECONDS = 10.0
"""CPU time allowed for a megabyte; linear code needs about a second, quadratic code hours."""


def open_fence(chunk: str) -> str | None:
    """The fence still open at the end of `chunk` (an independent CommonMark reading)."""
    current: str | None = None
    for raw in chunk.split("\n"):
        line = raw.rstrip("\r")
        if current is None:
            m = OPENER.fullmatch(line)
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                current = m.group(1)
        elif re.fullmatch(rf" {{0,3}}{re.escape(current[0])}{{{len(current)},}}[ \t]*", line):
            current = None
    return current


def bodies(chunk: str, first: bool) -> list[tuple[str, bool, bool]]:
    """Ways to read `chunk` as (original text, reopened, closed) with added fence lines removed."""
    head, sep, rest = chunk.partition("\n")
    reopen = not first and bool(sep) and OPENER.fullmatch(head) is not None
    options = [(chunk, False, False)]
    if reopen:
        options.append((rest, True, False))
    if ADDED_CLOSE.search(chunk):
        closed = ADDED_CLOSE.sub("", chunk)
        options.append((closed, False, True))
        if reopen and "\n" in closed:
            options.append((closed.partition("\n")[2], True, True))
    return options


def reassemble(text: str, chunks: list[str]) -> bool:
    """True when the chunks, added fence lines removed, are `text` in order with only
    whitespace between them; a close added to one chunk must be reopened by the next."""
    failed: set[tuple[int, int, bool]] = set()

    def walk(i: int, pos: int, closed_before: bool) -> bool:
        if i == len(chunks):
            return not text[pos:].strip(WS)
        if (i, pos, closed_before) in failed:
            return False
        for body, reopened, closed in bodies(chunks[i], first=i == 0):
            if reopened != closed_before or not body.strip():
                continue
            at = text.find(body, pos)
            if at < 0 or text[pos:at].strip(WS):
                continue
            if walk(i + 1, at + len(body), closed):
                return True
        failed.add((i, pos, closed_before))
        return False

    return walk(0, 0, False)


def check_chunks(text: str, max_len: int, utf16: bool) -> list[str]:
    """split_chunks(text) with every property asserted."""
    chunks = split_chunks(text, max_len, utf16=utf16)
    assert chunks == split_chunks(text, max_len, utf16=utf16)
    if not text.strip():
        assert chunks == []
        return chunks
    if text_length(text, utf16=utf16) <= max_len:
        assert chunks == [text]
        return chunks
    for chunk in chunks:
        assert text_length(chunk, utf16=utf16) <= max_len, (chunk, max_len)
        assert chunk.strip()
        assert chunk == chunk.rstrip(WS)
        assert chunk[0] not in "\r\n"
        if chunk[0] in " \t":  # only a code line or a fence-looking line keeps its indent
            assert chunk.lstrip(" \t").startswith(("```", "~~~")), chunk
    assert reassemble(text, chunks), (text, max_len, utf16, chunks)
    return chunks


# --- text_length ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "points", "units"),
    [
        ("", 0, 0),
        ("abc", 3, 3),
        ("😀", 1, 2),
        ("a😀b", 3, 4),
        ("e\u0301", 2, 2),
        ("中文", 2, 2),
        ("👨‍👩‍👧", 5, 8),
        ("\ud800", 1, 1),
    ],
)
def test_text_length(text: str, points: int, units: int) -> None:
    assert text_length(text, utf16=False) == points
    assert text_length(text, utf16=True) == units


# --- split_chunks: basics ------------------------------------------------------------------


@pytest.mark.parametrize("max_len", [-1, 0, 1, MIN_CHUNK - 1])
def test_limit_below_minimum_is_rejected(max_len: int) -> None:
    with pytest.raises(ValueError, match="max_len"):
        split_chunks("hello", max_len)


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \t\r\n ", "\u3000"])
def test_blank_text_gives_no_chunks(text: str) -> None:
    assert split_chunks(text, 100) == []


@pytest.mark.parametrize("text", ["hi", "  padded  \n", "x" * 16, "```\ncode\n```"])
def test_text_that_fits_is_one_unchanged_chunk(text: str) -> None:
    assert split_chunks(text, 16) == [text]


def test_prefers_paragraph_boundary() -> None:
    text = "First paragraph here.\nSecond line.\n\nThird para. And a long tail of words"
    assert split_chunks(text, 60) == [
        "First paragraph here.\nSecond line.",
        "Third para. And a long tail of words",
    ]


def test_prefers_line_break_over_space() -> None:
    text = "one two three\nfour five six seven eight"
    assert split_chunks(text, 30) == ["one two three", "four five six seven eight"]


def test_prefers_sentence_end_over_other_spaces() -> None:
    text = "Short one. Then a sentence that goes on and on"
    assert split_chunks(text, 40) == ["Short one.", "Then a sentence that goes on and on"]


def test_breaks_at_last_space_when_no_sentence_end() -> None:
    text = "alpha beta gamma delta epsilon zeta eta theta"
    assert split_chunks(text, 20) == ["alpha beta gamma", "delta epsilon zeta", "eta theta"]


def test_long_single_word_is_cut_only_where_needed() -> None:
    word = "".join(chr(ord("a") + i % 26) for i in range(70))
    chunks = split_chunks(f"start {word} end", 16)
    assert chunks[0] == "start"
    assert all(len(c) <= 16 for c in chunks)
    assert "".join(chunks[1:-1]) + chunks[-1].removesuffix(" end") == word
    assert [len(c) for c in chunks[1:-1]] == [16, 16, 16, 16]


def test_chunks_lose_only_whitespace_at_breaks() -> None:
    text = "word " * 200
    chunks = check_chunks(text, 50, utf16=False)
    assert " ".join(chunks) == text.strip()


# --- split_chunks: length counting ---------------------------------------------------------


def test_emoji_count_two_units_when_utf16() -> None:
    text = "😀" * 20
    assert split_chunks(text, 16, utf16=True) == ["😀" * 8, "😀" * 8, "😀" * 4]
    assert split_chunks(text, 16, utf16=False) == ["😀" * 16, "😀" * 4]


def test_never_cuts_a_surrogate_pair_at_an_odd_limit() -> None:
    text = "a" + "😀" * 20
    chunks = split_chunks(text, 16, utf16=True)
    assert chunks[0] == "a" + "😀" * 7
    assert all(text_length(c, utf16=True) <= 16 for c in chunks)
    assert "".join(chunks) == text


def test_telegram_limit_counts_utf16_units() -> None:
    limits = SendLimits(max_chunk=4096, count_utf16=True)
    rng = random.Random(4096)
    words = ["hello", "world", "😀", "🎉🎉", "naïve", "中文", "👍🏽", "ok."]
    text = " ".join(rng.choice(words) for _ in range(5000))
    chunks = check_chunks(text, limits.max_chunk, utf16=limits.count_utf16)
    assert len(chunks) > 1
    assert all(text_length(c, utf16=True) <= 4096 for c in chunks)
    by_code_points = split_chunks(text, 4096, utf16=False)
    assert max(text_length(c, utf16=True) for c in by_code_points) > 4096


def test_hard_cut_keeps_emoji_clusters_whole() -> None:
    family = "👨‍👩‍👧"
    text = "x" * 13 + family + "y" * 20
    chunks = split_chunks(text, 16)
    assert chunks[0] == "x" * 13
    assert chunks[1].startswith(family)
    flags = "🇫🇷" * 12
    chunks = split_chunks("a" + flags, 16)
    assert all(len(c.lstrip("a")) % 2 == 0 for c in chunks)
    assert "".join(chunks) == "a" + flags


def test_hard_cut_keeps_combining_marks_with_their_letter() -> None:
    text = "x" * 15 + "e\u0301" + "z" * 10
    chunks = split_chunks(text, 16)
    assert chunks == ["x" * 15, "e\u0301" + "z" * 10]


def test_crlf_is_never_split() -> None:
    lines = [f"line number {i} has some words" for i in range(40)]
    text = "\r\n".join(lines) + "\r\n"
    chunks = check_chunks(text, 70, utf16=False)
    for chunk in chunks:
        assert not chunk.endswith("\r")
        assert not chunk.startswith("\n")
    assert "\r\n".join(chunks) == text.strip()


def test_crlf_paragraphs() -> None:
    text = "para one is here\r\n\r\npara two is here\r\n\r\npara three here"
    assert split_chunks(text, 36) == ["para one is here\r\n\r\npara two is here", "para three here"]


def test_chinese_without_spaces_breaks_after_sentences() -> None:
    text = "这是一个测试。" * 8
    chunks = check_chunks(text, 16, utf16=True)
    assert chunks == ["这是一个测试。这是一个测试。"] * 4


def test_chinese_without_punctuation_is_cut_hard() -> None:
    text = "中文没有空格也没有标点" * 10
    chunks = check_chunks(text, 16, utf16=False)
    assert "".join(chunks) == text
    assert all(len(c) == 16 for c in chunks[:-1])


# --- split_chunks: code fences -------------------------------------------------------------

CODE = "\n".join(f"    value_{i} = compute({i})" for i in range(12))


def test_fence_is_closed_and_reopened_with_its_language() -> None:
    text = f"Here is the code:\n\n```python\ndef f():\n{CODE}\n```\n\nThat was it."
    chunks = check_chunks(text, 120, utf16=False)
    assert chunks[0] == "Here is the code:"
    assert chunks[-1].endswith("```\n\nThat was it.")
    code = chunks[1:]
    assert len(code) > 2
    for chunk in code:
        assert chunk.startswith("```python\n")
        assert open_fence(chunk) is None
    for chunk in code[:-1]:
        assert chunk.endswith("\n```")
    for chunk in code[1:]:
        assert chunk.split("\n")[1].startswith("    value_")  # indentation kept


def test_added_fence_text_counts_toward_limit() -> None:
    text = "```python\n" + "\n".join("x" * 20 for _ in range(10)) + "\n```"
    chunks = check_chunks(text, 40, utf16=False)
    assert all(len(c) <= 40 for c in chunks)
    assert chunks[0] == "```python\n" + "x" * 20 + "\n```"
    assert chunks[1] == "```python\n" + "x" * 20 + "\n```"


def test_tilde_and_long_fences_close_with_their_own_marker() -> None:
    text = "~~~\n" + "\n".join(f"tilde line {i}" for i in range(10)) + "\n~~~"
    chunks = check_chunks(text, 50, utf16=False)
    assert all(c.startswith("~~~\n") and c.endswith("\n~~~") for c in chunks)
    inner = "```\nnot a closer\n```"
    text = "````md\n" + "\n".join([inner] * 6) + "\n````"
    chunks = check_chunks(text, 60, utf16=False)
    assert len(chunks) > 1
    for chunk in chunks:
        assert chunk.startswith("````md\n")
        assert chunk.endswith("\n````")
        assert open_fence(chunk) is None


def test_code_block_that_fits_is_moved_whole_to_the_next_chunk() -> None:
    text = "Some words before the code.\n```sh\necho one\necho two\n```\nafter"
    assert split_chunks(text, 45) == [
        "Some words before the code.",
        "```sh\necho one\necho two\n```\nafter",
    ]


def test_break_after_a_closing_fence_is_preferred() -> None:
    text = "Look:\n```sh\necho hi\n```\nand then some more words go here"
    assert split_chunks(text, 40) == [
        "Look:\n```sh\necho hi\n```",
        "and then some more words go here",
    ]


def test_no_chunk_starts_with_a_fence_that_was_mid_line() -> None:
    text = "some words then ```python and more words after it"
    chunks = check_chunks(text, 24, utf16=False)
    assert not any(c.startswith("```") for c in chunks)


def test_fence_looking_indented_line_keeps_its_indentation() -> None:
    text = "intro words here\n\n    ```\n    not a fence, an indented code block"
    chunks = check_chunks(text, 50, utf16=False)
    assert chunks[0] == "intro words here"
    assert chunks[1].startswith("    ```\n")


def test_indented_fence_up_to_three_spaces_counts() -> None:
    text = "   ```js\n" + "\n".join(f"   let v{i} = {i};" for i in range(10)) + "\n   ```"
    chunks = check_chunks(text, 50, utf16=False)
    assert chunks[0].startswith("   ```js\n")
    assert all(c.startswith("   ```js\n") for c in chunks)
    assert all(open_fence(c) is None for c in chunks)


def test_four_space_indent_is_not_a_fence() -> None:
    text = "    ```\n" + "\n".join(f"    plain line {i}" for i in range(10))
    chunks = check_chunks(text, 40, utf16=False)
    assert not any(c.endswith("```") for c in chunks[1:])
    assert not any(c.startswith("```") for c in chunks[1:])


def test_inline_triple_backticks_are_not_a_fence() -> None:
    text = "use ```x``` inline " * 6
    chunks = check_chunks(text, 40, utf16=False)
    assert all(not c.endswith("\n```") for c in chunks)


def test_unclosed_fence_stays_unclosed_in_the_last_chunk() -> None:
    text = "```py\n" + "\n".join(f"print({i})" for i in range(20))
    chunks = check_chunks(text, 40, utf16=False)
    assert all(open_fence(c) is None for c in chunks[:-1])
    assert open_fence(chunks[-1]) == "```"
    assert not chunks[-1].endswith("\n```")


def test_long_opening_line_is_shortened_when_reopened() -> None:
    opener = "```python title='a_rather_long_file_name.py' linenums='1'"
    text = opener + "\n" + "\n".join(f"x{i} = {i}" for i in range(20)) + "\n```"
    chunks = check_chunks(text, 48, utf16=False)
    assert chunks[0].startswith(opener[:20]) or chunks[0].startswith("```")
    assert all(c.startswith("```python\n") for c in chunks[1:])
    assert all(open_fence(c) is None for c in chunks)


def test_closing_fence_line_is_never_split_or_stranded() -> None:
    text = "````md\nshort\n" + "w" * 70 + " \n````\nafter"
    assert check_chunks(text, 80, utf16=False) == [
        "````md\nshort\n````",
        "````md\n" + "w" * 68 + "\n````",
        "````md\nww \n````\nafter",
    ]


def test_shortened_reopen_never_lengthens_the_fence() -> None:
    opener = "~~~ ~sh title=very-long-name.txt"
    text = opener + "\n" + "\n".join(f"line {i} here" for i in range(8)) + "\n~~~"
    chunks = check_chunks(text, 40, utf16=False)
    assert chunks[0].startswith(opener + "\n")
    assert all(c.startswith("~~~ ~sh\n") for c in chunks[1:])
    assert all(open_fence(c) is None for c in chunks)


def test_a_fence_looking_line_is_not_cut_into_a_fence() -> None:
    # "```x y and `z` ok" is not a fence (a backtick follows); "```x y and" would be one.
    assert split_chunks("hello there\n```x y and `z` ok", 24) == [
        "hello there",
        "```x y and `z` ok",
    ]


def test_long_code_line_is_split_with_fences() -> None:
    text = "```\n" + "token " * 30 + "\n```"
    chunks = check_chunks(text, 32, utf16=False)
    assert all(c.startswith("```\n") and c.endswith("\n```") for c in chunks)


# --- split_chunks: random properties -------------------------------------------------------

WORDS = ["the", "gateway", "sends", "a", "chunk", "snake_case", "naïve", "über", "x", "ok"]
DECOR = ["**bold**", "_it_", "`code`", "[link](https://example.com/a_b)", "😀", "👍🏽", "🎉🎉"]
CJK = ["这是一个测试。", "中文没有空格", "日本語のテキスト！", "한국어"]
SEPARATORS = [" ", " ", " ", " ", "\n", "\n\n", "\r\n", "\r\n\r\n", "  \n", "\t", ". ", "! "]
FENCES = [
    ("```", "```"),
    ("```python", "```"),
    ("```js title", "```"),
    ("~~~", "~~~"),
    ("~~~~text", "~~~~"),
    ("````md", "````"),
    ("  ```", "  ```"),
    ("    ```", "    ```"),
]


def random_words(rng: random.Random, count: int) -> str:
    parts: list[str] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.6:
            parts.append(rng.choice(WORDS))
        elif roll < 0.75:
            parts.append(rng.choice(DECOR))
        elif roll < 0.85:
            parts.append(rng.choice(CJK))
        elif roll < 0.9:
            parts.append("".join(rng.choice("abcdefghij") for _ in range(rng.randint(20, 90))))
        elif roll < 0.95:
            parts.append("# Heading" if rng.random() < 0.5 else "- item")
        else:
            parts.append(rng.choice(["e\u0301", "👨‍👩‍👧", "🇫🇷🇩🇪"]))
        parts.append(rng.choice(SEPARATORS))
    return "".join(parts)


def random_code(rng: random.Random, unclosed: bool) -> str:
    opener, closer = rng.choice(FENCES)
    lines = [
        " " * rng.choice([0, 2, 4, 8]) + random_words(rng, rng.randint(1, 8)).replace("\n", " ")
        for _ in range(rng.randint(1, 12))
    ]
    if rng.random() < 0.2:
        lines.insert(rng.randint(0, len(lines)), "")
    if not unclosed:
        lines.append(closer)
    return "\n".join([opener, *lines])


def random_reply(rng: random.Random, *, unclosed: bool = True) -> str:
    """Markdown-ish text: words, emoji, CJK, CRLF, headings, code fences (some unclosed)."""
    blocks: list[str] = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.3:
            blocks.append("\n" + random_code(rng, unclosed and rng.random() < 0.1))
            blocks.append(rng.choice(["\n\n", "\n", "\r\n"]))
        else:
            blocks.append(random_words(rng, rng.randint(1, 40)))
            blocks.append(rng.choice(["\n\n", "\n", "\r\n\r\n", " "]))
    return rng.choice(["", " ", "\n"]) + "".join(blocks)


@pytest.mark.parametrize("seed", range(6))
def test_random_replies_round_trip_within_limit(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        text = random_reply(rng)
        max_len = rng.randint(MIN_CHUNK, 300)
        utf16 = rng.random() < 0.5
        chunks = check_chunks(text, max_len, utf16)
        if max_len >= 40:
            assert all(open_fence(c) is None for c in chunks[:-1]), (text, max_len, chunks)


@pytest.mark.parametrize("seed", range(4))
def test_random_limits_and_plain_text(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(50):
        text = random_words(rng, rng.randint(1, 200))
        max_len = rng.randint(MIN_CHUNK, 300)
        check_chunks(text, max_len, utf16=rng.random() < 0.5)


def test_round_trip_checker_catches_lost_text() -> None:
    assert reassemble("one two three", ["one", "three"]) is False
    assert reassemble("one two", ["one two"]) is True


# --- split_chunks: speed -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "utf16"),
    [("mixed", True), ("mixed", False), ("one_word", False), ("emoji", True), ("code", True)],
)
def test_megabyte_reply_splits_fast(name: str, utf16: bool) -> None:
    rng = random.Random(7)
    if name == "mixed":
        parts: list[str] = []
        while sum(map(len, parts)) < 1_000_000:
            parts.extend(random_reply(rng) for _ in range(100))
        text = "".join(parts)
    elif name == "one_word":
        text = "a" * 1_000_000
    elif name == "emoji":
        text = "😀" * 500_000
    else:
        text = "```python\n" + "    x = compute(1)  # comment\n" * 35_000 + "```"
    started = time.process_time()
    chunks = split_chunks(text, 4096, utf16=utf16)
    elapsed = time.process_time() - started
    assert elapsed < CPU_SECONDS, elapsed
    assert all(text_length(c, utf16=utf16) <= 4096 for c in chunks)
    assert len(chunks) >= len(text) // 4096


def test_megabyte_reply_small_limit_is_linear() -> None:
    text = ("word " * 50 + "\n") * 4000
    started = time.process_time()
    chunks = split_chunks(text, 16)
    assert time.process_time() - started < CPU_SECONDS
    assert len(chunks) > 60_000


# --- markdown_to_plain ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "plain"),
    [
        ("**bold** and __strong__", "bold and strong"),
        ("*it* and _it_", "it and it"),
        ("snake_case_name and a_b_c stay", "snake_case_name and a_b_c stay"),
        ("***both***", "both"),
        ("~~gone~~ and ~5 min", "gone and ~5 min"),
        ("5 * 3 = 15 and 2 * 4", "5 * 3 = 15 and 2 * 4"),
        ("**unclosed bold", "**unclosed bold"),
        ("`code_here` and `**x**`", "code_here and **x**"),
        ("``a ` b``", "a ` b"),
        ("**bold with `code`**", "bold with code"),
        ("[Herald](https://example.com/a_b)", "Herald (https://example.com/a_b)"),
        ("[**bold** link](https://x.y)", "bold link (https://x.y)"),
        ("![logo](https://x.y/logo.png)", "logo (https://x.y/logo.png)"),
        ("[https://x.y](https://x.y)", "https://x.y"),
        (
            "[wiki](https://en.wikipedia.org/wiki/Foo_(bar))",
            "wiki (https://en.wikipedia.org/wiki/Foo_(bar))",
        ),
        ('[t](https://x.y "Title")', "t (https://x.y)"),
        ("<https://a.b/c_d_>", "https://a.b/c_d_"),
        ("see https://example.com/_x_/y_ now", "see https://example.com/_x_/y_ now"),
        ("# Title\n## Sub ##\n###### Six", "Title\nSub\nSix"),
        ("#hashtag stays", "#hashtag stays"),
        ("- item\n* other\n+ third\n  * nested", "- item\n- other\n- third\n  - nested"),
        ("1. one\n2. two", "1. one\n2. two"),
        ("***\n---\n___", "---\n---\n---"),
        ("> quote **b**", "> quote b"),
        ("\\*not emphasis\\* and \\_x\\_", "*not emphasis* and _x_"),
        ("line\\\nbreak", "line\nbreak"),
        ("**a\nb**", "a\nb"),
        ("**a\n\nb**", "**a\n\nb**"),
        ("a\r\n# T\r\n**b**\r\n", "a\r\nT\r\nb\r\n"),
    ],
)
def test_markdown_to_plain(markdown: str, plain: str) -> None:
    assert markdown_to_plain(markdown) == plain


def test_markdown_to_plain_keeps_code_blocks_without_fences() -> None:
    markdown = "Run:\n\n```python\ndef f(x):\n    return x * 2  # **not bold**\n```\n\nDone."
    assert markdown_to_plain(markdown) == (
        "Run:\n\ndef f(x):\n    return x * 2  # **not bold**\n\nDone."
    )
    assert markdown_to_plain("~~~\n_x_\n~~~") == "_x_\n"
    assert markdown_to_plain("  ```\n  indented\n    more\n  ```") == "indented\n  more\n"
    assert markdown_to_plain("```\nunclosed *x*") == "unclosed *x*"


def alnum(text: str) -> str:
    return "".join(re.findall(r"[^\W_]", text))


@pytest.mark.parametrize("seed", range(3))
def test_markdown_to_plain_never_loses_words(seed: int) -> None:
    rng = random.Random(500 + seed)
    for _ in range(100):
        markdown = random_reply(rng, unclosed=False)
        without_fence_lines = "\n".join(
            line for line in markdown.split("\n") if not OPENER.fullmatch(line.rstrip("\r"))
        )
        assert alnum(markdown_to_plain(markdown)) == alnum(without_fence_lines), markdown


def test_markdown_to_plain_is_fast_on_a_megabyte() -> None:
    text = ("**bold** _it_ `code` [l](https://x.y) snake_case * _ ** __ " * 20 + "\n\n") * 900
    started = time.process_time()
    plain = markdown_to_plain(text)
    assert time.process_time() - started < CPU_SECONDS
    assert "snake_case" in plain
