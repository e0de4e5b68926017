"""Every platform through its fake, seen the way a person talking to Herald sees it: one
harness per platform that starts the fake, writes the platform's config section (and builds
its adapter from it), sends a direct message from an allowed person (to the daemon, or to the
adapter alone), tells whether the platform saw that message acknowledged, delivers it again,
switches a fault on, and reads what Herald sent back to that person.

Tests parametrised over `HARNESSES` run the same scenario on every platform (the adapter
contract suite, tests/contract/test_adapters.py, and tests/integration/
test_model_failures_platforms.py):

    @pytest.fixture(params=sorted(HARNESSES))
    async def platform(request): async with HARNESSES[request.param]() as fake: yield fake

A case a platform cannot express is named in its harness's `cannot` with the reason; the
contract tests skip it there.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

from nio import AsyncClient

from adapters.discord.adapter import DiscordAdapter
from adapters.discord.config import DiscordConfig
from adapters.email.adapter import EmailAdapter
from adapters.email.config import EmailConfig
from adapters.loopback.adapter import LoopbackAdapter
from adapters.loopback.config import LoopbackConfig
from adapters.matrix.adapter import MatrixAdapter
from adapters.matrix.config import MatrixConfig
from adapters.mattermost.adapter import MattermostAdapter
from adapters.mattermost.config import MattermostConfig
from adapters.signal.adapter import SignalAdapter
from adapters.signal.config import SignalConfig
from adapters.slack.adapter import SlackAdapter
from adapters.slack.config import SlackConfig
from adapters.telegram.adapter import TelegramAdapter
from adapters.telegram.config import TelegramConfig
from adapters.twilio.adapter import TwilioAdapter
from adapters.twilio.config import TwilioConfig
from gateway.checkpoints import MemoryCheckpoints
from gateway.contracts.adapter import Adapter, AdapterContext, InboundSink
from gateway.contracts.ids import ChatId
from gateway.contracts.messages import OutboundMessage, utcnow
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.discord_server import DEFAULT_TOKEN as DISCORD_TOKEN
from tests.fakes.discord_server import QUIET_HEARTBEAT, FakeDiscordServer
from tests.fakes.dovecot import USER as MAILBOX
from tests.fakes.dovecot import Dovecot
from tests.fakes.matrix_people import open_direct_chat, person_client, say, say_file
from tests.fakes.matrix_proxy import MatrixProxy
from tests.fakes.mattermost_server import TOKEN as MATTERMOST_TOKEN
from tests.fakes.mattermost_server import FakeMattermostServer
from tests.fakes.signal_cli import FakeSignalCli
from tests.fakes.slack import DEFAULT_APP_TOKEN, DEFAULT_BOT_TOKEN, FakeSlackServer
from tests.fakes.slack import Injected as SlackInjected
from tests.fakes.smtp_server import SmtpServer
from tests.fakes.synapse import shared_synapse
from tests.fakes.telegram import FakeTelegramServer, Injected
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    WHATSAPP_NUMBER,
    FakeTwilioServer,
)
from tests.fakes.waiting import Waitable
from tests.integration.inproc import Herald

WAIT = 30.0
"""Upper bound of every wait for what Herald sends."""
ADAPTER_PORT = 8080
"""The HTTP port written into a section for an adapter tested alone (nothing listens)."""

Ref = Any
"""What `inject` returns for `acknowledged`: the platform's own handle of one delivery."""


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

    # -- the adapter alone (the adapter contract) ---------------------------------------------

    cannot: ClassVar[dict[str, str]] = {}
    """Contract cases (`rate_limit`, …) this platform cannot express, with the reason."""

    @abc.abstractmethod
    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        """The platform's adapter (not entered) configured by `section`, keeping files under
        `files`; with credentials the fake refuses when `bad_token`."""

    @abc.abstractmethod
    def chat_of(self, person: str) -> str:
        """The chat id Herald answers `person` in (a direct chat)."""

    @abc.abstractmethod
    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        """Deliver a direct message `text` from `person` to `adapter`, which receives into
        `sink`; the handle `acknowledged` takes."""

    @abc.abstractmethod
    async def acknowledged(self, ref: Ref) -> bool:
        """Whether the platform saw the delivery `ref` acknowledged (it will not come again)."""

    async def wait_acknowledged(self, ref: Ref, timeout: float = WAIT) -> None:
        """Wait until `acknowledged(ref)` (polled: some acknowledgements, like an IMAP flag,
        have no event to wait on); TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not await self.acknowledged(ref):
                await asyncio.sleep(0.05)

    @abc.abstractmethod
    async def duplicate(self, herald: Herald, person: str) -> None:
        """Deliver `person`'s last message to the running daemon again, as the platform does
        when it repeats a delivery (same platform message)."""

    @abc.abstractmethod
    def rate_limit(self, person: str, retry_after: int) -> None:
        """The next send to `person` is refused with the platform's 429 and `retry_after`."""

    @abc.abstractmethod
    def server_error(self, count: int) -> None:
        """The next `count` sends are refused by a platform server that is failing (a 503,
        or the mail server's transient 451)."""

    @abc.abstractmethod
    def block(self, person: str) -> None:
        """The platform refuses sends to `person`'s chat for good: the person blocked the bot,
        the chat is gone, the number opted out (the mail server: the next send, 550)."""

    streaming: ClassVar[dict[str, Any]] = {"stream_edits": True, "min_edit_interval": 0.2}
    """What `section` needs changed for answers to stream by edits."""

    def edits(self) -> int:
        """How many edits of its own messages Herald made so far."""
        raise NotImplementedError(self.cannot["stream_edits"])

    def shown_to(self, person: str) -> list[str]:
        """The texts of Herald's messages in `person`'s chat as they read now (after edits)."""
        return self.texts_to(person)

    stranger: ClassVar[str] = ""
    """Someone not allowed to talk to Herald, as the platform addresses them (a direct chat)."""

    async def send_file(self, herald: Herald, person: str, content: bytes) -> None:
        """Deliver a direct message from `person` carrying one PDF file of `content`."""
        raise NotImplementedError(self.cannot["stranger_files"])

    def downloads(self) -> int:
        """How many files the platform served to Herald so far."""
        raise NotImplementedError(self.cannot["stranger_files"])

    def outbound(self, adapter: Adapter, person: str, text: str) -> OutboundMessage:
        """One chunk of `text` to `person`'s chat."""
        return OutboundMessage(
            platform=adapter.platform,
            account=adapter.account,
            chat_id=ChatId(self.chat_of(person)),
            text=text,
            idempotency_key=f"contract:{person}",
        )


