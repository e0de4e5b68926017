"""One SIGKILL crash scenario per platform, for the parametrised test in test_crash_e2e.py.

A scenario starts its platform's fake, writes the platform's config section, sends a burst of
messages from many people (while the daemon runs, and on while it is killed and down), waits
until the platform and the store settled, and checks what its platform proves: what it
acknowledged, what it stored once, what it answered once.

- loopback: the fake chat server keeps every message until the adapter acknowledges it (like
  a real platform).
- telegram: the fake Bot API keeps every update until a later `getUpdates` passes it with its
  `offset`, so a process killed between storing an update and confirming it gets the update
  again on restart.
- slack: the fake Slack redelivers every envelope not acknowledged within `ack_timeout` (on the
  next socket when the old one is gone), and Herald acknowledges an envelope only after its
  event is in the inbox; an event it never stored comes again too.
- discord: no acknowledgement: what the gateway sent a killed process is gone, and what
  arrives while Herald is down is sent to no one. It is all still in channel history, though,
  and Herald moves a channel's last seen id only after the inbox stored the message; after
  every READY it reads each channel it talks in from there on. Each person says hello first,
  while Herald runs: a DM channel Herald never heard from is not one it can read back (Discord
  does not list a bot's DM channels).
- email: a real Dovecot holds the mailbox and a real SMTP server (aiosmtpd) records the
  replies; kills land between the fetch, the inbox commit, the `\\Seen` flag, the watermark,
  the turn and the SMTP send. Every reply is threaded to its mail.
- twilio: each inbound SMS is posted to `/webhooks/twilio/sms`, signed, until Herald answers
  200 (as Twilio does with a retrying connection override), and Herald answers only after the
  inbox commit; a process killed between storing a message and answering gets the same
  MessageSid again after the restart.
- mattermost: like discord, no acknowledgement: what the websocket sent a killed process, or
  what was posted while Herald was down, is read back from each channel it has heard from
  (`GET /channels/{id}/posts?since=`) after every `hello`, from the channel's checkpoint, which
  moves only after the inbox stored the post. Each person says hello first. A reply resent
  after a crash carries the same `pending_post_id` and is looked for among the channel's
  posts (its `herald_send` prop) before it is posted again.
- signal: the fake signal-cli daemon in `on-connection` mode. signal-cli has no redelivery: a
  message written to the event stream of a process that is then killed is gone unless that
  process stored it first. Herald reads one event at a time and stores it before reading the
  next, so the scenario checks that every message is stored once and answered once, except
  only messages written to a killed process's stream; what arrives while Herald is down waits
  for the next stream.
- matrix: a real Synapse; Herald stores its `/sync` token only after the batch's events are
  in the inbox, so a killed process is given them again; a reply resent after a crash keeps
  its transaction id, and Synapse makes it the same event.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import Any, ClassVar

import httpx
import pytest
from sqlalchemy import func, select

from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.tables import inbox, outbox, turns
from tests.e2e.crash import (
    check_accepted_once,
    check_deliveries,
    check_turns_once,
    read_results,
    settle,
    work_left,
)
from tests.e2e.daemon import Daemon
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.discord_server import DEFAULT_TOKEN as DISCORD_TOKEN
from tests.fakes.discord_server import FakeDiscordServer
from tests.fakes.discord_server import Posted as DiscordPosted
from tests.fakes.dovecot import USER, Dovecot
from tests.fakes.matrix_people import open_direct_chat, person_client, say
from tests.fakes.matrix_proxy import MatrixProxy
from tests.fakes.matrix_proxy import Sent as MatrixSent
from tests.fakes.mattermost_server import TOKEN as MATTERMOST_TOKEN
from tests.fakes.mattermost_server import FakeMattermostServer
from tests.fakes.signal_cli import FakeSignalCli
from tests.fakes.signal_cli import Sent as SignalSent
from tests.fakes.slack import (
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    FakeSlackServer,
    Posted,
)
from tests.fakes.smtp_server import Received, SmtpServer
from tests.fakes.synapse import shared_synapse
from tests.fakes.telegram import FakeTelegramServer, Sent
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    FakeTwilioServer,
)
from tests.fakes.twilio_server import Sent as TwilioSent


class CrashScenario(abc.ABC):
    """One platform's fake and the messages sent to Herald through it during the kills."""

    section_name: ClassVar[str]
    """The platform's section under `platforms` (and its inbox rows' platform)."""
    messages: ClassVar[int]
    """Messages sent in the bursts, over all rounds."""
    kills: ClassVar[int]
    seed: ClassVar[int]
    """Seeds the moments of the kills and the pauses between messages."""
    delays_seed: ClassVar[int]
    """Seeds the fake LLM's answer delays."""
    settle_timeout: ClassVar[float]

    def __init__(self) -> None:
        self.rng = random.Random(self.seed)

    @abc.abstractmethod
    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        """Start the fake(s), entered into `stack`."""

    @abc.abstractmethod
    def section(self) -> dict[str, Any]:
        """The platform's config section (one dict: changes to it reach every start)."""

    async def before(self, daemon: Daemon) -> None:
        """What happens before the first kill round (the daemon is not running)."""
        return None

    @property
    def per_round(self) -> int:
        return self.messages // self.kills

    @abc.abstractmethod
    async def burst(self, round_: int) -> None:
        """Send round `round_`'s messages."""

    @abc.abstractmethod
    async def settle(self, store: Store, daemon: Daemon) -> None:
        """Wait until the platform and the store settled; fail the test if they do not."""

    @abc.abstractmethod
    async def check(self, store: Store) -> None:
        """Every assertion of what the platform and the store say at the end."""

    def after(self) -> None:
        """Checks after the daemon stopped for good."""
        return None


