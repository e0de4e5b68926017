"""Files a scheduled job's run sends (`send_file`), through the scheduler and the Telegram
adapter against the fake Bot API (SQLite and PostgreSQL): the report text and then the file
reach the home chat, each its own outbox row keyed by (run, target, file); a file over
Telegram's limit is a tool error and nothing is queued; a `[SILENT]` run still sends its
files; a restart while the file waits to go out sends it once and nothing again."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from adapters.telegram.adapter import SEND_FILE_MAX_BYTES
from agent_core.llm import Completion
from agent_core.media.tools import SendFileTool
from agent_core.tools import Tool
from gateway.blobs import Blobs, DatabaseBlobs
from gateway.channels import Channels
from gateway.contracts.adapter import Adapter
from gateway.contracts.history import Role, ToolCall
from gateway.media import ChatFileTargets, StoredFiles
from gateway.store import Store
from gateway.store.blobs import BlobRecords
from gateway.store.inbox import Inbox
from gateway.store.jobs import DeliveryStatus, RunStatus
from gateway.store.tables import outbox
from tests.contract.harness import TelegramHarness, started
from tests.fakes.clock import FakeClock
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.cron_rig import CronRig, ScriptLLM, cron_rig

pytestmark = pytest.mark.timeout(60)

NINE = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
PERSON = TelegramHarness.people[0]
HOME = f"telegram:{PERSON}"
WAIT = 20.0


def send_file(args: dict[str, Any], call_id: str = "call-1") -> Completion:
    """The model's answer calling `send_file` with `args`."""
    return Completion("", tool_calls=(ToolCall(call_id, "send_file", json.dumps(args)),))


def blobs(store: Store, state_dir: Path) -> Blobs:
    """The database's blob store, caching under `state_dir`."""
    records = BlobRecords(store)
    return Blobs(records, DatabaseBlobs(records), state_dir / "cache", max_bytes=10**7)


def file_tools(store: Store) -> Callable[[Channels, Path], list[Tool]]:
    """`send_file` as the daemon builds it: files from the workspace, limits by channel."""

    def tools(channels: Channels, state_dir: Path) -> list[Tool]:
        return [
            SendFileTool(
                ChatFileTargets(channels),
                StoredFiles(Inbox(store), blobs(store, state_dir)),
                roots=[state_dir / "workspace"],
                staging=state_dir / "files" / "outbox",
            )
        ]

    return tools


@pytest.fixture
async def telegram(tmp_path: Path) -> AsyncIterator[tuple[FakeTelegramServer, Adapter]]:
    """The fake Bot API and a connected Telegram adapter."""
    async with started("telegram") as harness:
        assert isinstance(harness, TelegramHarness)
        async with harness.adapter(tmp_path / "tg-files") as adapter:
            yield harness.tg, adapter


def rig(
    store: Store, tmp_path: Path, adapter: Adapter, llm: ScriptLLM
) -> contextlib.AbstractAsyncContextManager[CronRig]:
    """The cron rig with Telegram's chat of PERSON as home and `send_file` for the agent."""
    return cron_rig(
        store,
        tmp_path,
        FakeClock(NINE),
        llm=llm,
        homes=(HOME,),
        platforms=(adapter,),
        tools=file_tools(store),
    )


async def file_rows(store: Store) -> list[dict[str, Any]]:
    """The outbox rows carrying a file, oldest first."""
    async with store.read() as conn:
        rows = await conn.execute(
            select(outbox).where(outbox.c.attachment.is_not(None)).order_by(outbox.c.id)
        )
        return [dict(r) for r in rows.mappings().all()]


def tool_answers(llm: ScriptLLM) -> list[str]:
    """What the tools answered the model, in order."""
    return [m.content for request in llm.requests[-1:] for m in request if m.role is Role.TOOL]


async def test_the_report_then_the_file_reach_the_home_chat(
    store: Store, tmp_path: Path, telegram: tuple[FakeTelegramServer, Adapter]
) -> None:
    tg, adapter = telegram
    llm = ScriptLLM(
        replies={
            "the weekly numbers": [
                send_file(
                    {"content": "week,total\n47,12\n", "filename": "numbers.csv", "caption": "csv"}
                ),
                "Twelve this week; the table follows.",
            ]
        }
    )
    async with rig(store, tmp_path, adapter, llm) as r:
        job = await r.add("the weekly numbers", "every 1d")
        await r.service.run_now(job.id)
        r.scheduler.wake()
        [run] = await r.settled(job.id, 1)
        assert run.status is RunStatus.OK
        assert run.delivery_status is DeliveryStatus.DELIVERED
    [answer] = tool_answers(llm)
    assert answer == f"numbers.csv (17 bytes) will be sent after your report, to {HOME}."
    sent = [s for s in tg.sent if s.chat_id == int(PERSON)]
    # The report, then the file's row: one document with its caption.
    assert [s.method for s in sent] == ["sendMessage", "sendDocument"]
    assert [s.plain_text for s in sent] == [
        f"⏰ {job.name}\n\nTwelve this week; the table follows.",
        "csv",
    ]
    upload = sent[1].upload
    assert upload is not None
    assert (upload.filename, upload.content) == ("numbers.csv", b"week,total\n47,12\n")
    [row] = await file_rows(store)
    assert row["idempotency_key"] == f"job:{run.id}:0:f0"
    assert (row["kind"], row["job_run_id"], row["status"]) == ("report", run.id, "sent")


