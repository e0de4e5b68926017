"""Crash safety over email: `herald run` killed with SIGKILL between receiving mail and
answering it loses nothing and answers nothing twice.

A real Dovecot holds the mailbox and a real SMTP server (aiosmtpd) records the replies. Mail
keeps arriving (IMAP APPEND) while the daemon runs and while it is down; a fake LLM answers
`You said: <text>` after a short random delay, so kills land between the fetch, the inbox
commit, the `\\Seen` flag, the watermark, the turn and the SMTP send. At the end: every mail is
flagged on the server, was accepted once and has one outcome, its reply reached its sender
once (or more only when resent after a crash, marked recovered), threaded to it.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Sequence
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path

import pytest

from gateway.contracts.messages import utcnow
from gateway.store import Store
from tests.e2e.crash import (
    check_accepted_once,
    check_deliveries,
    check_turns_once,
    crash_daemon,
    database_url,
    kill_during_bursts,
    kill_leftover,
    read_results,
    work_left,
    you_said,
)
from tests.fakes.dovecot import USER, Dovecot
from tests.fakes.llm import FakeLLM
from tests.fakes.smtp_server import Received, SmtpServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MESSAGES = 36
SENDERS = 8
KILLS = 3
SETTLE_TIMEOUT = 120.0


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


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_sigkill_between_receipt_and_reply_answers_every_mail_once(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(20261124)
    delays = random.Random(11)
    url = database_url(tmp_path, backend, request)
    async with FakeLLM() as llm, Dovecot() as dovecot, SmtpServer() as smtp:
        llm.responder = you_said(delays)
        email = dovecot.section(
            **smtp.section(), allowed_senders=["@example.com"], idle_renew=30, timeout=5
        )
        daemon = crash_daemon(tmp_path, url, llm, {"email": email})
        injected: dict[str, tuple[str, str]] = {}
        """Message-ID -> (sender, text)."""
        per_round = MESSAGES // KILLS

        async def burst(round_: int) -> None:
            for i in range(per_round):
                n = round_ * per_round + i
                sender = f"user{n % SENDERS}@example.com"
                text = f"message {n}"
                data, message_id = mail(sender, text)
                await dovecot.append(data)
                injected[message_id] = (sender, text)
                await asyncio.sleep(rng.uniform(0.0, 0.1))

        try:
            await kill_during_bursts(daemon, rng, KILLS, burst)
            async with Store.open(url, migrate=False) as store:
                try:
                    await _settle(dovecot, store)
                except TimeoutError:
                    pytest.fail(f"not settled in {SETTLE_TIMEOUT}s:\n{daemon.output()[-5000:]}")
                await _check(smtp, store, injected)
            assert await daemon.stop() == 0
        finally:
            await kill_leftover(daemon)


async def _settle(dovecot: Dovecot, store: Store) -> None:
    """Wait until every mail on the server is flagged and no work is left (polled)."""
    async with asyncio.timeout(SETTLE_TIMEOUT):
        while True:
            flags = await dovecot.flags()
            seen = len(flags) == MESSAGES and all("\\Seen" in f for f in flags.values())
            if seen and not await work_left(store):
                return
            await asyncio.sleep(0.2)


async def _check(smtp: SmtpServer, store: Store, injected: dict[str, tuple[str, str]]) -> None:
    rows, turn_status, chunks = await read_results(store, "email")
    assert len(injected) == MESSAGES
    check_accepted_once(rows, injected)
    answered, _ = check_turns_once(rows, turn_status)
    received: defaultdict[tuple[str, str], list[Received]] = defaultdict(list)
    for r in smtp.received:
        received[r.rcpt_tos[0], r.text].append(r)
    by_text = {text: message_id for message_id, (_, text) in injected.items()}

    def threaded(sends: Sequence[Received]) -> None:
        for sent in sends:
            asked = by_text[sent.text.removeprefix("You said: ")]
            assert sent.header("In-Reply-To") == f"<{asked}>"
            assert sent.header("Subject") == f"Re: {sent.text.removeprefix('You said: ')}"

    check_deliveries(chunks, answered, received, chat="mailbox", check_reply=threaded)