class LoopbackCrash(CrashScenario):
    """The test-only loopback platform against the fake chat server."""

    section_name = "test"
    messages = 120
    kills = 3
    seed = 20261122
    delays_seed = 20261122
    settle_timeout = 120.0
    CHATS = 30
    TOKEN = "crash-token"

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        self.chat = await stack.enter_async_context(FakeChatServer(self.TOKEN))
        self.texts: dict[str, str] = {}
        self._section = {
            "url": self.chat.base_url,
            "token": self.TOKEN,
            "allowed_users": ["*"],
            "stream_edits": False,
            "poll_timeout": 1,
        }

    def section(self) -> dict[str, Any]:
        return self._section

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            user = f"u{n % self.CHATS}"
            message_id = self.chat.inject(user, f"message {n}", sender_id=user)
            self.texts[message_id] = f"message {n}"
            if i % 10 == 9:
                await asyncio.sleep(self.rng.uniform(0.0, 0.1))

    async def settle(self, store: Store, daemon: Daemon) -> None:
        """Wait until every message is acknowledged, answered and its reply sent."""
        async with asyncio.timeout(self.settle_timeout):
            while True:
                async with store.read() as conn:
                    open_rows = await conn.scalar(
                        select(inbox.c.id).where(inbox.c.status != "done").limit(1)
                    )
                    accepted = len((await conn.execute(select(inbox.c.id))).all())
                    unsent = await conn.scalar(
                        select(outbox.c.id)
                        .where(outbox.c.status.in_(["pending", "sending"]))
                        .limit(1)
                    )
                if (
                    not self.chat.pending
                    and open_rows is None
                    and unsent is None
                    and accepted >= self.messages
                ):
                    return
                await asyncio.sleep(0.2)

    async def check(self, store: Store) -> None:
        texts = self.texts
        async with store.read() as conn:
            rows = (await conn.execute(select(inbox))).mappings().all()
            done_turns = {
                int(r.id): str(r.status)
                for r in (await conn.execute(select(turns.c.id, turns.c.status))).all()
            }
            chunks = (await conn.execute(select(outbox))).mappings().all()

        # Every injected message was accepted exactly once and has exactly one outcome.
        by_message = Counter(str(r["platform_message_id"]) for r in rows)
        assert set(by_message) == set(texts)
        assert set(by_message.values()) == {1}
        outcomes = Counter(str(r["outcome"]) for r in rows)
        assert set(outcomes) <= {"answered", "dropped"}, outcomes
        for r in rows:
            assert r["status"] == "done"
            if r["outcome"] == "dropped":  # only a message whose turn was cut off three times
                assert "stopped" in str(r["outcome_detail"])

        answered, _ = check_turns_once(rows, done_turns)

        # Every answered message's reply reached its chat, with the right text.
        replies = {str(c["idempotency_key"]): c for c in chunks if c["kind"] == "reply"}
        sent_keys = defaultdict(list)
        for s in self.chat.sent:
            sent_keys[s.idempotency_key].append(s)
        for r in answered:
            chunk = next(c for c in replies.values() if c["turn_id"] == r["turn_id"])
            assert chunk["status"] == "sent", chunk
            sends = sent_keys[str(chunk["idempotency_key"])]
            assert sends, f"the reply to {r['text']!r} never reached the chat"
            assert sends[0].text == f"You said: {texts[str(r['platform_message_id'])]}"
            assert sends[0].chat_id == r["chat_id"]

        # Any duplicate is a resend after a crash, and marked so.
        for key, sends in sent_keys.items():
            assert all(s.recovered for s in sends[1:]), (key, sends)


