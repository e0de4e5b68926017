"""SQLite on a disk that really fills up: `herald run` keeps its database on a small tmpfs,
Telegram messages keep coming, and a file takes the last free byte. Herald stops confirming
updates (Telegram keeps them), says so in `/health`, `/ready` and the log, and keeps running
(the same process: no crash loop). Once the file is gone it resumes by itself: every update
is confirmed, every message stored once and answered once.

Mounting needs root; without it the test is skipped (tests/integration/test_store_full.py
covers the same behaviour with a simulated full disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from gateway.store import Store
from gateway.store.tables import inbox
from tests.e2e.crash import crash_daemon, kill_leftover, you_said
from tests.e2e.crash_platforms import TelegramCrash
from tests.fakes.llm import FakeLLM
from tests.services import require_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SIZE = "12m"
TEXT = "x" * 3500
"""Long messages fill the database's write-ahead log quickly."""


@contextlib.contextmanager
def small_disk(path: Path) -> Iterator[Path]:
    """A tmpfs of `SIZE` mounted at `path`; skips the test when it cannot be mounted (fails
    it under HERALD_REQUIRE_SERVICES=1: CI runs as root)."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        require_service("a small tmpfs (mount -t tmpfs, as root)", mounted.stderr.strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """A file taking every free byte of the filesystem at `path`."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 1 << 12, 1):  # big writes, then the last bytes
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size) == size:
                    pass
    finally:
        os.close(fd)
    return filler


class Filling(TelegramCrash):
    messages = 40
    kills = 1
    settle_timeout = 120.0


async def health(daemon_url: str) -> tuple[dict[str, object], int]:
    async with httpx.AsyncClient(timeout=10) as http:
        body = (await http.get(f"{daemon_url}/health")).json()
        ready = (await http.get(f"{daemon_url}/ready")).status_code
    return body, ready


async def test_a_full_disk_pauses_herald_and_space_resumes_it(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        url = f"sqlite+aiosqlite:///{disk / 'herald.db'}"
        crash = Filling()
        async with contextlib.AsyncExitStack() as stack:
            llm = await stack.enter_async_context(FakeLLM())
            llm.responder = you_said(random.Random(3))
            await crash.start(stack)
            daemon = crash_daemon(tmp_path, url, llm, {"telegram": crash.section()})
            try:
                await daemon.start()
                assert daemon.process is not None
                pid = daemon.process.pid
                filler = fill(disk)
                tg = crash.tg
                # Messages keep coming until the database cannot take them.
                sent = 0
                async with asyncio.timeout(90):
                    while True:
                        user = 1001 + sent % 5
                        tg.inject_message(user, f"{TEXT} {sent}", sender_id=user)
                        sent += 1
                        body, ready = await health(daemon.url)
                        if body["status"] == "degraded":
                            break
                        await asyncio.sleep(0.05)
                # Said in /health, /ready and the log; Telegram keeps what was not stored.
                body, ready = await health(daemon.url)
                assert "disk full" in str(body["store"]), body
                assert ready == 503
                for n in range(5):
                    tg.inject_message(1002, f"while full {n}", sender_id=1002)
                async with asyncio.timeout(60):
                    while not tg.pending:
                        await asyncio.sleep(0.1)
                assert "refuses writes (disk full" in daemon.output()
                assert daemon.process.returncode is None  # running, not crash-looping

                filler.unlink()  # space again: Herald resumes by itself
                async with asyncio.timeout(90):
                    while (await health(daemon.url))[1] != 200:
                        await asyncio.sleep(0.2)
                async with Store.open(url, migrate=False) as store:
                    await crash.settle(store, daemon)
                    rows = await _rows(store)
                assert daemon.process.pid == pid
                assert len({r[0] for r in rows}) == len(rows)  # each stored once
                texts = {r[1] for r in rows}
                assert all(f"while full {n}" in texts for n in range(5))
                assert len(rows) == sent + 5
                answered = [r for r in rows if r[2] == "answered"]
                assert len(answered) == len(rows), rows[:3]
                assert "takes writes again" in daemon.output()
                assert await daemon.stop() == 0
            finally:
                await kill_leftover(daemon)


async def _rows(store: Store) -> list[tuple[str, str, str]]:
    """(platform message id, text, outcome) of every stored message."""
    async with store.read() as conn:
        result = await conn.execute(
            select(inbox.c.platform_message_id, inbox.c.text, inbox.c.outcome)
        )
        return [(str(a), str(b), str(c)) for a, b, c in result.all()]
