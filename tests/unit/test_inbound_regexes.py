"""The regex audit: no regular expression on an inbound path is super-linear on hostile input.

Every module-level pattern of the audited modules is listed in `WORST` with the input that
makes it work hardest (long runs of what it looks for, with the end it needs missing); each
must get through 200,000 such characters within `BOUND` seconds. The bound has a reason, not a
timing: a linear pattern needs milliseconds for that, a quadratic one minutes (the attribution
pattern took 37 s on 450,000 characters). A new pattern in these modules fails
`test_every_pattern_is_audited` until it is added here.
"""

from __future__ import annotations

import functools
import importlib
import re
import time
from collections.abc import Callable

import pytest

from adapters.email import authres
from adapters.email.config import EmailConfig
from adapters.email.convert import (
    HeaderTooLong,
    html_to_text,
    over_limits,
    strip_quoted,
    to_received,
)
from gateway.chunking import markdown_to_plain, split_chunks
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import utcnow

N = 200_000
BOUND = 10.0
"""Seconds for one pattern over N hostile characters (see the module docstring): generous for
a machine busy with other tests, still far below a quadratic pattern's minutes."""
WHOLE_BOUND = 20.0
"""Seconds for a whole conversion over N hostile characters: linear ones take about a second
here; the quadratic ones this audit fixed took minutes to hours."""

MODULES = (
    "adapters.discord.convert",
    "adapters.email.convert",
    "adapters.email.imap",
    "adapters.loopback.convert",
    "adapters.slack.convert",
    "adapters.telegram.convert",
    "adapters.twilio.convert",
    "adapters.markdown",
    "adapters.slack.markup",
    "gateway.chunking",
    "gateway.commands",
    "gateway.sessions.commands",
)