class TelegramHarness(PlatformHarness):
    """Telegram against the fake Bot API; a person's direct chat id is their user id."""

    platform = "telegram"
    people = ("111111111", "222222222")
    TOKEN = "123456:herald-test-token"

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, Injected] = {}

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
        self._last[person] = self.tg.inject_message(int(person), text, sender_id=int(person))

    def texts_to(self, person: str) -> list[str]:
        return self.tg.texts_in(int(person))

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["token"] = "123456:refused-token"
        return TelegramAdapter(TelegramConfig.model_validate(section), files)

    def chat_of(self, person: str) -> str:
        return person

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        return self.tg.inject_message(int(person), text, sender_id=int(person)).update_id

    async def acknowledged(self, ref: Ref) -> bool:
        """Telegram: a later `getUpdates` passed the update with its `offset`."""
        return ref in self.tg.confirmed

    async def duplicate(self, herald: Herald, person: str) -> None:
        self.tg.duplicate(self._last[person].update_id)

    def rate_limit(self, person: str, retry_after: int) -> None:
        self.tg.rate_limit(int(person), count=1, retry_after=retry_after)

    def server_error(self, count: int) -> None:
        self.tg.fail("sendMessage", count, status=503)

    def block(self, person: str) -> None:
        self.tg.block_chat(int(person))

    stranger = "333333333"

    async def send_file(self, herald: Herald, person: str, content: bytes) -> None:
        doc = self.tg.add_file(content, file_name="d.pdf", mime_type="application/pdf")
        self.tg.inject_message(int(person), "", sender_id=int(person), document=doc)

    def downloads(self) -> int:
        return len(self.tg.downloads)

    def edits(self) -> int:
        return len(self.tg.edits)


