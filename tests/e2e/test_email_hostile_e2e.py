"""Hostile mail against `herald run`: a stranger's huge mails cost a header fetch, an allowed
person's mail over the limits is refused unread, and after SIGKILL none of them is fetched or
read again (a restart is as quick as ever and the next mail is answered at once).

Before the fix the 450,000-character line alone held the event loop for about 37 s (on every
start, as long as the mail stayed unread), so `/health` and every other chat waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from gateway.store import Store
from gateway.store.tables import inbox
from tests.e2e.crash import crash_daemon, kill_leftover
from tests.fakes.dovecot import Dovecot
from tests.fakes.llm import FakeLLM
from tests.fakes.smtp_server import SmtpServer
from tests.integration.test_email import ANN, long_line_mail, mail, many_parts_mail, to

pytestmark = pytest.mark.timeout(120)

BOUND = 20.0
"""Seconds for a start plus one answer on a loaded machine; reading the hostile mails took
over 40 s before."""


async def _health_within(url: str, seconds: float) -> None:
    async with httpx.AsyncClient(timeout=seconds, trust_env=False) as client:
        assert (await client.get(f"{url}/health")).status_code == 200


async def test_hostile_mail_is_read_at_most_once_across_sigkill(tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        dovecot = await stack.enter_async_context(Dovecot())
        smtp = await stack.enter_async_context(SmtpServer())
        section = dovecot.section(**smtp.section(), allowed_senders=[ANN], idle_renew=30, timeout=5)
        hostile = [
            long_line_mail("eve@elsewhere.test"),
            many_parts_mail("eve@elsewhere.test"),
            long_line_mail(f"Ann <{ANN}>"),
            many_parts_mail(ANN),
        ]
        uids = [await dovecot.append(data) for data, _ in hostile]
        daemon = crash_daemon(
            tmp_path,
            f"sqlite+aiosqlite:///{tmp_path / 'state' / 'herald.db'}",
            llm,
            {"email": section},
        )
        daemon.settings["log_level"] = "DEBUG"  # the IMAP commands are in the log
        try:
            started = time.monotonic()
            await daemon.start()
            data, _ = mail("first")
            await dovecot.append(data)
            await _health_within(daemon.url, BOUND)
            await smtp.wait_for_mail(to(ANN), timeout=BOUND)
            assert time.monotonic() - started < 2 * BOUND

            async def all_seen() -> bool:
                flags = await dovecot.flags()
                return len(flags) == 5 and all("\\Seen" in f for f in flags.values())

            async with asyncio.timeout(BOUND):
                while not await all_seen():
                    await asyncio.sleep(0.1)
            daemon.signal(signal.SIGKILL)
            await daemon.wait()
            first_run = daemon.output()

            data, _ = mail("second")
            second_uid = await dovecot.append(data)
            await daemon.start()
            async with asyncio.timeout(BOUND):
                await _health_within(daemon.url, BOUND)
                await smtp.wait_for_mail(lambda r: "second" in r.text, timeout=BOUND)
            second_run = daemon.output()[len(first_run) :]
            fetched = {int(u) for u in re.findall(r"UID FETCH (\d+) ", second_run)}
            assert second_uid in fetched  # the log shows every fetch
            assert fetched.isdisjoint(uids), fetched  # nothing hostile is fetched again

            async with (
                Store.open(daemon.database_url, migrate=False) as store,
                store.read() as conn,
            ):
                rows = (await conn.execute(select(inbox))).mappings().all()
            outcomes = {r["platform_message_id"]: r["outcome"] for r in rows}
            assert len(rows) == 6  # each mail stored once
            for _, key in hostile:
                assert outcomes[key] == "rejected"
            assert await daemon.stop() == 0
        finally:
            await kill_leftover(daemon)
