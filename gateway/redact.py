"""Keeping secrets out of logs and error messages.

`Redactor` replaces every secret of the loaded configuration (tokens, passwords, keys: every
`SecretStr`, and the database password) and anything shaped like a credential in a URL
(`bot<id>:<token>`, `user:password@`) with `***`. `install` puts it on the root logger's
handlers, so every record, its arguments and its traceback are redacted whatever the level,
and turns the SDK loggers that log request URLs down to WARNING.
"""

from __future__ import annotations

import logging
import re
import string
import traceback
import urllib.parse
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretStr
from sqlalchemy.engine import make_url

from gateway import platforms

if TYPE_CHECKING:
    from gateway.config import HeraldConfig

logger = logging.getLogger(__name__)

MASK = "***"
MIN_SECRET_LENGTH = 4
"""Shorter values are not searched for: they would blank out ordinary words."""
MIN_READ_LENGTH = 8
"""In what people read (replies, previews, streamed answers) shorter secrets stay: there a
short word-like secret would blank out the word everywhere."""

URL_LOGGERS = (
    "httpx",
    "httpx2",
    "httpcore",
    "hpack",
    "openai",
    "aiohttp.access",
    "aiohttp.client",
    "urllib3",
    *(name for spec in platforms.SPECS for name in spec.url_loggers),
)
"""SDK loggers that log request URLs or headers below WARNING (some platforms' URLs carry
the token; each platform's spec names its own)."""

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Each platform's credential shapes (its spec's `secret_patterns`).
    *((pattern, r"\1" + MASK) for spec in platforms.SPECS for pattern in spec.secret_patterns),
    # user:password@host in any URL.
    (re.compile(r"(\b[a-z][\w+.-]*://[^\s:/@]+:)[^\s@/]+@"), r"\1" + MASK + "@"),
    (re.compile(r"(\bBearer\s+)[^\s'\",]+"), r"\1" + MASK),
    # Credentials in a query string.
    (
        re.compile(
            r"([?&](?:api[-_]?key|key|token|access_token|password|secret)=)[^&#\s'\"]+", re.I
        ),
        r"\1" + MASK,
    ),
)


SECRET_NAME = re.compile(r"key|token|secret|password|passwd|auth|credential", re.I)
"""A free-form option (`memory.options`) whose name matches holds a secret (when it is 8
characters or longer: `auth: none` is a setting, not a secret)."""


def secrets_of(config: BaseModel, database_url: str | None = None) -> list[str]:
    """Every secret value in `config` (each `SecretStr`, nested models included; in free-form
    mappings such as `memory.options`, every string under a secret-like name), and the
    password of `database_url`."""
    found = [s.get_secret_value() for s in _walk(config)]
    if database_url:
        try:
            password = make_url(database_url).password
        except Exception:  # an unparsable URL has no password to hide
            password = None
        if password:
            found.append(str(password))
    return found


def _walk(value: Any) -> Iterator[SecretStr]:
    if isinstance(value, SecretStr):
        yield value
    elif isinstance(value, str):
        return
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _walk(getattr(value, name))
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, dict):
        for name, item in value.items():
            if isinstance(item, str) and len(item) >= 8 and SECRET_NAME.search(str(name)):
                yield SecretStr(item)
            else:
                yield from _walk(item)


def _escapable(secret: str) -> str:
    """A pattern matching `secret` also as Markdown writes it with its punctuation escaped
    (`abc\\_def`): an answer is redacted before the platform's renderer takes the escapes out."""
    return "".join(
        rf"\\?{re.escape(c)}" if c in string.punctuation else re.escape(c) for c in secret
    )


class Redactor:
    """Replaces the given secrets, and credential-shaped parts of URLs, with `***`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        variants: set[str] = set()
        for secret in secrets:
            for form in (secret, secret.strip()):
                variants.add(form)
                variants.add(urllib.parse.quote(form, safe=""))
                variants.add(urllib.parse.quote_plus(form))
                # `<id>:<secret>` tokens (bot tokens): the part after the colon alone.
                tail = form.rpartition(":")[2]
                if tail != form and len(tail) >= 12:  # a token, not a word
                    variants.add(tail)
                # `Bearer <token>`, `Basic <credentials>` (header values): the token alone.
                word = form.rpartition(" ")[2]
                if word != form and len(word) >= 8:
                    variants.add(word)
        ordered = sorted((v for v in variants if len(v) >= MIN_SECRET_LENGTH), key=len)
        self._secrets = tuple(reversed(ordered))  # longest first: no partial leftovers
        self._pattern = (
            re.compile("|".join(map(_escapable, self._secrets))) if self._secrets else None
        )
        # What people read: only secrets long enough not to be words (`api.key: herald`
        # must not blank out every "herald" in the replies; the log still hides it).
        self._read_secrets = tuple(s for s in self._secrets if len(s) >= MIN_READ_LENGTH)
        self._read_pattern = (
            re.compile("|".join(map(_escapable, self._read_secrets)))
            if self._read_secrets
            else None
        )

    @classmethod
    def of(cls, config: HeraldConfig) -> Redactor:
        """The redactor of every secret in `config` (the database password included)."""
        return cls(secrets_of(config, config.effective_database_url))

    def __call__(self, text: str) -> str:
        """`text` with every secret and credential in it replaced by `***`."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def secrets(self, text: str) -> str:
        """`text` with the configured secrets of `MIN_READ_LENGTH` characters or more replaced
        by `***`, and nothing else (for what a person reads: a reply may quote `Bearer` or a
        URL with `?key=` on purpose)."""
        return text if self._read_pattern is None else self._read_pattern.sub(MASK, text)

    def partial_tail(self, text: str) -> int:
        """How many characters at the end of `text` could begin a configured secret (0:
        none): what a stream must hold back until the next piece shows whether it is one."""
        if not self._read_secrets:
            return 0
        longest = len(self._read_secrets[0])
        for k in range(min(len(text), longest - 1), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._read_secrets):
                return k
        return 0

    def data(self, value: Any) -> Any:
        """A copy of JSON-like `value` (dicts, lists, strings) with every string redacted."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value


class SecretStream:
    """Takes the configured secrets out of text that arrives in pieces (streamed tokens): a
    piece that may begin a secret is held until the next one shows whether it does."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._held = ""

    def feed(self, piece: str) -> str:
        """What of the text so far may be shown now, redacted ("" while all is held)."""
        text = self.redactor.secrets(self._held + piece)
        keep = self.redactor.partial_tail(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held rest, at the end of the stream."""
        rest, self._held = self.redactor.secrets(self._held), ""
        return rest


class RedactingFilter(logging.Filter):
    """A handler filter: redacts each record's message, arguments, traceback and stack."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drops one."""
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: show it
            message = f"{record.msg!r} % {record.args!r}"
        record.msg, record.args = self.redactor(message), None
        if record.exc_info and record.exc_info[1] is not None:
            if not record.exc_text:
                record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            record.exc_text = self.redactor(record.exc_text)
        elif record.exc_text:
            record.exc_text = self.redactor(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redactor(record.stack_info)
        return True


def install(redactor: Redactor, *, root: logging.Logger | None = None) -> None:
    """Redact every record the root logger's handlers emit (replacing an earlier redactor),
    and turn the SDK loggers that log URLs down to WARNING."""
    root = root or logging.getLogger()
    for handler in root.handlers:
        for old in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(old)
        handler.addFilter(RedactingFilter(redactor))
    for name in URL_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
