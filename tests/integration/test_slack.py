"""The Slack adapter in the running daemon, against the fake Slack (slack-sdk and slack-bolt
unmodified) and a fake LLM: what a person in a workspace sees."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.contracts.adapter import AdapterState
from gateway.store.outbox import Outbox
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.fakes.slack import (
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    DEFAULT_SIGNING_SECRET,
    FakeSlackServer,
)
from tests.integration.inproc import Herald, running_daemon

pytestmark = pytest.mark.timeout(90)

ANN = "U0ANN"
BOB = "U0BOB"
DM = "D0ANN"
GENERAL = "C0GENERAL"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer(ack_timeout=1.0) as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@contextlib.asynccontextmanager
async def running_herald(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM, *, port: int | None = None, **changes: Any
) -> AsyncIterator[Herald]:
    section: dict[str, Any] = {
        "bot_token": DEFAULT_BOT_TOKEN,
        "app_token": DEFAULT_APP_TOKEN,
        "base_url": slack.base_url,
        "allowed_users": [ANN, BOB],
        "stream_edits": False,
        "min_send_interval": 0,
        "min_edit_interval": 0.2,
        "ping_interval": 2,
    }
    section.update(changes)
    async with running_daemon(tmp_path, llm, "slack", section, port=port) as herald:
        yield herald


async def test_direct_message_round_trip(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, slack, llm) as herald:
        asked = slack.inject_message(DM, "hello **there** & you", user=ANN)
        [reply] = await slack.wait_for_posted(lambda p: p.channel == DM)
        assert reply.text == "You said: hello *there* &amp; you"
        assert reply.thread_ts is None
        await slack.wait_until_acked(asked.event_id)
        rows = await herald.answered(1)
        assert [(r["platform_message_id"], r["outcome"]) for r in rows] == [
            (f"{DM}:{asked.ts}", "answered")
        ]
        # The working reaction went on while the agent worked and came off at the end.
        await slack.wait_for(lambda: [c.action for c in slack.reactions] == ["add", "remove"])
        assert {(c.channel, c.timestamp, c.name) for c in slack.reactions} == {
            (DM, asked.ts, "eyes")
        }
        assert slack.max_open_sockets == 1


async def test_a_mention_in_a_channel_is_answered_in_a_thread(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, slack, llm) as herald:
        plain = slack.inject_message(GENERAL, "lunch anyone?", user=BOB)
        mention = slack.inject_app_mention(GENERAL, "what's the plan?", user=BOB)
        [reply] = await slack.wait_for_posted(lambda p: p.channel == GENERAL)
        assert reply.thread_ts == mention.ts
        assert reply.text.endswith("what's the plan?")
        await slack.wait_until_acked(plain.event_id, *mention.event_ids)
        rows = await herald.answered(1)
        assert [r["platform_message_id"] for r in rows] == [f"{GENERAL}:{mention.ts}"]
        # Follow-up in the thread: the reply stays there, same session.
        follow = slack.inject_app_mention(
            GENERAL, "and the budget?", user=BOB, thread_ts=mention.ts
        )
        await slack.wait_for_posted(lambda p: p.text.endswith("and the budget?"))
        in_thread = slack.texts_in(GENERAL, thread_ts=mention.ts)
        assert len(in_thread) == 2
        rows = await herald.answered(2)
        assert {r["session_key"] for r in rows} == {f"slack:default:{GENERAL}:{mention.ts}"}
        assert follow.ts != mention.ts


async def test_configured_channels_are_answered_without_a_mention(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, slack, llm, channels=[GENERAL]):
        slack.inject_message(GENERAL, "status?", user=ANN)
        [reply] = await slack.wait_for_posted(lambda p: p.channel == GENERAL)
        assert reply.text.endswith("status?")


async def test_a_long_answer_is_chunked_with_code_blocks_intact(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    code = "\n".join(f"step_{i} = run({i})" for i in range(60))
    prose = "Slack keeps *every* word of this answer in order. " * 60
    answer = f"{prose}\n\n```python\n{code}\n```\n\n{prose}\n\n{prose}"
    llm.responder = lambda body: Reply(text=answer)
    async with running_herald(tmp_path, slack, llm):
        slack.inject_message(DM, "tell me everything", user=ANN)
        await slack.wait_for(lambda: sum(len(p.text) for p in slack.posted) > 8000)
        await slack.wait_for(lambda: "step_59" in "".join(p.text for p in slack.posted))
        posts = [p.text for p in slack.posted if p.channel == DM]
        assert len(posts) >= 3
        assert all(len(p) <= 4000 for p in posts)
        holders = [p for p in posts if "step_0 = run(0)" in p]
        assert len(holders) == 1
        assert "step_59 = run(59)" in holders[0]
        assert holders[0].count("```") == 2


async def test_a_dropped_socket_reconnects_without_losing_events_or_keeping_two(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, slack, llm) as herald:
        slack.inject_message(DM, "before", user=ANN)
        await slack.wait_for_posted(lambda p: p.text == "You said: before")
        slack.drop_socket()
        meanwhile = slack.inject_message(DM, "during", user=ANN)
        await slack.wait_for_posted(lambda p: p.text == "You said: during", timeout=30)
        await slack.wait_until_acked(meanwhile.event_id)
        slack.send_disconnect("refresh_requested")
        after = slack.inject_message(DM, "after", user=ANN)
        await slack.wait_for_posted(lambda p: p.text == "You said: after", timeout=30)
        await slack.wait_until_acked(after.event_id)
        assert slack.sockets_opened >= 3
        assert slack.max_open_sockets == 1
        await herald.until(lambda: herald.adapter_state() is AdapterState.RECEIVING)
        assert len(await herald.answered(3)) == 3


async def test_a_silent_socket_is_noticed_and_replaced(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, slack, llm, ping_interval=1) as herald:
        opened = slack.sockets_opened
        slack.silence_socket()
        await herald.until(lambda: slack.sockets_opened > opened, timeout=30)
        event = slack.inject_message(DM, "are you there?", user=ANN)
        await slack.wait_for_posted(lambda p: p.text == "You said: are you there?", timeout=30)
        await slack.wait_until_acked(event.event_id)
        assert slack.max_open_sockets == 1


async def test_an_unacknowledged_envelope_comes_again_and_is_answered_once(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, slack, llm) as herald:
        slack.ignore_acks(1)
        event = slack.inject_message(DM, "only once", user=ANN)
        await slack.wait_for(lambda: any(e.retry_attempt >= 1 for e in slack.envelopes))
        await slack.wait_until_acked(event.event_id)
        slack.inject_message(DM, "next", user=ANN)
        await slack.wait_for_posted(lambda p: p.text == "You said: next")
        assert [p.text for p in slack.posted] == ["You said: only once", "You said: next"]
        assert len(await herald.answered(2)) == 2


async def test_files_are_downloaded_with_the_bot_token(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    pdf = b"%PDF-1.7 " + bytes(range(256)) * 4
    file = slack.add_file(pdf, name="notes.pdf", mimetype="application/pdf")
    async with running_herald(tmp_path, slack, llm) as herald:
        slack.inject_message(DM, "summarise", user=ANN, files=[file])
        await slack.wait_for_posted(lambda p: p.channel == DM)
        seen = last_user_text(llm.requests[0])
        assert seen.startswith("summarise\n[attached file: notes.pdf (application/pdf")
        assert list((await herald.kept_files()).values()) == [pdf]


async def test_events_api_checks_signatures_and_deduplicates_retries(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/webhooks/slack/events"
    async with running_herald(
        tmp_path,
        slack,
        llm,
        port=port,
        mode="events",
        app_token=None,
        signing_secret=DEFAULT_SIGNING_SECRET,
    ) as herald:
        assert await slack.verify_events_url(url)
        body = slack.event_callback(
            {
                "type": "message",
                "channel": DM,
                "channel_type": "im",
                "user": ANN,
                "text": "forged",
                "ts": f"{time.time():.6f}",
            }
        )
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            for bad in (
                slack.signed_request(body, wrong_signature=True),
                slack.signed_request(body, stale=True),
            ):
                answer = await client.post(url, content=bad.body, headers=bad.headers)
                assert answer.status_code == 401
            assert await herald.rows() == []
            good = slack.signed_request(body)
            first = await client.post(url, content=good.body, headers=good.headers)
            retry = slack.signed_request(body, retry_num=1, retry_reason="http_timeout")
            second = await client.post(url, content=retry.body, headers=retry.headers)
        assert (first.status_code, second.status_code) == (200, 200)
        await slack.wait_for_posted(lambda p: p.text == "You said: forged")
        assert len(await herald.answered(1)) == 1

        slack.use_events_api(url)
        pushed = slack.inject_message(DM, "pushed by Slack", user=ANN)
        await slack.wait_for_posted(lambda p: p.text == "You said: pushed by Slack")
        assert pushed.event_id
        assert [p.text for p in slack.posted].count("You said: forged") == 1


async def test_an_edit_is_answered_and_a_reaction_is_noted(
    tmp_path: Path, slack: FakeSlackServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, slack, llm, working_reaction="") as herald:
        asked = slack.inject_message(DM, "helo", user=ANN)
        [reply] = await slack.wait_for_posted(lambda p: p.channel == DM)
        slack.inject_edit(DM, asked.ts, "hello")
        await slack.wait_for_posted(lambda p: p.text.endswith("it now reads:] hello"))
        await herald.answered(2)
        await herald.until(
            lambda: Outbox(herald.store).sent_as("slack", "default", f"{DM}:{reply.ts}")
        )
        # A stranger's reaction changes nothing; Ann's is a note, not a turn.
        for who in ("U0EVE", ANN):
            slack.inject_event(
                {
                    "type": "reaction_added",
                    "user": who,
                    "reaction": "tada",
                    "item": {"type": "message", "channel": DM, "ts": reply.ts},
                }
            )
        rows = await herald.answered(3)
        assert [r["sender_id"] for r in rows] == [ANN, ANN, ANN]
        assert "[reaction tada to your message «You said: helo»]" in rows[2]["text"]
        assert len(slack.posted) == 2
