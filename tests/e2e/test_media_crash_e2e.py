"""A SIGKILL between the text of a reply and its file (`send_file`) under `herald run`: after
the restart the file goes out once and the text is not sent again (each is its own outbox
row with its own idempotency key). The same between a voice reply and the text that follows
it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agent_core.media.speech import is_ogg_opus
from gateway.store import Store
from gateway.store.tables import outbox
from tests.e2e.daemon import Daemon
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.speech import FakeSpeech
from tests.fakes.telegram import FakeTelegramServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

TOKEN = "123456:media-crash-token"
PERSON = 4242
WAIT = 30.0


async def until(check: Callable[[], Awaitable[bool]], timeout: float = WAIT) -> None:
    """Poll `check` every 50 ms until it holds (TimeoutError after `timeout` seconds)."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def _file_row(database_url: str) -> dict[str, Any] | None:
    async with Store.open(database_url, migrate=False) as store, store.read() as conn:
        rows = (
            (await conn.execute(select(outbox).where(outbox.c.attachment.is_not(None))))
            .mappings()
            .all()
        )
    return dict(rows[0]) if rows else None


async def test_sigkill_between_text_and_file_resends_neither_twice(tmp_path: Path) -> None:
    async with FakeTelegramServer(TOKEN) as tg, FakeLLM() as llm:
        telegram = {
            "token": TOKEN,
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "allowed_users": [str(PERSON)],
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
        }
        daemon = Daemon(
            tmp_path / "state",
            {
                "platforms": {"telegram": telegram},
                "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
                "delivery": {"backoff_initial": 0.2, "backoff_max": 0.5},
                "sessions": {"drain_timeout": 1},
                "instance_id": "herald-media",  # the restart takes its own work back at once
            },
        )
        (tmp_path / "state").mkdir()
        llm.script(
            Reply(tool_calls=[("send_file", {"content": "the report", "filename": "r.txt"})]),
            Reply(text="here it is"),
        )
        tg.fail("sendDocument", count=10_000, status=500)  # the file cannot go out yet
        await daemon.start()
        try:
            tg.inject_message(PERSON, "send me the report", sender_id=PERSON)
            await tg.wait_for(lambda: tg.texts_in(PERSON) == ["here it is"], WAIT)

            async def file_tried() -> bool:
                row = await _file_row(daemon.database_url)
                return row is not None and row["attempts"] >= 1 and row["status"] == "pending"

            await until(file_tried)
            daemon.signal(signal.SIGKILL)
            await daemon.wait()

            tg.clear_faults()
            await daemon.start()
            await tg.wait_for_sent(lambda s: s.upload is not None, WAIT)
            row = await _file_row(daemon.database_url)
            assert row is not None
            await until(lambda: _sent(daemon.database_url))
            assert await daemon.stop() == 0
        finally:
            if daemon.process is not None and daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()
        assert [s.plain_text for s in tg.sent if s.upload is None] == ["here it is"]
        uploads = [s.upload for s in tg.sent if s.upload is not None]
        assert [(u.filename, u.content) for u in uploads] == [("r.txt", b"the report")]


async def _sent(database_url: str) -> bool:
    async with Store.open(database_url, migrate=False) as store, store.read() as conn:
        rows = (await conn.execute(select(outbox.c.status, outbox.c.recovered))).all()
    return len(rows) == 2 and all(s == "sent" and not r for s, r in rows)


async def test_sigkill_between_voice_reply_and_its_text_sends_each_once(tmp_path: Path) -> None:
    async with FakeTelegramServer(TOKEN) as tg, FakeLLM() as llm, FakeSpeech() as speech:
        telegram = {
            "token": TOKEN,
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "allowed_users": [str(PERSON)],
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
        }
        daemon = Daemon(
            tmp_path / "state",
            {
                "platforms": {"telegram": telegram},
                "llm": {
                    "base_url": llm.base_url,
                    "api_key": "k",
                    "memory_pass": False,
                    "transcription": {"base_url": llm.base_url},
                },
                "speech": {"base_url": speech.base_url, "max_chars": 60},
                "delivery": {"backoff_initial": 0.2, "backoff_max": 0.5},
                "sessions": {"drain_timeout": 1},
                "instance_id": "herald-voice",
            },
        )
        (tmp_path / "state").mkdir()
        llm.script(Reply(text="This part is spoken aloud.\n\n" + "And this part is read. " * 50))
        tg.fail("sendMessage", count=10_000, status=500)  # the text after the voice waits
        await daemon.start()
        try:
            note = tg.add_file(b"OggS" + b"\x00" * 100, file_name="v.ogg", mime_type="audio/ogg")
            tg.inject_message(PERSON, "", sender_id=PERSON, voice=note)
            await tg.wait_for_sent(lambda s: s.method == "sendVoice", WAIT)

            async def text_tried() -> bool:
                rows = await _rows(daemon.database_url)
                return any(
                    r["attachment"] is None and r["attempts"] >= 1 and r["status"] == "pending"
                    for r in rows
                )

            await until(text_tried)
            daemon.signal(signal.SIGKILL)
            await daemon.wait()

            tg.clear_faults()
            await daemon.start()
            await tg.wait_for_sent(lambda s: s.method == "sendMessage", WAIT)

            async def all_sent() -> bool:
                rows = await _rows(daemon.database_url)
                return len(rows) == 2 and all(r["status"] == "sent" for r in rows)

            await until(all_sent)
            assert await daemon.stop() == 0
        finally:
            if daemon.process is not None and daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()
        voices = [s for s in tg.sent if s.method == "sendVoice"]
        assert len(voices) == 1
        assert voices[0].upload is not None
        assert is_ogg_opus(voices[0].upload.content)
        assert voices[0].plain_text == "This part is spoken aloud."
        assert [s.plain_text for s in tg.sent if s.method == "sendMessage"] == [
            ("And this part is read. " * 50).strip()
        ]
        assert speech.said == ["This part is spoken aloud."]


async def _rows(database_url: str) -> list[dict[str, Any]]:
    async with Store.open(database_url, migrate=False) as store, store.read() as conn:
        rows = (await conn.execute(select(outbox).order_by(outbox.c.id))).mappings().all()
    return [dict(r) for r in rows]
