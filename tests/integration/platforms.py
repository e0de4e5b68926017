"""Every platform through its fake, seen the way a person talking to Herald sees it: one
harness per platform that starts the fake, writes the platform's config section, sends a
direct message from an allowed person and reads what Herald sent back to that person.

Tests parametrised over `HARNESSES` run the same scenario on every platform:

    @pytest.fixture(params=sorted(HARNESSES))
    async def platform(request): async with HARNESSES[request.param]() as fake: yield fake
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from types import TracebackType
from typing import Any, ClassVar, Self

from gateway.contracts.messages import utcnow
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.discord_server import DEFAULT_TOKEN as DISCORD_TOKEN
from tests.fakes.discord_server import FakeDiscordServer
from tests.fakes.dovecot import USER as MAILBOX
from tests.fakes.dovecot import Dovecot
from tests.fakes.slack_server import DEFAULT_APP_TOKEN, DEFAULT_BOT_TOKEN, FakeSlackServer
from tests.fakes.smtp_server import SmtpServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    WHATSAPP_NUMBER,
    FakeTwilioServer,
)
from tests.fakes.waiting import Waitable
from tests.integration.inproc import Herald

WAIT = 15.0
"""Upper bound of every wait for what Herald sends."""


class PlatformHarness(abc.ABC):
    """One platform's fake between enter and exit, and two people allowed to talk to Herald
    there in direct messages (`people`, as the platform addresses them)."""

    platform: ClassVar[str]
    """The platform's name: its config section under `platforms` and its inbox rows."""
    people: ClassVar[tuple[str, str]]

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        try:
            await self._start(self._stack)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    @abc.abstractmethod
    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        """Start the fake (and whatever it needs), entered into `stack`."""

    @property
    @abc.abstractmethod
    def fake(self) -> Waitable:
        """The server that records what Herald sends (for waiting on its changes)."""

    @abc.abstractmethod
    def section(self, api_port: int) -> dict[str, Any]:
        """The `platforms.<platform>` config section of a daemon serving HTTP on `api_port`,
        allowing `people`."""

    @abc.abstractmethod
    async def send(self, herald: Herald, person: str, text: str) -> None:
        """Deliver a direct message `text` from `person` to the running daemon (the same
        conversation as that person's earlier messages)."""

    @abc.abstractmethod
    def texts_to(self, person: str) -> list[str]:
        """The texts Herald sent to `person` so far, in order."""

    async def wait_texts(self, person: str, count: int, timeout: float = WAIT) -> list[str]:
        """Wait until Herald sent `person` at least `count` texts; return them all
        (TimeoutError after `timeout` seconds)."""
        await self.fake.wait_for(lambda: len(self.texts_to(person)) >= count, timeout)
        return self.texts_to(person)


class TelegramHarness(PlatformHarness):
    """Telegram against the fake Bot API; a person's direct chat id is their user id."""

    platform = "telegram"
    people = ("111111111", "222222222")
    TOKEN = "123456:herald-test-token"

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.tg = await stack.enter_async_context(FakeTelegramServer(self.TOKEN))

    @property
    def fake(self) -> Waitable:
        return self.tg

    def section(self, api_port: int) -> dict[str, Any]:
        return {
            "token": self.TOKEN,
            "base_url": self.tg.base_url,
            "base_file_url": self.tg.base_file_url,
            "allowed_users": list(self.people),
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
        }

    async def send(self, herald: Herald, person: str, text: str) -> None:
        self.tg.inject_message(int(person), text, sender_id=int(person))

    def texts_to(self, person: str) -> list[str]:
        return self.tg.texts_in(int(person))


class SlackHarness(PlatformHarness):
    """Slack (Socket Mode) against the fake Slack; each person has a DM channel."""

    platform = "slack"
    people = ("U0ANN", "U0BOB")
    DMS: ClassVar[dict[str, str]] = {"U0ANN": "D0ANN", "U0BOB": "D0BOB"}

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.slack = await stack.enter_async_context(FakeSlackServer(ack_timeout=1.0))

    @property
    def fake(self) -> Waitable:
        return self.slack

    def section(self, api_port: int) -> dict[str, Any]:
        return {
            "bot_token": DEFAULT_BOT_TOKEN,
            "app_token": DEFAULT_APP_TOKEN,
            "base_url": self.slack.base_url,
            "allowed_users": list(self.people),
            "stream_edits": False,
            "min_send_interval": 0,
            "ping_interval": 2,
        }

    async def send(self, herald: Herald, person: str, text: str) -> None:
        self.slack.inject_message(self.DMS[person], text, user=person)

    def texts_to(self, person: str) -> list[str]:
        return self.slack.texts_in(self.DMS[person])