class TelegramCrash(CrashScenario):
    """Telegram against the fake Bot API; each user's chat id is the user's id."""

    section_name = "telegram"
    messages = 90
    kills = 3
    seed = 20261123
    delays_seed = 7
    settle_timeout = 120.0
    USERS = 30
    TOKEN = "123456:crash-token"
    FIRST_USER = 1001

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        self.tg = await stack.enter_async_context(FakeTelegramServer(self.TOKEN))
        self.injected: dict[str, tuple[int, int, str]] = {}
        """platform_message_id -> (update id, chat id, text)."""
        self._section = {
            "token": self.TOKEN,
            "base_url": self.tg.base_url,
            "base_file_url": self.tg.base_file_url,
            "allowed_users": ["*"],
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
        }

    def section(self) -> dict[str, Any]:
        return self._section

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            user = self.FIRST_USER + n % self.USERS
            text = f"message {n}"
            sent = self.tg.inject_message(user, text, sender_id=user)
            self.injected[f"{sent.chat_id}:{sent.message_id}"] = (sent.update_id, user, text)
            await asyncio.sleep(self.rng.uniform(0.0, 0.05))

    async def settle(self, store: Store, daemon: Daemon) -> None:
        try:
            # Telegram's offset passes an update only after Herald stored it, so with nothing
            # pending every injected message should be in the inbox: `check` says which are not.
            await settle(store, lambda: not self.tg.pending, self.settle_timeout)
        except TimeoutError:
            pytest.fail(
                f"not settled in {self.settle_timeout}s ({len(self.tg.pending)} updates "
                f"pending):\n{daemon.output()[-5000:]}"
            )

    async def check(self, store: Store) -> None:
        tg, injected = self.tg, self.injected
        rows, turn_status, chunks = await read_results(store, "telegram")

        # Telegram's side: every update was confirmed, none is left waiting.
        assert len(injected) == self.messages
        assert not tg.pending
        assert {update_id for update_id, _, _ in injected.values()} <= set(tg.confirmed)

        # Every injected message was accepted exactly once and has exactly one outcome.
        by_message = Counter(str(r["platform_message_id"]) for r in rows)
        lost = sorted(set(injected) - set(by_message), key=lambda k: injected[k][0])
        assert not lost, f"confirmed to Telegram but never stored: {[injected[k] for k in lost]}"
        check_accepted_once(
            rows,
            {k: (str(chat), text) for k, (_, chat, text) in injected.items()},
            kills=self.kills,
        )

        answered, _ = check_turns_once(rows, turn_status)

        # Everything Herald queued was delivered; everything the chats got, Herald had queued;
        # every answered message's reply reached its own chat, exactly once unless it was
        # resent after a crash (its chunk marked recovered).
        received: defaultdict[tuple[str, str], list[Sent]] = defaultdict(list)
        for s in tg.sent:
            received[str(s.chat_id), s.plain_text].append(s)
        check_deliveries(chunks, answered, received, chat="chat")