class SlackHarness(PlatformHarness):
    """Slack (Socket Mode) against the fake Slack; each person has a DM channel."""

    platform = "slack"
    people = ("U0ANN", "U0BOB")
    DMS: ClassVar[dict[str, str]] = {"U0ANN": "D0ANN", "U0BOB": "D0BOB", "U0EVE": "D0EVE"}

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, SlackInjected] = {}

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
        self._last[person] = self.slack.inject_message(self.DMS[person], text, user=person)

    def texts_to(self, person: str) -> list[str]:
        return self.slack.texts_in(self.DMS[person])

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["bot_token"] = "xoxb-1-refused-token"
        return SlackAdapter(SlackConfig.model_validate(section), files)

    def chat_of(self, person: str) -> str:
        return self.DMS[person]

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        return self.slack.inject_message(self.DMS[person], text, user=person).event_id

    async def acknowledged(self, ref: Ref) -> bool:
        """Slack: the envelope carrying the event was acknowledged on the socket."""
        return ref in self.slack.acked

    async def duplicate(self, herald: Herald, person: str) -> None:
        """The same message event again, in an envelope of its own."""
        self.slack.inject_event(self.slack.event(self._last[person].event_id)["event"])

    def rate_limit(self, person: str, retry_after: int) -> None:
        self.slack.rate_limit(self.DMS[person], count=1, retry_after=retry_after)

    def server_error(self, count: int) -> None:
        self.slack.fail("chat.postMessage", count, status=503)

    def block(self, person: str) -> None:
        self.slack.remove_channel(self.DMS[person])

    stranger = "U0EVE"

    async def send_file(self, herald: Herald, person: str, content: bytes) -> None:
        file = self.slack.add_file(content, name="d.pdf", mimetype="application/pdf")
        self.slack.inject_message(self.DMS[person], "look", user=person, files=[file])

    def downloads(self) -> int:
        return len(self.slack.downloads)

    def edits(self) -> int:
        return len(self.slack.updates)