class DiscordHarness(PlatformHarness):
    """Discord against the fake gateway and REST API; each person has a DM channel."""

    platform = "discord"
    people = ("2000000000000000001", "2000000000000000002")
    DMS: ClassVar[dict[str, str]] = {
        "2000000000000000001": "3000000000000000001",
        "2000000000000000002": "3000000000000000005",
    }

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.discord = await stack.enter_async_context(FakeDiscordServer(heartbeat_interval=0.5))
        for person, name in zip(self.people, ("ann", "bob"), strict=True):
            self.discord.add_user(person, name)
            self.discord.add_channel(self.DMS[person], dm=True)

    @property
    def fake(self) -> Waitable:
        return self.discord

    def section(self, api_port: int) -> dict[str, Any]:
        return {
            "token": DISCORD_TOKEN,
            "api_base": self.discord.api_base,
            "allowed_users": list(self.people),
            "stream_edits": False,
            "min_send_interval": 0,
            "activity_check_interval": 1.0,
        }

    async def send(self, herald: Herald, person: str, text: str) -> None:
        self.discord.inject_message(self.DMS[person], text, author=person)

    def texts_to(self, person: str) -> list[str]:
        return self.discord.texts_in(self.DMS[person])


class EmailHarness(PlatformHarness):
    """Email through a real Dovecot (IMAP) and a real SMTP server (aiosmtpd); a person's
    messages after the first reply to it, so they stay one conversation (one session)."""

    platform = "email"
    people = ("ann@example.com", "bob@example.org")

    def __init__(self) -> None:
        super().__init__()
        self._threads: dict[str, str] = {}
        """The Message-ID of each person's first mail."""

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.dovecot = await stack.enter_async_context(Dovecot())
        self.smtp = await stack.enter_async_context(SmtpServer())

    @property
    def fake(self) -> Waitable:
        return self.smtp

    def section(self, api_port: int) -> dict[str, Any]:
        return self.dovecot.section(
            allowed_senders=list(self.people), idle_renew=30, timeout=5, **self.smtp.section()
        )

    async def send(self, herald: Herald, person: str, text: str) -> None:
        message = EmailMessage()
        message["From"] = person
        message["To"] = f"Herald <{MAILBOX}>"
        message["Date"] = format_datetime(utcnow())
        message["Message-ID"] = make_msgid(domain="example.com")
        root = self._threads.get(person)
        if root is None:
            message["Subject"] = "Question"
            self._threads[person] = str(message["Message-ID"])
        else:
            message["Subject"] = "Re: Question"
            message["In-Reply-To"] = root
            message["References"] = root
        message.set_content(text)
        await self.dovecot.append(message.as_bytes())

    def texts_to(self, person: str) -> list[str]:
        return [r.text for r in self.smtp.received if r.rcpt_tos == (person,)]


class TwilioHarness(PlatformHarness):
    """SMS through the fake Twilio: inbound messages are signed webhooks to Herald, replies
    go through the REST API."""

    platform = "twilio"
    people = ("+15551234567", "+15557654321")
    webhook = "sms"

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.twilio = await stack.enter_async_context(FakeTwilioServer())

    @property
    def fake(self) -> Waitable:
        return self.twilio

    def section(self, api_port: int) -> dict[str, Any]:
        return {
            "account": "main",
            "account_sid": DEFAULT_ACCOUNT_SID,
            "auth_token": DEFAULT_AUTH_TOKEN,
            "from_number": HERALD_NUMBER,
            "whatsapp_from": WHATSAPP_NUMBER,
            "public_url": f"http://127.0.0.1:{api_port}",
            "base_url": self.twilio.base_url,
            "allowed_numbers": [p.removeprefix("whatsapp:") for p in self.people],
            "min_send_interval": 0,
        }

    async def send(self, herald: Herald, person: str, text: str) -> None:
        url = f"{herald.url}/webhooks/twilio/{self.webhook}"
        answer = await self.twilio.post_inbound(url, person, text)
        if answer.status_code != 200:
            raise AssertionError(f"the Twilio webhook answered {answer.status_code}: {answer.text}")

    def texts_to(self, person: str) -> list[str]:
        return self.twilio.bodies(person)


class WhatsAppHarness(TwilioHarness):
    """WhatsApp through the fake Twilio (the same adapter, its WhatsApp webhook)."""

    people = ("whatsapp:+15551234567", "whatsapp:+15557654321")
    webhook = "whatsapp"


class LoopbackHarness(PlatformHarness):
    """The test-only loopback platform against the fake long-polling chat server; a person's
    direct chat id is their user id."""

    platform = "test"
    people = ("u-ann", "u-bob")
    TOKEN = "4242:loopback-secret"

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.chat = await stack.enter_async_context(FakeChatServer(self.TOKEN))

    @property
    def fake(self) -> Waitable:
        return self.chat

    def section(self, api_port: int) -> dict[str, Any]:
        return {
            "url": self.chat.base_url,
            "token": self.TOKEN,
            "allowed_users": list(self.people),
            "stream_edits": False,
            "poll_timeout": 1,
        }

    async def send(self, herald: Herald, person: str, text: str) -> None:
        self.chat.inject(person, text, sender_id=person)

    def texts_to(self, person: str) -> list[str]:
        return self.chat.texts_in(person)


HARNESSES: dict[str, Callable[[], PlatformHarness]] = {
    "telegram": TelegramHarness,
    "slack": SlackHarness,
    "discord": DiscordHarness,
    "email": EmailHarness,
    "sms": TwilioHarness,
    "whatsapp": WhatsAppHarness,
    "loopback": LoopbackHarness,
}
"""Every platform's harness by test id."""


@contextlib.asynccontextmanager
async def started(name: str) -> AsyncIterator[PlatformHarness]:
    """The harness `name` of `HARNESSES`, its fake started."""
    async with HARNESSES[name]() as harness:
        yield harness