class SlackCrash(CrashScenario):
    """Slack Socket Mode against the fake Slack; each user writes in a DM of their own (user
    `U…NN`, channel `D…NN`)."""

    section_name = "slack"
    messages = 90
    kills = 3
    seed = 20261124
    delays_seed = 11
    settle_timeout = 90.0
    USERS = 30
    ACK_TIMEOUT = 1.0
    """Seconds the fake waits for an ack before sending the envelope again."""
    MAX_RETRIES = 1000
    """Redeliveries before the fake gives up: never, here (Herald cannot help Slack's limit)."""

    @staticmethod
    def user_id(n: int) -> str:
        return f"U0CRASH{n:03d}"

    @staticmethod
    def dm_of(user: str) -> str:
        return "D" + user[1:]

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        self.slack = await stack.enter_async_context(
            FakeSlackServer(ack_timeout=self.ACK_TIMEOUT, max_retries=self.MAX_RETRIES)
        )
        self.injected: dict[str, tuple[str, str, str]] = {}
        """platform_message_id (`<channel>:<ts>`) -> (event id, channel, text)."""
        self._section = {
            "bot_token": DEFAULT_BOT_TOKEN,
            "app_token": DEFAULT_APP_TOKEN,
            "base_url": self.slack.base_url,
            "allowed_users": ["*"],
            "ping_interval": 2,
            "stream_edits": False,
            "working_reaction": "",
            "min_send_interval": 0,
        }

    def section(self) -> dict[str, Any]:
        return self._section

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            user = self.user_id(n % self.USERS)
            text = f"message {n}"
            sent = self.slack.inject_message(self.dm_of(user), text, user=user)
            self.injected[f"{sent.channel}:{sent.ts}"] = (sent.event_id, sent.channel, text)
            await asyncio.sleep(self.rng.uniform(0.0, 0.05))

    async def settle(self, store: Store, daemon: Daemon) -> None:
        try:
            # Herald acknowledges an envelope only after the inbox commit, so with nothing
            # pending every injected message should be in the inbox: `check` says which are not.
            await settle(store, lambda: not self.slack.pending, self.settle_timeout)
        except TimeoutError:
            pytest.fail(
                f"not settled in {self.settle_timeout}s ({len(self.slack.pending)} events "
                f"pending):\n{daemon.output()[-5000:]}"
            )

    async def check(self, store: Store) -> None:
        slack, injected = self.slack, self.injected
        rows, turn_status, chunks = await read_results(store, "slack")

        # Slack's side: every event was acknowledged by Herald, none given up or left waiting.
        assert len(injected) == self.messages
        assert not slack.pending
        assert slack.expired == []
        event_ids = {event_id for event_id, _, _ in injected.values()}
        assert event_ids <= set(slack.acked)
        acked_by_ack = {
            envelope.event_id
            for envelope in slack.envelopes
            if envelope.acked_at is not None and envelope.event_id in event_ids
        }
        assert acked_by_ack == event_ids  # each by an ack of Herald's on a socket

        # Every injected message was accepted exactly once and has exactly one outcome.
        by_message = Counter(str(r["platform_message_id"]) for r in rows)
        lost = sorted(set(injected) - set(by_message))
        assert not lost, f"acknowledged to Slack but never stored: {[injected[k] for k in lost]}"
        check_accepted_once(
            rows, {k: (chat, text) for k, (_, chat, text) in injected.items()}, kills=self.kills
        )

        answered, _ = check_turns_once(rows, turn_status)

        # Everything Herald queued was delivered; everything the DMs got, Herald had queued;
        # every answered message's reply reached its own DM, exactly once unless it was resent
        # after a crash (its chunk marked recovered), and in the DM itself, not in a thread.
        received: defaultdict[tuple[str, str], list[Posted]] = defaultdict(list)
        for p in slack.posted:
            received[p.channel, p.text].append(p)
        check_deliveries(chunks, answered, received, chat="DM", check_reply=_not_in_threads)

    def after(self) -> None:
        # Herald never held two sockets at once, restarts included.
        assert self.slack.max_open_sockets == 1


def _not_in_threads(sends: Sequence[Posted]) -> None:
    assert all(s.thread_ts is None for s in sends)  # a DM is answered in the DM itself


class DiscordCrash(CrashScenario):
    """Discord against the fake gateway and REST API; each person has a DM channel."""

    section_name = "discord"
    messages = 60
    kills = 3
    seed = 20261123
    delays_seed = 7
    settle_timeout = 90.0
    USERS = 8

    @staticmethod
    def user_id(n: int) -> str:
        return f"20000000000000{n:05d}"

    @staticmethod
    def dm_id(n: int) -> str:
        return f"30000000000000{n:05d}"

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        self.discord = await stack.enter_async_context(FakeDiscordServer(heartbeat_interval=1.0))
        for n in range(self.USERS):
            self.discord.add_user(self.user_id(n), f"user{n}")
            self.discord.add_channel(self.dm_id(n), dm=True)
        self.injected: dict[str, tuple[str, str]] = {}
        """platform_message_id -> (chat id, text)."""
        self._section = {
            "token": DISCORD_TOKEN,
            "api_base": self.discord.api_base,
            "allowed_users": ["*"],
            "stream_edits": False,
            "min_send_interval": 0,
        }

    def section(self) -> dict[str, Any]:
        return self._section

    def say(self, n: int, text: str) -> None:
        sent = self.discord.inject_message(self.dm_id(n), text, author=self.user_id(n))
        self.injected[f"{self.dm_id(n)}:{sent['id']}"] = (self.dm_id(n), text)

    async def before(self, daemon: Daemon) -> None:
        await daemon.start()
        for n in range(self.USERS):
            self.say(n, f"hello from {n}")
        await self.discord.wait_for_posted(
            lambda p: p.content.startswith("You said: hello"), count=self.USERS, timeout=60
        )
        assert await daemon.stop() == 0  # the kill rounds start it again

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            self.say(n % self.USERS, f"message {n}")
            await asyncio.sleep(self.rng.uniform(0.0, 0.05))

    async def _stored(self, store: Store) -> int:
        async with store.read() as conn:
            count = await conn.scalar(
                select(func.count()).select_from(inbox).where(inbox.c.platform == "discord")
            )
        return int(count or 0)

    async def settle(self, store: Store, daemon: Daemon) -> None:
        try:
            async with asyncio.timeout(self.settle_timeout):
                while await self._stored(store) < len(self.injected):
                    await asyncio.sleep(0.2)
            await settle(store, lambda: True, self.settle_timeout)
        except TimeoutError:
            pytest.fail(
                f"not settled in {self.settle_timeout}s ({await self._stored(store)} of "
                f"{len(self.injected)} stored):\n{daemon.output()[-5000:]}"
            )

    async def check(self, store: Store) -> None:
        rows, turn_status, chunks = await read_results(store, "discord")
        assert len(self.injected) == self.messages + self.USERS
        check_accepted_once(rows, self.injected, kills=self.kills)
        answered, _ = check_turns_once(rows, turn_status)
        received: defaultdict[tuple[str, str], list[DiscordPosted]] = defaultdict(list)
        for p in self.discord.posted:
            received[p.channel_id, p.content].append(p)
        check_deliveries(chunks, answered, received, chat="DM")