class DiscordHarness(PlatformHarness):
    """Discord against the fake gateway and REST API; each person has a DM channel."""

    platform = "discord"
    people = ("2000000000000000001", "2000000000000000002")
    DMS: ClassVar[dict[str, str]] = {
        "2000000000000000001": "3000000000000000001",
        "2000000000000000002": "3000000000000000005",
        "2000000000000000009": "3000000000000000009",
    }

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, dict[str, Any]] = {}
        self.checkpoints = MemoryCheckpoints()
        """The adapter's checkpoints: its last seen message id per channel."""

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.discord = await stack.enter_async_context(
            FakeDiscordServer(heartbeat_interval=QUIET_HEARTBEAT)
        )
        for person, name in zip((*self.people, self.stranger), ("ann", "bob", "eve"), strict=True):
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
        self._last[person] = self.discord.inject_message(self.DMS[person], text, author=person)

    def texts_to(self, person: str) -> list[str]:
        return self.discord.texts_in(self.DMS[person])

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["token"] = "MTAwMA.fake.refused-token"
        return DiscordAdapter(DiscordConfig.model_validate(section), files, self.checkpoints)

    def chat_of(self, person: str) -> str:
        return self.DMS[person]

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        message = self.discord.inject_message(self.DMS[person], text, author=person)
        return self.DMS[person], str(message["id"])

    async def acknowledged(self, ref: Ref) -> bool:
        """Discord has no acknowledgement: what stands for one is the channel's last seen id
        (where reading the history starts after a reconnect) reaching the message."""
        channel, message_id = ref
        seen = await self.checkpoints.get(f"last:{channel}")
        return seen is not None and int(seen) >= int(message_id)

    async def duplicate(self, herald: Herald, person: str) -> None:
        self.discord.dispatch_again(self._last[person])

    def rate_limit(self, person: str, retry_after: int) -> None:
        self.discord.rate_limit(self.DMS[person], float(retry_after))

    def server_error(self, count: int) -> None:
        self.discord.fail_rest(503, times=count, kind="post")

    def block(self, person: str) -> None:
        del self.discord.channels[self.DMS[person]]  # a DM that is gone: 404 Unknown Channel

    stranger = "2000000000000000009"

    async def send_file(self, herald: Herald, person: str, content: bytes) -> None:
        url = self.discord.add_file(content)
        attachment = {
            "id": str(len(self.discord.downloads) + 100),
            "filename": "d.pdf",
            "size": len(content),
            "url": url,
            "content_type": "application/pdf",
        }
        self.discord.inject_message(
            self.DMS[person], "look", author=person, attachments=[attachment]
        )

    def downloads(self) -> int:
        return len(self.discord.downloads)

    def edits(self) -> int:
        return len(self.discord.edits)

    def shown_to(self, person: str) -> list[str]:
        ours = {p.id for p in self.discord.posted}
        messages = self.discord.channels[self.DMS[person]].messages
        return [str(m["content"]) for m in messages if m["id"] in ours]


class EmailHarness(PlatformHarness):
    """Email through a real Dovecot (IMAP) and a real SMTP server (aiosmtpd); a person's
    messages after the first reply to it, so they stay one conversation (one session)."""

    platform = "email"
    people = ("ann@example.com", "bob@example.org")

    def __init__(self) -> None:
        super().__init__()
        self._threads: dict[str, str] = {}
        """The Message-ID of each person's first mail."""
        self._last: dict[str, bytes] = {}

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
        self._last[person] = self._mail(person, text)
        await self.dovecot.append(self._last[person])

    def _mail(self, person: str, text: str) -> bytes:
        """A mail from `person` to Herald saying `text`, in `person`'s conversation."""
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
        return message.as_bytes()

    def texts_to(self, person: str) -> list[str]:
        return [r.text for r in self.smtp.received if r.rcpt_tos == (person,)]

    cannot: ClassVar[dict[str, str]] = {
        "rate_limit": "SMTP has no 429: a server that wants less answers 4xx without a time "
        "to wait, which is NotReady (retried with backoff), never RateLimited",
        "stream_edits": "a sent mail cannot be edited: the answer goes once, whole",
        "stranger_files": "IMAP has no download to count apart from the message: a stranger's "
        "body is never fetched (tests/integration/test_email.py::"
        "test_a_strangers_body_is_never_fetched and test_a_strangers_attachments_are_not_"
        "written_to_disk)",
    }

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["password"] = "refused-password"
        return EmailAdapter(EmailConfig.model_validate(section), files, MemoryCheckpoints())

    def chat_of(self, person: str) -> str:
        return person

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        return await self.dovecot.append(self._mail(person, text))

    async def acknowledged(self, ref: Ref) -> bool:
        """IMAP: the mail (by UID) is flagged \\Seen."""
        return "\\Seen" in (await self.dovecot.flags()).get(int(ref), set())

    async def duplicate(self, herald: Herald, person: str) -> None:
        """The same mail (same Message-ID) delivered into the mailbox once more."""
        await self.dovecot.append(self._last[person])

    def rate_limit(self, person: str, retry_after: int) -> None:
        raise NotImplementedError(self.cannot["rate_limit"])

    def server_error(self, count: int) -> None:
        self.smtp.refusals.extend(["451 4.3.0 try again later"] * count)

    def block(self, person: str) -> None:
        self.smtp.refusals.append("550 5.1.1 mailbox unavailable")


