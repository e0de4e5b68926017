"""`Authentication-Results` (RFC 8601): which results count, and parsing them.

Which headers count. The receiving server adds its results at the top of the header block,
above every trace header it adds (RFC 8601 section 7.1: "this header field SHOULD be inserted
above any other trace header fields such MTAs might prepend"), so everything above the
topmost `Received` header was written by the operator's own servers and everything below it
may have been written by the sender. Only headers that are both above that `Received` (or
above the `received_above_results + 1`-th one, when the operator's delivery agent adds its
own `Received` on top) and carry the configured authserv-id count; the rest are ignored,
whatever they claim. A mail that never went through SMTP has no `Received` at all: its
headers all count (only someone with access to the mailbox can put such a mail there).

Parsing follows the grammar of RFC 8601 section 2.2 with RFC 5322's quoted strings and
(nested) comments, in one linear pass; a header that does not parse counts as no result.
The `authres` package on PyPI was considered and not used: unmaintained since 2019, untyped,
and its parser copies the rest of the header at every token (quadratic on a long header).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

_SPACE = " \t\r\n"
_STOP = _SPACE + '();="\\'


@dataclass(frozen=True, slots=True)
class AuthResult:
    """One `method=result` of a header, with its properties (`("header.d", "example.com")`).

    A property's value is its domain: the part after the last `@` outside quotes.
    """

    method: str
    result: str
    properties: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class AuthResults:
    """One parsed `Authentication-Results` header."""

    authserv_id: str
    results: tuple[AuthResult, ...]


class _Token(NamedTuple):
    kind: str
    """`atom`, `string` (a quoted string, unquoted), or the separator itself (`;`, `=`)."""
    text: str
    spaced: bool
    """Whitespace or a comment stood before it."""


def _comment_end(value: str, start: int) -> int:
    """The index after the comment opening at `start`; -1 when it never closes."""
    depth, i, n = 0, start, len(value)
    while i < n:
        ch = value[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _string_end(value: str, start: int) -> tuple[int, str]:
    """(index after, content) of the quoted string opening at `start`; (-1, '') if unclosed."""
    chars: list[str] = []
    i, n = start + 1, len(value)
    while i < n:
        ch = value[i]
        if ch == '"':
            return i + 1, "".join(chars)
        if ch == "\\" and i + 1 < n:
            i += 1
            ch = value[i]
        chars.append(ch)
        i += 1
    return -1, ""


def _tokens(value: str) -> list[_Token] | None:
    """The tokens of a header value, comments dropped; None when it is malformed."""
    out: list[_Token] = []
    i, n, spaced = 0, len(value), False
    while i < n:
        ch = value[i]
        if ch in _SPACE:
            spaced, i = True, i + 1
        elif ch == "(":
            i = _comment_end(value, i)
            if i < 0:
                return None
            spaced = True
        elif ch == '"':
            i, text = _string_end(value, i)
            if i < 0:
                return None
            out.append(_Token("string", text, spaced))
            spaced = False
        elif ch in ";=":
            out.append(_Token(ch, ch, spaced))
            spaced, i = False, i + 1
        elif ch in ")\\":
            return None
        else:
            start = i
            while i < n and value[i] not in _STOP:
                i += 1
            out.append(_Token("atom", value[start:i], spaced))
            spaced = False
    return out


def _domain(parts: list[_Token]) -> str:
    """The domain of a property value: what follows the last `@` outside quotes."""
    last = parts[-1]
    if len(parts) > 1 and (last.kind != "atom" or "@" not in last.text):
        return ""
    return last.text.rpartition("@")[2].strip().rstrip(".").lower()


class _Reader:
    """Walks the tokens of one header by the grammar; `None` from a step means malformed."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self, offset: int = 0) -> _Token | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def take(self, *kinds: str) -> _Token | None:
        token = self.peek()
        if token is None or token.kind not in kinds:
            return None
        self.pos += 1
        return token

    def value(self) -> list[_Token] | None:
        """A property value: one token, and the ones glued to it (`"a b"@example.com`)."""
        first = self.take("atom", "string")
        if first is None:
            return None
        parts = [first]
        while (nxt := self.peek()) is not None and nxt.kind in ("atom", "string"):
            if nxt.spaced:
                break
            parts.append(nxt)
            self.pos += 1
        return parts

    def result(self) -> AuthResult | None:
        """`method = result [reason = value] *(ptype.property = value)` after a `;`."""
        method, equals, result = self.take("atom"), self.take("="), self.take("atom")
        if method is None or equals is None or result is None:
            return None
        properties: list[tuple[str, str]] = []
        while (name := self.peek()) is not None and name.kind == "atom":
            equals = self.peek(1)
            if equals is None or equals.kind != "=":
                return None
            self.pos += 2
            parts = self.value()
            if parts is None:
                return None
            key = name.text.lower()
            if key != "reason":
                if "." not in key:
                    return None
                properties.append((key, _domain(parts)))
        method_name = method.text.partition("/")[0].lower()
        return AuthResult(method_name, result.text.lower(), tuple(properties))


def parse(value: str) -> AuthResults | None:
    """The authserv-id and results of one header value; None when it is malformed."""
    tokens = _tokens(value)
    if not tokens:
        return None
    reader = _Reader(tokens)
    authserv = reader.take("atom", "string")
    if authserv is None:
        return None
    version = reader.peek()
    if version is not None and version.kind == "atom" and version.text.isdigit():
        reader.pos += 1
    results: list[AuthResult] = []
    while reader.peek() is not None:
        if reader.take(";") is None:
            return None
        nxt = reader.peek()
        if nxt is not None and nxt.text.lower() == "none" and reader.peek(1) is None:
            if results:
                return None
            break
        one = reader.result()
        if one is None:
            return None
        results.append(one)
    return AuthResults(authserv.text.lower(), tuple(results))


def trusted(
    headers: Iterable[tuple[str, str]], authserv_id: str, received_above: int = 0
) -> list[AuthResults]:
    """The results of the receiving server among `headers` (raw, in order, top first).

    Only headers above the `received_above + 1`-th `Received` header, and only those whose
    authserv-id is `authserv_id`, count (see the module's docstring).
    """
    out: list[AuthResults] = []
    received = 0
    for name, value in headers:
        lowered = name.strip().lower()
        if lowered == "received":
            received += 1
            if received > received_above:
                break
        elif lowered == "authentication-results":
            parsed = parse(value.replace("\r", "").replace("\n", ""))
            if parsed is not None and parsed.authserv_id == authserv_id.lower():
                out.append(parsed)
    return out


_PROVES = {"dkim": ("header.d", "header.i"), "spf": ("smtp.mailfrom",)}
"""Which property of a passing method names the domain it authenticated."""


def passes_for(results: Iterable[AuthResults], domain: str) -> bool:
    """Whether a `dkim=pass` (header.d / header.i) or `spf=pass` (smtp.mailfrom) in
    `results` is for `domain` or a subdomain of it."""
    domain = domain.lower()
    for header in results:
        for result in header.results:
            if result.result != "pass" or result.method not in _PROVES:
                continue
            for key, value in result.properties:
                if key in _PROVES[result.method] and (
                    value == domain or value.endswith("." + domain)
                ):
                    return True
    return False
