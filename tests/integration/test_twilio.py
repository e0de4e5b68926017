"""The Twilio adapter in the running daemon, against the fake Twilio (the twilio SDK unmodified)
and a fake LLM: what a person texting the agent sees."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.contracts.ids import AccountId, ChatId
from gateway.store.outbox import Chunk, Outbox, OutboxKind, OutboxStatus, Target
from tests.e2e.daemon import free_port
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    WHATSAPP_NUMBER,
    FakeTwilioServer,
)
from tests.integration.inproc import Herald, running_daemon

pytestmark = pytest.mark.timeout(90)

ANN = "+15551234567"
BOB = "+15557654321"
ANN_WA = f"whatsapp:{ANN}"


@pytest.fixture
async def twilio() -> AsyncIterator[FakeTwilioServer]:
    async with FakeTwilioServer() as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@contextlib.asynccontextmanager
async def running_herald(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM, **changes: Any
) -> AsyncIterator[Herald]:
    port = free_port()
    section: dict[str, Any] = {
        "account": "main",
        "account_sid": DEFAULT_ACCOUNT_SID,
        "auth_token": DEFAULT_AUTH_TOKEN,
        "from_number": HERALD_NUMBER,
        "whatsapp_from": WHATSAPP_NUMBER,
        "public_url": f"http://127.0.0.1:{port}",
        "base_url": twilio.base_url,
        "allowed_numbers": [ANN, BOB],
        "min_send_interval": 0,
    }
    section.update(changes)
    async with running_daemon(tmp_path, llm, "twilio", section, port=port) as herald:
        yield herald


def webhook(herald: Herald, path: str = "sms") -> str:
    return f"{herald.url}/webhooks/twilio/{path}"


async def test_sms_round_trip(tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM) -> None:
    llm.responder = lambda body: Reply(text="Sure: **bold** plan, see [docs](https://d.example).")
    async with running_herald(tmp_path, twilio, llm) as herald:
        form = twilio.message_form(ANN, "hello there")
        answer = await twilio.post_form(webhook(herald), form)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/xml")
        assert "<Response/>" in answer.text  # empty TwiML: the reply goes by REST
        [sent] = await twilio.wait_for_sent(1)
        assert (sent.to, sent.from_) == (ANN, HERALD_NUMBER)
        assert sent.body == "Sure: bold plan, see docs (https://d.example)."
        assert sent.status_callback == f"{herald.url}/webhooks/twilio/status"
        rows = await herald.answered(1)
        sid = dict(form)["MessageSid"]
        assert [(r["platform_message_id"], r["outcome"]) for r in rows] == [(sid, "answered")]
        assert rows[0]["session_key"] == f"twilio:main:{ANN}"
        # The fake reports `sent`, then `delivered`, and the chunk's receipt says so.
        outbox = Outbox(herald.store)

        async def delivered() -> bool:
            rows = await outbox.list()
            return [r.receipt for r in rows] == ["delivered"]

        await herald.until(delivered)
        [row] = await outbox.list()
        assert row.platform_message_id == sent.sid


async def test_a_long_answer_goes_out_in_ordered_parts(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM
) -> None:
    sentences = [f"Sentence number {i} of the long answer is here." for i in range(110)]
    answer = " ".join(sentences[:40]) + "\n\n" + " ".join(sentences[40:])
    assert len(answer) >= 5000
    llm.responder = lambda body: Reply(text=answer)
    async with running_herald(tmp_path, twilio, llm) as herald:
        await twilio.post_inbound(webhook(herald), ANN, "tell me everything")
        await twilio.wait_for(lambda: "number 109 " in "".join(twilio.bodies(ANN)), 20)
        bodies = twilio.bodies(ANN)
        assert len(bodies) >= 4
        assert all(len(b) <= 1600 for b in bodies)
        assert all(b.endswith(".") for b in bodies)  # cut at sentence or paragraph ends
        assert " ".join(bodies).split() == answer.split()  # every word, in order


@pytest.mark.parametrize("signing", ["wrong", "none", "other_url"])
async def test_bad_or_missing_signatures_are_refused_and_nothing_is_stored(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM, signing: str
) -> None:
    async with running_herald(tmp_path, twilio, llm) as herald:
        form = twilio.message_form(ANN, "let me in")
        if signing == "other_url":
            answer = await twilio.post_form(
                webhook(herald), form, signed_url="https://elsewhere.example/webhooks/twilio/sms"
            )
        else:
            answer = await twilio.post_form(webhook(herald), form, signing=signing)  # type: ignore[arg-type]
        assert answer.status_code == 403
        # A status callback with a bad signature changes nothing either.
        status = [("MessageSid", "SM1"), ("MessageStatus", "failed")]
        assert (
            await twilio.post_form(webhook(herald, "status"), status, signing="wrong")
        ).status_code == 403
        # A good request afterwards is answered: the refused one never reached the inbox.
        await twilio.post_inbound(webhook(herald), ANN, "now properly")
        rows = await herald.answered(1)
        assert [r["text"] for r in rows] == ["now properly"]
        assert len(llm.requests) == 1


async def test_stop_then_a_scheduled_delivery_is_not_sent(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, twilio, llm) as herald:
        form = twilio.message_form(ANN, "STOP")
        answer = await twilio.post_form(webhook(herald), form)
        assert answer.status_code == 200
        [row] = await herald.answered(1)
        assert row["outcome"] == "dropped"
        assert "opt-out" in row["outcome_detail"]
        assert row["turn_id"] is None
        assert llm.requests == []  # the agent is not asked to answer a STOP
        # A scheduled report for that number (what cron writes) is dead-lettered, never sent.
        outbox = Outbox(herald.store)
        target = Target("twilio", AccountId("main"), ChatId(ANN))
        [report_id] = await outbox.enqueue(
            [Chunk("cron:daily:1", target, "Your **daily** report", kind=OutboxKind.REPORT)]
        )
        # Bob did not opt out: his report goes out.
        bob = Target("twilio", AccountId("main"), ChatId(BOB))
        [bob_id] = await outbox.enqueue(
            [Chunk("cron:daily:2", bob, "Bob's report", kind=OutboxKind.REPORT)]
        )

        async def settled() -> bool:
            rows = [await outbox.get(report_id), await outbox.get(bob_id)]
            return all(r is not None and r.status in ("dead", "sent") for r in rows)

        await herald.until(settled)
        report = await outbox.get(report_id)
        assert report is not None
        assert report.status is OutboxStatus.DEAD
        assert "opted out" in (report.last_error or "")
        assert twilio.bodies(ANN) == []
        assert twilio.bodies(BOB) == ["Bob's report"]
        # Messages from the number still reach the agent; its answers are not sent.
        await twilio.post_inbound(webhook(herald), ANN, "are you there?")
        await herald.answered(2)

        async def dead_reply() -> bool:
            return any(
                r.kind is OutboxKind.REPLY and r.status is OutboxStatus.DEAD
                for r in await outbox.list()
            )

        await herald.until(dead_reply)
        assert twilio.bodies(ANN) == []


async def test_start_after_stop_allows_sending_again(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, twilio, llm) as herald:
        await twilio.post_inbound(webhook(herald), ANN, "Stop")
        await herald.answered(1)
        await twilio.post_inbound(webhook(herald), ANN, "START")
        await twilio.post_inbound(webhook(herald), ANN, "help")
        rows = await herald.answered(3)
        assert [r["outcome"] for r in rows] == ["dropped"] * 3
        assert "opt-in" in rows[1]["outcome_detail"]
        assert "help" in rows[2]["outcome_detail"]
        assert llm.requests == []
        await twilio.post_inbound(webhook(herald), ANN, "back again")
        await twilio.wait_for_sent(1)
        assert twilio.bodies(ANN) == ["You said: back again"]


async def test_mms_media_reach_the_agent(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM
) -> None:
    photo = b"\xff\xd8\xff\xe0" + b"jpeg" * 1000
    async with running_herald(tmp_path, twilio, llm) as herald:
        await twilio.post_inbound(
            webhook(herald), ANN, "look at this", media=[(photo, "image/jpeg")]
        )
        [row] = await herald.answered(1)
        assert len(twilio.media_fetches) == 1
        payload = row["payload"]
        [attachment] = payload["attachments"]
        assert (await herald.kept_files())[attachment["blob"]] == photo
        assert attachment["mime_type"] == "image/jpeg"
        prompt = str(llm.requests[-1]["messages"])
        assert "look at this" in prompt
        assert "image/jpeg" in prompt


async def test_whatsapp_round_trip(tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM) -> None:
    llm.responder = lambda body: Reply(text="Here is **bold**, _italic_ and `code`.")
    async with running_herald(tmp_path, twilio, llm) as herald:
        await twilio.post_inbound(webhook(herald, "whatsapp"), ANN_WA, "hi on whatsapp")
        [sent] = await twilio.wait_for_sent(1)
        assert (sent.to, sent.from_) == (ANN_WA, WHATSAPP_NUMBER)
        assert sent.body == "Here is *bold*, _italic_ and ```code```."
        [row] = await herald.answered(1)
        assert row["session_key"] == f"twilio:main:whatsapp%3A{ANN}"
        assert row["sender_name"] == "Ann"


async def test_a_status_callback_marks_a_failed_delivery(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM
) -> None:
    twilio.undeliverable(BOB, code=30003)
    async with running_herald(tmp_path, twilio, llm) as herald:
        await twilio.post_inbound(webhook(herald), BOB, "are you there?")
        [sent] = await twilio.wait_for_sent(1)
        outbox = Outbox(herald.store)

        async def failed() -> bool:
            return [r.receipt for r in await outbox.list()] == ["failed"]

        await herald.until(failed)
        await twilio.wait_for(lambda: [c.status for c in twilio.callbacks] == ["sent", "failed"])
        assert {c.answer for c in twilio.callbacks} == {200}
        [row] = await outbox.list()
        assert row.status is OutboxStatus.SENT  # Twilio took it; the handset never got it
        assert row.platform_message_id == sent.sid
        assert "30003" in (row.last_error or "")


async def test_429_is_retried(tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM) -> None:
    twilio.rate_limit(2, retry_after=0.3)
    async with running_herald(tmp_path, twilio, llm) as herald:
        await twilio.post_inbound(webhook(herald), ANN, "busy line")
        [sent] = await twilio.wait_for_sent(1)
        assert sent.body == "You said: busy line"
        assert [r.status for r in twilio.refused] == [429, 429]
        async with asyncio.timeout(10):  # the fake saw the send before Herald stored it
            while (row := (await Outbox(herald.store).list())[0]).status is not OutboxStatus.SENT:
                await asyncio.sleep(0.01)
        assert row.attempts == 1  # waiting out a rate limit does not use up tries


async def test_permanent_errors_are_dead_lettered(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM
) -> None:
    twilio.reject(BOB, code=21211)
    async with running_herald(tmp_path, twilio, llm) as herald:
        await twilio.post_inbound(webhook(herald), BOB, "hello")
        outbox = Outbox(herald.store)

        async def dead() -> bool:
            return [r.status for r in await outbox.list()] == [OutboxStatus.DEAD]

        await herald.until(dead)
        [row] = await outbox.list()
        assert row.attempts == 1
        assert "21211" in (row.last_error or "")


async def test_stop_then_a_real_scheduled_job_skips_that_number_only(
    tmp_path: Path, twilio: FakeTwilioServer, llm: FakeLLM
) -> None:
    start = datetime(2026, 11, 23, 7, 0, tzinfo=UTC)
    nine = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
    clock = FakeClock(start)
    port = free_port()
    section: dict[str, Any] = {
        "account_sid": DEFAULT_ACCOUNT_SID,
        "auth_token": DEFAULT_AUTH_TOKEN,
        "from_number": HERALD_NUMBER,
        "public_url": f"http://127.0.0.1:{port}",
        "base_url": twilio.base_url,
        "allowed_numbers": [ANN, BOB],
        "min_send_interval": 0,
    }
    extra = {
        "api": {"host": "127.0.0.1", "port": port, "key": "k"},
        "cron": {"poll_interval": 0.1},
    }
    async with (
        running_daemon(
            tmp_path, llm, "twilio", section, port=port, extra=extra, cron_clock=clock
        ) as herald,
        httpx.AsyncClient(
            base_url=herald.url, headers={"Authorization": "Bearer k"}, trust_env=False
        ) as api,
    ):
        await twilio.post_form(webhook(herald), twilio.message_form(ANN, "STOP"))
        await herald.answered(1)
        created = await api.post(
            "/api/jobs",
            json={
                "name": "daily",
                "prompt": "the daily report",
                "schedule": "0 9 * * *",
                "targets": [f"sms:{ANN}", f"sms:{BOB}"],
            },
        )
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        clock.set(nine)
        [sent] = await twilio.wait_for_sent(1)
        assert sent.to == BOB
        assert "the daily report" in sent.body

        async def delivery_decided() -> bool:
            runs = (await api.get(f"/api/jobs/{job_id}")).json()["runs"]
            return bool(runs) and runs[0]["delivery_status"] not in (None, "pending")

        await herald.until(delivery_decided)
        [run] = (await api.get(f"/api/jobs/{job_id}")).json()["runs"]
        assert run["status"] == "ok"
        assert run["delivery_status"] == "failed"
        assert twilio.bodies(ANN) == []
