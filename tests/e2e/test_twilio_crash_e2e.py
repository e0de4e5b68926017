"""Crash safety over Twilio webhooks: `herald run` killed with SIGKILL during bursts of SMS
loses nothing.

Each inbound message is posted to `/webhooks/twilio/sms`, signed, until Herald answers 200 (as
Twilio does with a retrying connection override), and Herald answers only after the inbox
commit; so a process killed between storing a message and answering gets the same MessageSid
again after the restart, and one it never stored comes again too. Messages keep arriving while
the daemon is down. A fake LLM answers `You said: <text>` after a short random delay, so kills
land in the middle of requests, turns, commits and sends. At the end: every message was
answered 200, accepted once and has exactly one outcome, every answered message's reply
reached its number, no message was answered by two turns, and a text that reached a number
twice belongs to a chunk resent after a crash (marked recovered).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

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
    settle,
    you_said,
)
from tests.fakes.llm import FakeLLM
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    FakeTwilioServer,
    Sent,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MESSAGES = 80
NUMBERS = 15
KILLS = 2
SETTLE_TIMEOUT = 150.0
RETRY_PAUSE = (0.1, 2.0)
"""Seconds before a webhook Herald did not answer 200 is posted again: doubling from the first
to the second, jittered (a down daemon is not hammered by every waiting message at once)."""


def number(n: int) -> str:
    return f"+1555300{n:04d}"


class Deliveries:
    """Inbound messages on their way to Herald: each posted until answered 200."""

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
        pause, longest = RETRY_PAUSE
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


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_sigkill_during_bursts_loses_and_duplicates_nothing(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(20261123)
    delays = random.Random(8)
    url = database_url(tmp_path, backend, request)
    async with FakeLLM() as llm, FakeTwilioServer() as twilio:
        llm.responder = you_said(delays)
        section: dict[str, Any] = {
            "account_sid": DEFAULT_ACCOUNT_SID,
            "auth_token": DEFAULT_AUTH_TOKEN,
            "from_number": HERALD_NUMBER,
            "base_url": twilio.base_url,
            "allowed_numbers": ["*"],
            "min_send_interval": 0,
            "status_callbacks": False,
        }
        daemon = crash_daemon(tmp_path, url, llm, {"twilio": section})
        section["public_url"] = daemon.url  # written into the config at each start
        deliveries = Deliveries(twilio)
        deliveries.url = f"{daemon.url}/webhooks/twilio/sms"
        per_round = MESSAGES // KILLS

        async def burst(round_: int) -> None:
            for i in range(per_round):
                n = round_ * per_round + i
                deliveries.inject(number(n % NUMBERS), f"message {n}")
                await asyncio.sleep(rng.uniform(0.0, 0.04))

        try:
            await kill_during_bursts(daemon, rng, KILLS, burst)
            async with Store.open(url, migrate=False) as store:
                try:
                    await settle(store, lambda: not deliveries.pending, SETTLE_TIMEOUT)
                except TimeoutError:
                    missing = len(deliveries.injected) - len(deliveries.answered)
                    pytest.fail(
                        f"not settled in {SETTLE_TIMEOUT}s ({missing} webhooks unanswered):\n"
                        f"{daemon.output()[-5000:]}"
                    )
                await _check(twilio, store, deliveries)
            assert await daemon.stop() == 0
        finally:
            await deliveries.aclose()
            await kill_leftover(daemon)


async def _check(twilio: FakeTwilioServer, store: Store, deliveries: Deliveries) -> None:
    rows, turn_status, chunks = await read_results(store, "twilio")
    assert len(deliveries.injected) == MESSAGES
    assert deliveries.answered == set(deliveries.injected)
    check_accepted_once(rows, deliveries.injected)
    answered, _ = check_turns_once(rows, turn_status)
    received: defaultdict[tuple[str, str], list[Sent]] = defaultdict(list)
    for sent in twilio.sent:
        received[sent.to, sent.body].append(sent)
    check_deliveries(chunks, answered, received, chat="number", check_reply=_from_herald)


def _from_herald(sends: Sequence[Sent]) -> None:
    assert all(s.from_ == HERALD_NUMBER for s in sends)
