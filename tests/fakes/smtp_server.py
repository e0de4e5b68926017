"""A real SMTP server (aiosmtpd) on 127.0.0.1 that records every mail it accepts.

It runs in the test's own event loop, requires AUTH (plain, no TLS) with the mailbox's
credentials, and can refuse the next mails with a chosen reply (`451 …` transient, `550 …`
permanent).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from email.message import EmailMessage
from types import TracebackType
from typing import Any, Self

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from adapters.email.convert import parse
from tests.fakes.dovecot import PASSWORD, USER
from tests.fakes.waiting import Changes, Waitable

WAIT = 15.0


class _QuietDeprecation(logging.Filter):
    """Drops aiosmtpd's log line about its own deprecated `login_data` (set on every AUTH)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "login_data is deprecated" not in record.getMessage()


_QUIET = _QuietDeprecation()


@dataclass(frozen=True, slots=True)
class Received:
    """One mail the server accepted."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes
    login: str

    @property
    def message(self) -> EmailMessage:
        """The mail, parsed."""
        return parse(self.data)

    @property
    def text(self) -> str:
        """The text/plain body, without the trailing newline."""
        part = self.message.get_body(preferencelist=("plain",))
        assert part is not None
        content = part.get_content()
        assert isinstance(content, str)
        return content.replace("\r\n", "\n").rstrip("\n")

    @property
    def html(self) -> str | None:
        """The text/html body, if any."""
        part = self.message.get_body(preferencelist=("html",))
        if part is None:
            return None
        content = part.get_content()
        assert isinstance(content, str)
        return content

    def header(self, name: str) -> str:
        """One header's value ('' when absent)."""
        return str(self.message.get(name, ""))


class _Handler:
    def __init__(self, server: SmtpServer) -> None:
        self.server = server

    async def handle_DATA(self, smtp: SMTP, session: Session, envelope: Envelope) -> str:
        server = self.server
        server.attempts += 1
        if not session.authenticated:
            return "530 5.7.0 Authentication required"
        if server.refusals:
            reply = server.refusals.pop(0)
            server._changes.notify()
            return reply
        content = envelope.original_content or b""
        auth = session.auth_data
        login = auth.login.decode() if isinstance(auth, LoginPassword) else ""
        server.received.append(
            Received(str(envelope.mail_from), tuple(envelope.rcpt_tos), bytes(content), login)
        )
        server._changes.notify()
        return "250 OK queued"


class SmtpServer(Waitable):
    """aiosmtpd on 127.0.0.1:`port` (a free one) between enter and exit."""

    def __init__(
        self,
        *,
        username: str = USER,
        password: str = PASSWORD,
        tls: ssl.SSLContext | None = None,
        implicit_tls: bool = False,
    ) -> None:
        self.tls = tls
        """Offer STARTTLS with this context, or speak TLS from the start (`implicit_tls`)."""
        self.implicit_tls = implicit_tls
        self.username = username
        self.password = password
        self.received: list[Received] = []
        self.refusals: list[str] = []
        """Replies given to the next DATA commands instead of accepting (`"451 try later"`)."""
        self.attempts = 0
        self.port = 0
        self._changes = Changes()
        self._server: asyncio.Server | None = None

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = (
            isinstance(data, LoginPassword)
            and data.login.decode() == self.username
            and data.password.decode() == self.password
        )
        return AuthResult(success=ok, handled=False, auth_data=data)

    def section(self) -> dict[str, Any]:
        """The SMTP keys of a `platforms.email` section sending through this server."""
        security = "none" if self.tls is None else "tls" if self.implicit_tls else "starttls"
        return {"smtp_host": "127.0.0.1", "smtp_port": self.port, "smtp_security": security}

    async def __aenter__(self) -> Self:
        logging.getLogger("mail.log").addFilter(_QUIET)
        loop = asyncio.get_running_loop()
        handler = _Handler(self)
        self._server = await loop.create_server(
            lambda: SMTP(
                handler,
                hostname="smtp.example.test",
                # Required by `handle_DATA` (aiosmtpd warns about AUTH required without TLS).
                auth_require_tls=False,
                tls_context=None if self.implicit_tls else self.tls,
                authenticator=self._authenticate,
                loop=loop,
            ),
            "127.0.0.1",
            0,
            ssl=self.tls if self.implicit_tls else None,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        server, self._server = self._server, None
        self._changes.stop()
        if server is not None:
            server.close()
            await server.wait_closed()

    async def wait_for_mail(
        self, expected: int | Callable[[Received], bool] = 1, timeout: float = WAIT
    ) -> list[Received]:
        """Wait for `expected` mails in all (return them all) or for mail matching it."""
        return await self._changes.wait_for_items(self.received, expected, timeout)
