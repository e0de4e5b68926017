"""A model outage under `herald run`: Telegram at its fake, the model at an address where
nothing listens. Messages from several people keep arriving; the process stays up and
ready, each person is told once, and when the model comes up on that address every message
is answered exactly once, in order. SIGTERM then exits 0, and the log holds the outage once,
without a traceback.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gateway.store import Store
from gateway.store.tables import inbox
from tests.e2e.daemon import Daemon, free_port
from tests.fakes.llm import FakeLLM, last_user_text
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.test_model_failures import OUTAGE_NOTICE, llm_section, sessions_section

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "123456:outage-token"
PEOPLE = (1001, 1002, 1003, 1004)
"""Allowed people; each one's direct chat id is their user id."""
MESSAGES = 5
"""Per person."""
WAIT = 30.0


async def metric(client: httpx.AsyncClient, daemon: Daemon, name: str) -> float:
    """The value of one sample of `/metrics` (0 when absent)."""
    text = (await client.get(f"{daemon.url}/metrics")).text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_messages_wait_out_a_model_outage_and_are_answered_once(tmp_path: Path) -> None:
    llm_port = free_port()
    async with FakeTelegramServer(TOKEN) as tg:
        telegram: dict[str, Any] = {
            "token": TOKEN,
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "allowed_users": [str(p) for p in PEOPLE],
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
        }
        daemon = Daemon(
            tmp_path / "state",
            {
                "platforms": {"telegram": telegram},
                "llm": llm_section(llm_port),
                "sessions": sessions_section(),
            },
        )
        await daemon.start()
        try:
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                # Everyone's first message meets the outage, and everyone is told. (A message
                # arriving while the first try still runs would get the usual "still working"
                # acknowledgement: Herald cannot know yet.)
                for person in PEOPLE:
                    tg.inject_message(person, "message 0", sender_id=person)
                for person in PEOPLE:
                    await tg.wait_for(texts_in(tg, person, 1), timeout=WAIT)
                # Then a stream of messages, interleaved between people, over about two seconds.
                for n in range(1, MESSAGES):
                    for person in PEOPLE:
                        tg.inject_message(person, f"message {n}", sender_id=person)
                    await asyncio.sleep(0.4)
                    assert daemon.process is not None
                    assert daemon.process.returncode is None
                async with Store.open(daemon.database_url, migrate=False) as store:
                    await until(lambda: _stored(store, len(PEOPLE) * MESSAGES))

                # The retries go on, and nobody is told twice.
                failures = 'herald_model_failures_total{kind="unreachable"}'
                seen = await metric(client, daemon, failures)
                await until(lambda: _at_least(client, daemon, failures, seen + 2 * len(PEOPLE)))
                for person in PEOPLE:
                    texts = tg.texts_in(person)
                    assert len(texts) == 1, texts
                    assert OUTAGE_NOTICE in texts[0]
                health = (await client.get(f"{daemon.url}/health")).json()
                assert health["status"] == "ok"
                assert health["llm"]["state"] == "unreachable"
                assert (await client.get(f"{daemon.url}/ready")).status_code == 200
                assert daemon.process is not None
                assert daemon.process.returncode is None

                async with FakeLLM(port=llm_port) as llm:
                    expected = [f"You said: message {n}" for n in range(MESSAGES)]
                    for person in PEOPLE:
                        await tg.wait_for(texts_in(tg, person, 1 + MESSAGES), timeout=WAIT)
                        assert tg.texts_in(person)[1:] == expected
                    async with Store.open(daemon.database_url, migrate=False) as store:
                        await until(lambda: _all_answered(store))
                    asked = Counter(last_user_text(body) for body in llm.requests)
                    assert asked == Counter({f"message {n}": len(PEOPLE) for n in range(MESSAGES)})
                    assert (await client.get(f"{daemon.url}/health")).json()["llm"]["state"] == "ok"
            assert await daemon.stop() == 0
        finally:
            if daemon.process is not None and daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()
    for person in PEOPLE:
        assert len(tg.texts_in(person)) == 1 + MESSAGES  # nothing more after the answers
    log = daemon.output()
    assert "Traceback" not in log, log[-5000:]
    # The outage is the one error logged, once (not once per retry), and its end once.
    [error] = [line for line in log.splitlines() if re.search(r" (ERROR|CRITICAL) ", line)]
    assert "the model endpoint is unreachable" in error
    assert log.count("the model endpoint answers again") == 1


def texts_in(tg: FakeTelegramServer, chat: int, count: int) -> Callable[[], bool]:
    """Whether Herald sent at least `count` messages to `chat`."""
    return lambda: len(tg.texts_in(chat)) >= count


async def until(check: Callable[[], Awaitable[bool]], timeout: float = WAIT) -> None:
    """Poll the async condition `check()` every 50 ms until it holds (TimeoutError)."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def _stored(store: Store, count: int) -> bool:
    """Whether `count` messages are stored, none of them with an outcome yet."""
    rows = await _rows(store)
    assert all(r["outcome"] is None for r in rows), rows
    return len(rows) >= count


async def _all_answered(store: Store) -> bool:
    rows = await _rows(store)
    return len(rows) == len(PEOPLE) * MESSAGES and all(r["outcome"] == "answered" for r in rows)


async def _rows(store: Store) -> list[dict[str, Any]]:
    async with store.read() as conn:
        return [dict(r) for r in (await conn.execute(select(inbox))).mappings().all()]


async def _at_least(client: httpx.AsyncClient, daemon: Daemon, name: str, value: float) -> bool:
    return await metric(client, daemon, name) >= value