class TwilioHarness(PlatformHarness):
    """SMS through the fake Twilio: inbound messages are signed webhooks to Herald, replies
    go through the REST API."""

    platform = "twilio"
    people = ("+15551234567", "+15557654321")
    webhook = "sms"

    cannot: ClassVar[dict[str, str]] = {
        "stream_edits": "an SMS or WhatsApp message cannot be edited: the answer goes whole",
    }

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, list[tuple[str, str]]] = {}
        self._posts: list[asyncio.Task[int]] = []

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
        self._last[person] = self.twilio.message_form(person, text)
        await self._post(herald, self._last[person])

    async def _post(self, herald: Herald, form: list[tuple[str, str]]) -> None:
        url = f"{herald.url}/webhooks/twilio/{self.webhook}"
        answer = await self.twilio.post_form(url, form)
        if answer.status_code != 200:
            raise AssertionError(f"the Twilio webhook answered {answer.status_code}: {answer.text}")

    def texts_to(self, person: str) -> list[str]:
        return self.twilio.bodies(person)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for task in self._posts:
            task.cancel()
        await asyncio.gather(*self._posts, return_exceptions=True)
        await super().__aexit__(et, e, tb)

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["auth_token"] = "f" * 32
        context = AdapterContext(files, MemoryCheckpoints())
        return TwilioAdapter(TwilioConfig.model_validate(section), context)

    def chat_of(self, person: str) -> str:
        return person

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        """The signed webhook request handed to the adapter, answered in the background."""
        assert isinstance(adapter, TwilioAdapter)
        url = f"http://127.0.0.1:{ADAPTER_PORT}/webhooks/twilio/{self.webhook}"
        headers, body = self.twilio.signed_request(url, self.twilio.message_form(person, text))

        async def post() -> int:
            return (await adapter.handle_webhook(self.webhook, headers, body, sink)).status

        self._posts.append(asyncio.create_task(post()))
        return self._posts[-1]

    async def acknowledged(self, ref: Ref) -> bool:
        """Twilio: the webhook request was answered 200 (anything else is retried)."""
        assert isinstance(ref, asyncio.Task)
        return ref.done() and ref.result() == 200

    async def duplicate(self, herald: Herald, person: str) -> None:
        """The same request (same MessageSid) again, as Twilio retries a webhook."""
        await self._post(herald, self._last[person])

    def rate_limit(self, person: str, retry_after: int) -> None:
        self.twilio.rate_limit(1, float(retry_after), to=person)

    def server_error(self, count: int) -> None:
        self.twilio.fail(count, status=503)

    def block(self, person: str) -> None:
        self.twilio.reject(person, 21610)  # the number replied STOP

    stranger = "+15550000000"

    async def send_file(self, herald: Herald, person: str, content: bytes) -> None:
        whatsapp = self.webhook == "whatsapp" and not person.startswith("whatsapp:")
        number = f"whatsapp:{person}" if whatsapp else person
        await self._post(
            herald, self.twilio.message_form(number, "look", media=[(content, "application/pdf")])
        )

    def downloads(self) -> int:
        return len(self.twilio.media_fetches)


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

    cannot: ClassVar[dict[str, str]] = {
        "stranger_files": "the loopback chat server carries text only",
    }
    streaming: ClassVar[dict[str, Any]] = {"stream_edits": True}

    def edits(self) -> int:
        return len(self.chat.edits)

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, str] = {}

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
        self._last[person] = self.chat.inject(person, text, sender_id=person)

    def texts_to(self, person: str) -> list[str]:
        return self.chat.texts_in(person)

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["token"] = "4242:refused-token"
        return LoopbackAdapter(LoopbackConfig.model_validate(section))

    def chat_of(self, person: str) -> str:
        return person

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        return self.chat.inject(person, text, sender_id=person)

    async def acknowledged(self, ref: Ref) -> bool:
        """The chat server: a later poll acknowledged the message."""
        return ref in self.chat.acknowledged

    async def duplicate(self, herald: Herald, person: str) -> None:
        self.chat.duplicate(self._last[person])

    def rate_limit(self, person: str, retry_after: int) -> None:
        self.chat.rate_limit(person, count=1, retry_after=float(retry_after))

    def server_error(self, count: int) -> None:
        self.chat.fail_sends(count, status=503)

    def block(self, person: str) -> None:
        self.chat.block_chat(person)