class MattermostCrash(CrashScenario):
    """Mattermost against the fake REST v4 + websocket server; each person has a direct
    channel with the bot."""

    section_name = "mattermost"
    messages = 60
    kills = 3
    seed = 20261129
    delays_seed = 11
    settle_timeout = 90.0
    USERS = 8

    @staticmethod
    def user_id(n: int) -> str:
        return f"user{n:022d}"

    @staticmethod
    def dm_id(n: int) -> str:
        return f"dmch{n:022d}"

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        self.mm = await stack.enter_async_context(FakeMattermostServer())
        for n in range(self.USERS):
            self.mm.add_user(self.user_id(n), f"user{n}")
            self.mm.add_channel(self.dm_id(n), "D")
        self.injected: dict[str, tuple[str, str]] = {}
        """platform_message_id -> (chat id, text)."""
        self._section = {
            "url": self.mm.base_url,
            "token": MATTERMOST_TOKEN,
            "allowed_users": ["*"],
            "stream_edits": False,
            "min_send_interval": 0,
            "working_reaction": "",
        }

    def section(self) -> dict[str, Any]:
        return self._section

    def say(self, n: int, text: str) -> None:
        post = self.mm.inject_post(self.dm_id(n), text, user=self.user_id(n))
        self.injected[f"{self.dm_id(n)}:{post['id']}"] = (self.dm_id(n), text)

    async def before(self, daemon: Daemon) -> None:
        await daemon.start()
        await self.mm.wait_for(lambda: self.mm.connected > 0, 60)
        for n in range(self.USERS):
            self.say(n, f"hello from {n}")
        await self.mm.wait_for(
            lambda: (
                sum(p["message"].startswith("You said: hello") for p in self.mm.posted)
                >= self.USERS
            ),
            60,
        )
        assert await daemon.stop() == 0  # the kill rounds start it again

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            self.say(n % self.USERS, f"message {n}")
            await asyncio.sleep(self.rng.uniform(0.0, 0.05))

    async def _stored(self, store: Store) -> int:
        async with store.read() as conn:
            count = await conn.scalar(
                select(func.count()).select_from(inbox).where(inbox.c.platform == "mattermost")
            )
        return int(count or 0)

    async def settle(self, store: Store, daemon: Daemon) -> None:
        try:
            async with asyncio.timeout(self.settle_timeout):
                while await self._stored(store) < len(self.injected):
                    await asyncio.sleep(0.2)
            await settle(store, lambda: True, self.settle_timeout)
        except TimeoutError:
            pytest.fail(
                f"not settled in {self.settle_timeout}s ({await self._stored(store)} of "
                f"{len(self.injected)} stored):\n{daemon.output()[-5000:]}"
            )

    async def check(self, store: Store) -> None:
        rows, turn_status, chunks = await read_results(store, "mattermost")
        assert len(self.injected) == self.messages + self.USERS
        check_accepted_once(rows, self.injected, kills=self.kills)
        answered, _ = check_turns_once(rows, turn_status)
        received: defaultdict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for p in self.mm.posted:
            received[p["channel_id"], p["message"]].append(p)
        check_deliveries(chunks, answered, received, chat="DM")