async def test_a_file_over_the_platform_limit_is_a_tool_error_and_nothing_is_queued(
    store: Store, tmp_path: Path, telegram: tuple[FakeTelegramServer, Adapter]
) -> None:
    tg, adapter = telegram
    workspace = tmp_path / "state" / "workspace"
    workspace.mkdir(parents=True)
    with (workspace / "huge.bin").open("wb") as f:  # sparse: no 50 MB written
        f.truncate(SEND_FILE_MAX_BYTES + 1)
    llm = ScriptLLM(
        replies={"the big export": [send_file({"path": "huge.bin"}), "The export is too big."]}
    )
    async with rig(store, tmp_path, adapter, llm) as r:
        job = await r.add("the big export", "every 1d")
        await r.service.run_now(job.id)
        r.scheduler.wake()
        [run] = await r.settled(job.id, 1)
        assert run.delivery_status is DeliveryStatus.DELIVERED
    [answer] = tool_answers(llm)
    assert answer.startswith("error: ")
    assert f"telegram takes files of at most {SEND_FILE_MAX_BYTES} bytes" in answer
    assert await file_rows(store) == []
    assert not (tmp_path / "state" / "files" / "outbox").exists(), "nothing staged"
    assert tg.texts_in(int(PERSON)) == [f"⏰ {job.name}\n\nThe export is too big."]
    assert all(s.upload is None for s in tg.sent)


async def test_a_silent_run_still_sends_the_files_it_sent(
    store: Store, tmp_path: Path, telegram: tuple[FakeTelegramServer, Adapter]
) -> None:
    tg, adapter = telegram
    llm = ScriptLLM(
        replies={
            "the nightly log": [
                send_file({"content": "all quiet", "filename": "night.log"}),
                "[SILENT]",
            ]
        }
    )
    async with rig(store, tmp_path, adapter, llm) as r:
        job = await r.add("the nightly log", "every 1d")
        await r.service.run_now(job.id)
        r.scheduler.wake()
        [run] = await r.settled(job.id, 1)
        assert run.output == "[SILENT]"
        assert run.delivery_status is DeliveryStatus.DELIVERED, "the file was delivered"
    uploads = [s.upload for s in tg.sent if s.upload is not None]
    assert [(u.filename, u.content) for u in uploads] == [("night.log", b"all quiet")]
    assert [s for s in tg.sent if s.upload is None] == [], "no report text"


async def test_a_restart_while_the_file_waits_sends_it_once_and_nothing_again(
    store: Store, tmp_path: Path, telegram: tuple[FakeTelegramServer, Adapter]
) -> None:
    tg, adapter = telegram
    llm = ScriptLLM(
        replies={
            "the monthly invoice": [
                send_file({"content": "total: 42", "filename": "invoice.txt"}),
                "Invoice attached.",
            ]
        }
    )
    tg.fail("sendDocument", count=10_000, status=500)  # the file cannot go out yet
    async with rig(store, tmp_path, adapter, llm) as r:
        job = await r.add("the monthly invoice", "every 1d")
        await r.service.run_now(job.id)
        r.scheduler.wake()
        await tg.wait_for(lambda: len(tg.texts_in(int(PERSON))) == 1, WAIT)
        async with asyncio.timeout(WAIT):
            while not any(row["attempts"] >= 1 for row in await file_rows(store)):
                await asyncio.sleep(0.01)
    # Stopped with the report sent and the file not: the run is over, its file waits.
    [run] = await r.runs(job.id)
    assert (run.status, run.delivery_status) == (RunStatus.OK, DeliveryStatus.PENDING)
    tg.clear_faults()
    again = ScriptLLM()
    async with rig(store, tmp_path, adapter, again) as r:
        [run] = await r.settled(job.id, 1)
        assert run.delivery_status is DeliveryStatus.DELIVERED
        await r.at(NINE)  # another look: nothing is run or queued again
        assert again.calls == []
        assert len(await r.runs(job.id)) == 1
    sent = [s for s in tg.sent if s.chat_id == int(PERSON)]
    assert [s.upload is None for s in sent] == [True, False]
    assert tg.texts_in(int(PERSON))[0] == f"⏰ {job.name}\n\nInvoice attached."
    [row] = await file_rows(store)
    assert (row["idempotency_key"], row["status"]) == (f"job:{run.id}:0:f0", "sent")
    uploads = [s.upload for s in sent if s.upload is not None]
    assert [(u.filename, u.content) for u in uploads] == [("invoice.txt", b"total: 42")]