class MatrixHarness(PlatformHarness):
    """Matrix on a real Synapse (the run's shared one, `tests/fakes/synapse.py`): each harness
    registers its own bot and people, and each person opens a direct chat with the bot. The
    bot's traffic passes `MatrixProxy`, which records what it sent and injects the faults
    Synapse cannot be asked for (a 429 with a chosen `retry_after_ms`, a 503); a block is
    real (the person kicks the bot out of the chat)."""

    platform = "matrix"
    people: ClassVar[tuple[str, str]] = ("@ann:herald.test", "@bob:herald.test")
    streaming: ClassVar[dict[str, Any]] = {"stream_edits": True, "min_edit_interval": 0.2}

    def __init__(self) -> None:
        super().__init__()
        self.rooms: dict[str, str] = {}
        self.clients: dict[str, AsyncClient] = {}
        self.checkpoints = MemoryCheckpoints()
        self._last: dict[str, str] = {}

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.synapse = await shared_synapse()
        self.bot = await self.synapse.register("herald")
        names = ("ann", "bob", "eve")
        accounts = await asyncio.gather(*(self.synapse.register(n) for n in names))
        self.people = (accounts[0].user_id, accounts[1].user_id)  # type: ignore[misc]
        self.stranger = accounts[2].user_id  # type: ignore[misc]
        self.proxy = await stack.enter_async_context(MatrixProxy(self.synapse.url))
        bot = await stack.enter_async_context(person_client(self.synapse.url, self.bot))
        for account in accounts:
            client = await stack.enter_async_context(person_client(self.synapse.url, account))
            self.clients[account.user_id] = client
            self.rooms[account.user_id] = await open_direct_chat(client, bot, self.bot.user_id)

    @property
    def fake(self) -> Waitable:
        return self.proxy

    def section(self, api_port: int) -> dict[str, Any]:
        return {
            "homeserver": self.proxy.url,
            "user_id": self.bot.user_id,
            "access_token": self.bot.access_token,
            "allowed_users": list(self.people),
            "stream_edits": False,
            "min_send_interval": 0,
            "sync_timeout": 5,
        }

    async def send(self, herald: Herald, person: str, text: str) -> None:
        self._last[person] = await say(self.clients[person], self.rooms[person], text)

    def texts_to(self, person: str) -> list[str]:
        return self.proxy.texts_in(self.rooms[person])

    def shown_to(self, person: str) -> list[str]:
        return self.proxy.shown_in(self.rooms[person])

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["access_token"] = "syt_refused_token_0000000000"
        return MatrixAdapter(MatrixConfig.model_validate(section), files, self.checkpoints)

    def chat_of(self, person: str) -> str:
        return self.rooms[person]

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        return await say(self.clients[person], self.rooms[person], text)

    async def acknowledged(self, ref: Ref) -> bool:
        """Matrix has no acknowledgement: what stands for one is the stored `since` token
        reaching past the `/sync` batch that carried the event."""
        since = await self.checkpoints.get("since")
        tokens = [b.next_batch for b in self.proxy.batches]
        carried = [i for i, b in enumerate(self.proxy.batches) if ref in b.events]
        return bool(carried) and since in tokens[carried[0] :]

    async def duplicate(self, herald: Herald, person: str) -> None:
        """The homeserver delivers the event again: the next `/sync` starts before it."""
        event = self._last[person]
        await self.proxy.wait_for(lambda: any(event in b.events for b in self.proxy.batches))
        self.proxy.rewind(event)

    def rate_limit(self, person: str, retry_after: int) -> None:
        self.proxy.rate_limit(self.rooms[person], float(retry_after))

    def server_error(self, count: int) -> None:
        self.proxy.fail_sends(count)

    def block(self, person: str) -> None:
        """The person removes the bot from the chat; the bot's requests about that room wait
        for the kick (then Synapse refuses them: the bot is not in the room)."""
        kick = self.clients[person].room_kick(self.rooms[person], self.bot.user_id)
        self.proxy.hold(self.rooms[person], asyncio.ensure_future(kick))

    stranger: ClassVar[str] = ""

    async def send_file(self, herald: Herald, person: str, content: bytes) -> None:
        await say_file(
            self.clients[person], self.rooms[person], content, "d.pdf", "application/pdf"
        )

    def downloads(self) -> int:
        return len(self.proxy.downloads)

    def edits(self) -> int:
        return self.proxy.edits()