class EmailCrash(CrashScenario):
    """Email through a real Dovecot and a real SMTP server; every sender writes new mail."""

    section_name = "email"
    messages = 36
    kills = 3
    seed = 20261124
    delays_seed = 11
    settle_timeout = 120.0
    SENDERS = 8

    @staticmethod
    def mail(sender: str, text: str) -> tuple[bytes, str]:
        """(bytes, bare Message-ID) of a new mail from `sender`."""
        message = EmailMessage()
        message["From"] = sender
        message["To"] = USER
        message["Subject"] = text
        message["Date"] = format_datetime(utcnow())
        message["Message-ID"] = make_msgid(domain="example.com")
        message.set_content(text)
        return message.as_bytes(), str(message["Message-ID"]).strip("<>")

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        self.dovecot = await stack.enter_async_context(Dovecot())
        self.smtp = await stack.enter_async_context(SmtpServer())
        self.injected: dict[str, tuple[str, str]] = {}
        """Message-ID -> (sender, text)."""
        self._section = self.dovecot.section(
            **self.smtp.section(), allowed_senders=["@example.com"], idle_renew=30, timeout=5
        )

    def section(self) -> dict[str, Any]:
        return self._section

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            sender = f"user{n % self.SENDERS}@example.com"
            text = f"message {n}"
            data, message_id = self.mail(sender, text)
            await self.dovecot.append(data)
            self.injected[message_id] = (sender, text)
            await asyncio.sleep(self.rng.uniform(0.0, 0.1))

    async def settle(self, store: Store, daemon: Daemon) -> None:
        """Wait until every mail on the server is flagged and no work is left (polled)."""
        try:
            async with asyncio.timeout(self.settle_timeout):
                while True:
                    flags = await self.dovecot.flags()
                    seen = len(flags) == self.messages and all(
                        "\\Seen" in f for f in flags.values()
                    )
                    if seen and not await work_left(store):
                        return
                    await asyncio.sleep(0.2)
        except TimeoutError:
            pytest.fail(f"not settled in {self.settle_timeout}s:\n{daemon.output()[-5000:]}")

    async def check(self, store: Store) -> None:
        injected = self.injected
        rows, turn_status, chunks = await read_results(store, "email")
        assert len(injected) == self.messages
        check_accepted_once(rows, injected, kills=self.kills)
        answered, _ = check_turns_once(rows, turn_status)
        received: defaultdict[tuple[str, str], list[Received]] = defaultdict(list)
        for r in self.smtp.received:
            received[r.rcpt_tos[0], r.text].append(r)
        by_text = {text: message_id for message_id, (_, text) in injected.items()}

        def threaded(sends: Sequence[Received]) -> None:
            for sent in sends:
                asked = by_text[sent.text.removeprefix("You said: ")]
                assert sent.header("In-Reply-To") == f"<{asked}>"
                assert sent.header("Subject") == f"Re: {sent.text.removeprefix('You said: ')}"

        check_deliveries(chunks, answered, received, chat="mailbox", check_reply=threaded)