def _repeat(fragment: str, prefix: str = "") -> str:
    return prefix + fragment * ((N - len(prefix)) // len(fragment))


# (module, name) → the hostile inputs, and whether the code only ever calls `match` on it.
WORST: dict[tuple[str, str], tuple[list[str], bool]] = {
    ("adapters.discord.convert", "_MENTION"): (
        [_repeat("<@!1"), _repeat("<@"), _repeat("1")],
        False,
    ),
    ("adapters.email.convert", "_ROBOT_LOCALPARTS"): (
        [_repeat("-", "bounces"), _repeat("no-")],
        True,
    ),
    ("adapters.email.convert", "_REPLY_PREFIX"): (
        [_repeat("re "), _repeat("re:[1] "), _repeat(" ")],
        False,
    ),
    ("adapters.email.convert", "_ATTRIBUTION"): (
        [
            _repeat(" <a", "on "),
            _repeat(" wrote", "on "),
            _repeat(" ", "le "),
            _repeat("a écrit ", "le "),
        ],
        False,
    ),
    ("adapters.email.convert", "_SCHRIEB"): (
        [_repeat(" schrieb", "am "), _repeat(" ", "am ")],
        True,
    ),
    ("adapters.email.convert", "_NAMED_WROTE"): (
        [_repeat(" <a"), _repeat(" <a>"), _repeat(" <a> wrote"), _repeat(" ", " <a>")],
        False,
    ),
    ("adapters.email.convert", "_ORIGINAL"): (
        [_repeat("-"), _repeat("- "), _repeat("_"), _repeat(" ")],
        True,
    ),
    ("adapters.email.convert", "_OUTLOOK_FROM"): (
        [_repeat(" "), _repeat("*"), _repeat(" ", "from: ")],
        True,
    ),
    ("adapters.email.convert", "_SENT_LINE"): (
        [_repeat(" "), _repeat("*"), _repeat(" ", "sent: ")],
        True,
    ),
    ("adapters.email.convert", "_MOBILE_SIGNATURE"): (
        [_repeat(" "), _repeat("a", "sent from my ")],
        True,
    ),
    ("adapters.email.convert", "_LONE_LT"): (
        [_repeat("<a "), _repeat("<"), _repeat("</"), _repeat("<!--"), _repeat("<a b='")],
        False,
    ),
    ("adapters.email.convert", "_BOUNDARY"): (
        [_repeat("boundary"), _repeat(" ", "boundary="), _repeat("a", 'boundary="')],
        False,
    ),
    ("adapters.email.convert", "_DASH_LINE"): ([_repeat("\n--"), _repeat("-")], False),
    ("adapters.twilio.convert", "E164"): ([_repeat("1", "+"), _repeat("+1")], True),
    ("adapters.email.imap", "_UIDVALIDITY"): ([_repeat("[UIDVALIDITY 1"), _repeat("[")], False),
    ("adapters.email.imap", "_UIDNEXT"): ([_repeat("[UIDNEXT 1"), _repeat("[")], False),
    ("adapters.email.imap", "_FETCH_UID"): (
        [_repeat("("), _repeat("( UID"), _repeat("UID 1")],
        False,
    ),
    ("adapters.email.imap", "_FETCH_SIZE"): ([_repeat("RFC822.SIZE "), _repeat("1")], False),
    ("adapters.telegram.convert", "BOT_TOKEN"): (
        [_repeat("1"), _repeat("1:"), _repeat("1 ")],
        False,
    ),
    ("adapters.telegram.convert", "_MENU_COMMAND"): ([_repeat("a"), _repeat("_")], True),
    ("adapters.markdown", "_ALIGN"): ([_repeat("text-align:"), _repeat(" ", "text-align:")], False),
    ("adapters.markdown", "_LANG_JUNK"): ([_repeat("!"), _repeat("a")], False),
    ("adapters.slack.markup", "_BARE_URL"): ([_repeat("http://"), _repeat("a", "http://")], False),
    ("adapters.slack.markup", "_URL_STOP"): ([_repeat("&l"), _repeat("&")], False),
    ("adapters.slack.markup", "_URL_UNSAFE"): ([_repeat("a")], False),
    ("adapters.slack.markup", "_CODE_TICKS"): ([_repeat("`")], False),
    ("adapters.slack.markup", "_SLACK_SYNTAX"): (
        [_repeat("<"), _repeat("<a"), _repeat("&am")],
        False,
    ),
    ("adapters.slack.markup", "_SLACK_ENTITY"): ([_repeat("&am"), _repeat("&")], False),
    ("adapters.slack.markup", "_SCHEME"): ([_repeat("http:/"), _repeat("mailto")], False),
    ("gateway.chunking", "_WS_RUN"): ([_repeat(" a")], False),
    ("gateway.chunking", "_ASTRAL"): ([_repeat("a")], False),
    ("gateway.chunking", "_FENCE_OPEN"): (
        [_repeat("`"), _repeat(" ", "```"), _repeat("```a`"), _repeat("~"), _repeat("\n```")],
        False,
    ),
    ("gateway.chunking", "_CJK_SENTENCE_END"): ([_repeat("。」"), _repeat("」")], False),
    ("gateway.chunking", "_CJK_SOFT_BREAK"): ([_repeat("a")], False),
    ("gateway.chunking", "_FENCE_LIKE"): ([_repeat(" "), _repeat("``")], False),
    ("gateway.chunking", "_NEWLINE"): ([_repeat("a")], False),
    ("gateway.chunking", "_LINE_MARK"): (
        [
            _repeat(" ", "# "),
            _repeat(" #", "# "),
            _repeat(" -"),
            _repeat("- "),
            _repeat(" "),
            _repeat("\t"),
        ],
        False,
    ),
    ("gateway.chunking", "_BLANK_LINE"): ([_repeat("\n "), _repeat(" ")], False),
    # Only matched at a `[` the inline scan found, never searched for.
    ("gateway.chunking", "_LINK"): (
        [_repeat("[\\"), _repeat("[a]", "["), _repeat("a", "[a]("), _repeat("(a)", "[a](")],
        True,
    ),
    ("gateway.chunking", "_INLINE"): (
        [_repeat("<http:"), _repeat("`"), _repeat("\\"), _repeat("http://a"), _repeat("[h")],
        False,
    ),
    ("gateway.chunking", "_INLINE_MARK"): ([_repeat(":/"), _repeat("a")], False),
    ("gateway.chunking", "_DELIMITER_RUN"): ([_repeat("~"), _repeat("*_")], False),
}


def _patterns() -> list[tuple[str, str, re.Pattern[str]]]:
    found = []
    for module in MODULES:
        for name, value in vars(importlib.import_module(module)).items():
            if isinstance(value, re.Pattern):
                found.append((module, name, value))
    return found


def test_every_pattern_is_audited() -> None:
    missing = [(m, n) for m, n, _ in _patterns() if (m, n) not in WORST]
    assert missing == []


def _elapsed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


@pytest.mark.parametrize(("module", "name"), sorted(WORST))
def test_pattern_is_linear_on_hostile_input(module: str, name: str) -> None:
    pattern = vars(importlib.import_module(module))[name]
    inputs, match_only = WORST[(module, name)]
    for text in inputs:
        if isinstance(pattern.pattern, bytes):
            subject: str | bytes = text.encode()
        else:
            subject = text
        if match_only:
            elapsed = _elapsed(functools.partial(pattern.match, subject))
        else:
            elapsed = _elapsed(functools.partial(pattern.subn, subject[:0], subject))
        assert elapsed < BOUND, (name, text[:20], elapsed)


CONFIG = EmailConfig.model_validate(
    {"imap_host": "x", "smtp_host": "x", "username": "u", "password": "p", "address": "h@x.test"}
)


@pytest.mark.parametrize(
    ("what", "convert", "text"),
    [
        ("attribution", strip_quoted, "hi\n" + _repeat(" <a")),
        ("schrieb", strip_quoted, _repeat(" schrieb", "Am ") + ":x"),
        ("html tags", html_to_text, _repeat("<a ")),
        ("html autolinks", html_to_text, _repeat("<http://")),
        ("html comments", html_to_text, _repeat("<!--")),
        ("html attributes", html_to_text, _repeat("<a b='")),
        ("auth results", authres.parse, "mx; " + _repeat("dkim=pass header.d=a (b) ")),
        ("auth comments", authres.parse, "mx; spf=pass " + _repeat("(")),
        ("auth quotes", authres.parse, 'mx; spf=pass smtp.mailfrom="' + _repeat("\\;")),
        ("markdown links", markdown_to_plain, _repeat("[\\")),
        ("markdown headings", markdown_to_plain, _repeat(" ", "# ")),
        ("chunks", lambda t: split_chunks(t, 4000), _repeat("[a](")),
    ],
)
def test_inbound_conversions_are_linear_on_hostile_input(
    what: str, convert: Callable[[str], object], text: str
) -> None:
    assert _elapsed(lambda: convert(text)) < WHOLE_BOUND, what


@pytest.mark.parametrize(
    ("name", "fragment"),
    [("From", '"'), ("From", "a@"), ("Content-Type", ";"), ("Content-Type", '"'), ("Date", "(")],
)
def test_a_hostile_structured_header_is_refused_not_parsed(name: str, fragment: str) -> None:
    """The standard library's address and parameter parsers are quadratic or worse: a
    20,000-character `From` of quotes took 40 s. Such a header is refused unparsed."""
    data = f"{name}: {fragment * 10_000}\r\nTo: h@x.test\r\n\r\nhi\r\n".encode()

    def read() -> None:
        with pytest.raises(HeaderTooLong):
            to_received(
                data, config=CONFIG, account=AccountId("a"), uidvalidity=1, uid=1, now=utcnow()
            )

    assert _elapsed(read) < BOUND


def test_mail_limits_are_checked_in_linear_time() -> None:
    boundaries = "".join(f'Content-Type: multipart/mixed; boundary="b{i}"\r\n' for i in range(2000))
    data = (boundaries + "\r\n" + "--b1\r\n" * 50_000 + " <a\n" * 50_000).encode()
    assert _elapsed(lambda: over_limits(data, CONFIG)) < BOUND
    assert over_limits(data, CONFIG) == "more than 100 MIME parts"