class MattermostHarness(PlatformHarness):
    """Mattermost against the fake REST v4 + websocket server; each person has a direct
    channel with the bot."""

    platform = "mattermost"
    people = ("annannannannannannannanna1", "bobbobbobbobbobbobbobbobb1")
    DMS: ClassVar[dict[str, str]] = {
        "annannannannannannannanna1": "dmannanndmannanndmannanna1",
        "bobbobbobbobbobbobbobbobb1": "dmbobbobdmbobbobdmbobbobb1",
        "eveeveeveeveeveeveeveevee1": "dmeveevedmeveevedmeveevee1",
    }
    stranger = "eveeveeveeveeveeveeveevee1"

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, dict[str, Any]] = {}
        self.checkpoints = MemoryCheckpoints()
        """The adapter's checkpoints: each channel's newest post in the inbox."""

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.mm = await stack.enter_async_context(FakeMattermostServer())
        for person, name in zip((*self.people, self.stranger), ("ann", "bob", "eve"), strict=True):
            self.mm.add_user(person, name)
            self.mm.add_channel(self.DMS[person], "D")

    @property
    def fake(self) -> Waitable:
        return self.mm

    def section(self, api_port: int) -> dict[str, Any]:
        return {
            "url": self.mm.base_url,
            "token": MATTERMOST_TOKEN,
            "allowed_users": list(self.people),
            "stream_edits": False,
            "min_send_interval": 0,
            "working_reaction": "",
        }

    async def send(self, herald: Herald, person: str, text: str) -> None:
        await self.mm.wait_for(lambda: self.mm.connected > 0, WAIT)
        self._last[person] = self.mm.inject_post(self.DMS[person], text, user=person)

    def texts_to(self, person: str) -> list[str]:
        return self.mm.texts_in(self.DMS[person])

    def shown_to(self, person: str) -> list[str]:
        return self.mm.shown_in(self.DMS[person])

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["token"] = "refusedrefusedrefusedrefus"
        return MattermostAdapter(MattermostConfig.model_validate(section), files, self.checkpoints)

    def chat_of(self, person: str) -> str:
        return self.DMS[person]

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        await self.mm.wait_for(lambda: self.mm.connected > 0, WAIT)
        post = self.mm.inject_post(self.DMS[person], text, user=person)
        return post["channel_id"], post["id"]

    async def acknowledged(self, ref: Ref) -> bool:
        """Mattermost has no acknowledgement: what stands for one is the channel's checkpoint
        (where reading back starts after a reconnect) naming the post."""
        channel, post_id = ref
        seen = await self.checkpoints.get(f"last:{channel}")
        return seen is not None and seen.endswith(f":{post_id}")

    async def duplicate(self, herald: Herald, person: str) -> None:
        self.mm.redeliver(self._last[person])

    def rate_limit(self, person: str, retry_after: int) -> None:
        self.mm.rate_limit(self.DMS[person], float(retry_after))

    def server_error(self, count: int) -> None:
        self.mm.fail_posts(503, count)

    def block(self, person: str) -> None:
        self.mm.remove_channel(self.DMS[person])  # 403: the bot is no longer in the channel

    async def send_file(self, herald: Herald, person: str, content: bytes) -> None:
        await self.mm.wait_for(lambda: self.mm.connected > 0, WAIT)
        file_id = self.mm.add_file(content, "d.pdf", "application/pdf", person)
        self.mm.inject_post(self.DMS[person], "look", user=person, files=(file_id,))

    def downloads(self) -> int:
        return len(self.mm.downloads)

    def edits(self) -> int:
        return len(self.mm.edits)