class Deliveries:
    """Inbound SMS on their way to Herald: each posted until answered 200."""

    RETRY_PAUSE = (0.1, 2.0)
    """Seconds before a webhook Herald did not answer 200 is posted again: doubling from the
    first to the second, jittered (a down daemon is not hammered by every waiting message at
    once)."""

    def __init__(self, twilio: FakeTwilioServer) -> None:
        self.twilio = twilio
        self.url = ""
        self.tasks: list[asyncio.Task[None]] = []
        self.answered: set[str] = set()
        self.injected: dict[str, tuple[str, str]] = {}
        """MessageSid → (chat, text)."""

    def inject(self, sender: str, text: str) -> None:
        form = self.twilio.message_form(sender, text)
        sid = dict(form)["MessageSid"]
        self.injected[sid] = (sender, text)
        self.tasks.append(asyncio.create_task(self._deliver(sid, form)))

    async def _deliver(self, sid: str, form: list[tuple[str, str]]) -> None:
        pause, longest = self.RETRY_PAUSE
        while True:
            with contextlib.suppress(httpx.HTTPError):
                answer = await self.twilio.post_form(self.url, form)
                if answer.status_code == 200:
                    self.answered.add(sid)
                    return
                assert answer.status_code == 503, answer.text  # draining or starting: again
            await asyncio.sleep(random.uniform(pause / 2, pause))
            pause = min(longest, pause * 2)

    @property
    def pending(self) -> bool:
        return len(self.answered) < len(self.injected)

    async def aclose(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class TwilioCrash(CrashScenario):
    """SMS through the fake Twilio: inbound messages are signed webhooks posted until 200."""

    section_name = "twilio"
    messages = 80
    kills = 2
    seed = 20261123
    delays_seed = 8
    settle_timeout = 150.0
    NUMBERS = 15

    @staticmethod
    def number(n: int) -> str:
        return f"+1555300{n:04d}"

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        self.twilio = await stack.enter_async_context(FakeTwilioServer())
        self.deliveries = Deliveries(self.twilio)
        stack.push_async_callback(self.deliveries.aclose)
        self._section: dict[str, Any] = {
            "account_sid": DEFAULT_ACCOUNT_SID,
            "auth_token": DEFAULT_AUTH_TOKEN,
            "from_number": HERALD_NUMBER,
            "base_url": self.twilio.base_url,
            "allowed_numbers": ["*"],
            "min_send_interval": 0,
            "status_callbacks": False,
        }

    def section(self) -> dict[str, Any]:
        return self._section

    async def before(self, daemon: Daemon) -> None:
        self._section["public_url"] = daemon.url  # written into the config at each start
        self.deliveries.url = f"{daemon.url}/webhooks/twilio/sms"

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            self.deliveries.inject(self.number(n % self.NUMBERS), f"message {n}")
            await asyncio.sleep(self.rng.uniform(0.0, 0.04))

    async def settle(self, store: Store, daemon: Daemon) -> None:
        deliveries = self.deliveries
        try:
            await settle(store, lambda: not deliveries.pending, self.settle_timeout)
        except TimeoutError:
            missing = len(deliveries.injected) - len(deliveries.answered)
            pytest.fail(
                f"not settled in {self.settle_timeout}s ({missing} webhooks unanswered):\n"
                f"{daemon.output()[-5000:]}"
            )

    async def check(self, store: Store) -> None:
        deliveries = self.deliveries
        rows, turn_status, chunks = await read_results(store, "twilio")
        assert len(deliveries.injected) == self.messages
        assert deliveries.answered == set(deliveries.injected)
        check_accepted_once(rows, deliveries.injected, kills=self.kills)
        answered, _ = check_turns_once(rows, turn_status)
        received: defaultdict[tuple[str, str], list[TwilioSent]] = defaultdict(list)
        for sent in self.twilio.sent:
            received[sent.to, sent.body].append(sent)
        check_deliveries(chunks, answered, received, chat="number", check_reply=_from_herald)


def _from_herald(sends: Sequence[TwilioSent]) -> None:
    assert all(s.from_ == HERALD_NUMBER for s in sends)


class MatrixCrash(CrashScenario):
    """Matrix on a real Synapse (the run's shared one), Herald's traffic through the recording
    proxy. No acknowledgement but the stored `since`: Herald stores it only after every event
    of its batch is in the inbox, so a killed process syncs the same events again; a reply
    resent after a crash carries the same transaction id, which Synapse makes one event."""

    section_name = "matrix"
    messages = 24
    kills = 2
    seed = 20261129
    delays_seed = 13
    settle_timeout = 90.0
    USERS = 4

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        synapse = await shared_synapse()
        bot = await synapse.register("herald")
        people = await asyncio.gather(*(synapse.register(f"p{n}") for n in range(self.USERS)))
        self.proxy = await stack.enter_async_context(MatrixProxy(synapse.url))
        bot_client = await stack.enter_async_context(person_client(synapse.url, bot))
        self.clients = [
            await stack.enter_async_context(person_client(synapse.url, p)) for p in people
        ]
        self.rooms = [await open_direct_chat(c, bot_client, bot.user_id) for c in self.clients]
        self.injected: dict[str, tuple[str, str]] = {}
        """platform_message_id -> (room id, text)."""
        self._section = {
            "homeserver": self.proxy.url,
            "user_id": bot.user_id,
            "access_token": bot.access_token,
            "allowed_users": ["*"],
            "stream_edits": False,
            "min_send_interval": 0,
            "sync_timeout": 2,
        }

    def section(self) -> dict[str, Any]:
        return self._section

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            person = n % self.USERS
            text = f"message {n}"
            event = await say(self.clients[person], self.rooms[person], text)
            self.injected[f"{self.rooms[person]}:{event}"] = (self.rooms[person], text)
            await asyncio.sleep(self.rng.uniform(0.0, 0.05))

    async def _stored(self, store: Store) -> int:
        async with store.read() as conn:
            count = await conn.scalar(
                select(func.count()).select_from(inbox).where(inbox.c.platform == "matrix")
            )
        return int(count or 0)

    async def settle(self, store: Store, daemon: Daemon) -> None:
        try:
            async with asyncio.timeout(self.settle_timeout):
                while await self._stored(store) < len(self.injected):
                    await asyncio.sleep(0.2)
            await settle(store, lambda: True, self.settle_timeout)
        except TimeoutError:
            pytest.fail(
                f"not settled in {self.settle_timeout}s ({await self._stored(store)} of "
                f"{len(self.injected)} stored):\n{daemon.output()[-5000:]}"
            )

    async def check(self, store: Store) -> None:
        rows, turn_status, chunks = await read_results(store, "matrix")
        assert len(self.injected) == self.messages
        check_accepted_once(rows, self.injected, kills=self.kills)
        answered, _ = check_turns_once(rows, turn_status)
        received: defaultdict[tuple[str, str], list[MatrixSent]] = defaultdict(list)
        for room in self.rooms:
            for sent in self.proxy.sent:  # messages (the 👀 reactions are no deliveries)
                if sent.room == room and sent.type == "m.room.message":
                    received[room, str(sent.content.get("body", ""))].append(sent)
        check_deliveries(chunks, answered, received, chat="room")


class SignalCrash(CrashScenario):
    """Signal through the fake signal-cli daemon: direct chats with a few people. What the
    daemon wrote to a killed process's stream may be lost (signal-cli forgets a message once
    written); everything else is stored once and answered once."""

    section_name = "signal"
    messages = 60
    kills = 3
    seed = 20261130
    delays_seed = 17
    settle_timeout = 90.0
    USERS = 6

    @staticmethod
    def number(n: int) -> str:
        return f"+1555124{n:04d}"

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        self.signal = await stack.enter_async_context(FakeSignalCli())
        self.injected: dict[str, tuple[str, str]] = {}
        """platform_message_id -> (chat, text)."""
        self._section = {
            "number": self.signal.number,
            "url": self.signal.url,
            "allowed_users": ["*"],
            "min_send_interval": 0,
        }

    def section(self) -> dict[str, Any]:
        return self._section

    async def burst(self, round_: int) -> None:
        for i in range(self.per_round):
            n = round_ * self.per_round + i
            person = self.number(n % self.USERS)
            text = f"message {n}"
            stamp = self.signal.say(person, text)
            self.injected[f"{person}:{person}:{stamp}"] = (person, text)
            await asyncio.sleep(self.rng.uniform(0.0, 0.05))

    def lost(self) -> set[str]:
        """The messages written to a stream whose process was killed (they may be gone)."""
        return {
            f"{e['envelope']['sourceNumber']}:{e['envelope']['sourceNumber']}:"
            f"{e['envelope']['timestamp']}"
            for e in self.signal.lost_with_client
        }

    async def _stored(self, store: Store) -> set[str]:
        async with store.read() as conn:
            found = await conn.execute(
                select(inbox.c.platform_message_id).where(inbox.c.platform == "signal")
            )
        return {str(r[0]) for r in found}

    async def settle(self, store: Store, daemon: Daemon) -> None:
        try:
            async with asyncio.timeout(self.settle_timeout):
                while set(self.injected) - await self._stored(store) - self.lost():
                    await asyncio.sleep(0.2)
            await settle(store, lambda: self.signal.pending == 0, self.settle_timeout)
        except TimeoutError:
            missing = set(self.injected) - await self._stored(store) - self.lost()
            pytest.fail(
                f"not settled in {self.settle_timeout}s ({len(missing)} missing):\n"
                f"{daemon.output()[-5000:]}"
            )

    async def check(self, store: Store) -> None:
        rows, turn_status, chunks = await read_results(store, "signal")
        assert len(self.injected) == self.messages
        stored = {str(r["platform_message_id"]) for r in rows}
        gone = set(self.injected) - stored
        assert gone <= self.lost(), "a message not written to a killed process is missing"
        kept = {k: v for k, v in self.injected.items() if k not in gone}
        check_accepted_once(rows, kept, kills=self.kills)
        answered, _ = check_turns_once(rows, turn_status)
        received: defaultdict[tuple[str, str], list[SignalSent]] = defaultdict(list)
        for sent in self.signal.sent:
            received[sent.chat, sent.text].append(sent)
        check_deliveries(chunks, answered, received, chat="chat")


CRASHES: dict[str, type[CrashScenario]] = {
    "loopback": LoopbackCrash,
    "telegram": TelegramCrash,
    "slack": SlackCrash,
    "discord": DiscordCrash,
    "email": EmailCrash,
    "twilio": TwilioCrash,
    "matrix": MatrixCrash,
    "mattermost": MattermostCrash,
    "signal": SignalCrash,
}
"""Every platform's crash scenario by test id."""