class SignalHarness(PlatformHarness):
    """Signal through the fake signal-cli daemon (`tests/fakes/signal_cli.py`), a
    multi-account one (each request names the account, so a number it does not serve is
    refused on entering); a person's direct chat id is their number."""

    platform = "signal"
    people = ("+15551230001", "+15551230002")
    stranger = "+15551230666"

    cannot: ClassVar[dict[str, str]] = {
        "stream_edits": "Herald does not stream answers by edits on Signal: each edit would "
        "notify the phone again, and the apps mark every edited message",
    }

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, dict[str, Any]] = {}

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.signal = await stack.enter_async_context(FakeSignalCli(multi_account=True))

    @property
    def fake(self) -> Waitable:
        return self.signal

    def section(self, api_port: int) -> dict[str, Any]:
        return {
            "number": self.signal.number,
            "url": self.signal.url,
            "multi_account": True,
            "allowed_users": list(self.people),
            "min_send_interval": 0,
        }

    async def send(self, herald: Herald, person: str, text: str) -> None:
        self._last[person] = self.signal.push(self.signal.message(person, text))

    def texts_to(self, person: str) -> list[str]:
        return self.signal.texts_to(person)

    def adapter(self, files: Path, *, bad_token: bool = False) -> Adapter:
        section = self.section(ADAPTER_PORT)
        if bad_token:
            section["number"] = "+15550000001"  # not an account of this daemon
        return SignalAdapter(SignalConfig.model_validate(section), files)

    def chat_of(self, person: str) -> str:
        return person

    async def inject(self, adapter: Adapter, sink: InboundSink, person: str, text: str) -> Ref:
        return self.signal.say(person, text)

    async def acknowledged(self, ref: Ref) -> bool:
        """signal-cli has no acknowledgement (it forgets a message once written to the
        stream): what stands for one is the read receipt Herald sends after the commit."""
        return any(self.signal.read(p, ref) for p in (*self.people, self.stranger))

    async def duplicate(self, herald: Herald, person: str) -> None:
        """The same envelope (same author and timestamp) on the stream again."""
        self.signal.push(self._last[person])

    def rate_limit(self, person: str, retry_after: int) -> None:
        self.signal.rate_limit(person, float(retry_after))

    def server_error(self, count: int) -> None:
        self.signal.fail(count, status=503)

    def block(self, person: str) -> None:
        self.signal.block(person)

    async def send_file(self, herald: Herald, person: str, content: bytes) -> None:
        files = [(content, "application/pdf", "d.pdf")]
        self.signal.push(self.signal.message(person, "look", files=files))

    def downloads(self) -> int:
        return len(self.signal.downloads)


HARNESSES: dict[str, type[PlatformHarness]] = {
    "telegram": TelegramHarness,
    "slack": SlackHarness,
    "discord": DiscordHarness,
    "email": EmailHarness,
    "sms": TwilioHarness,
    "whatsapp": WhatsAppHarness,
    "loopback": LoopbackHarness,
    "matrix": MatrixHarness,
    "mattermost": MattermostHarness,
    "signal": SignalHarness,
}
"""Every platform's harness by test id."""


@contextlib.asynccontextmanager
async def started(name: str) -> AsyncIterator[PlatformHarness]:
    """The harness `name` of `HARNESSES`, its fake started."""
    async with HARNESSES[name]() as harness:
        yield harness
