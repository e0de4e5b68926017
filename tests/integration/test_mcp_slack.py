"""Approval on Slack: the question comes with Block Kit Approve / Deny buttons, and a press is
the presser's own /approve (another person's press is refused like their /approve), over
Socket Mode and over the Interactivity Request URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM
from tests.fakes.slack import (
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    DEFAULT_SIGNING_SECRET,
    FakeSlackServer,
    Posted,
)
from tests.integration.button_rig import MCP, mcp_ready, responder, tool_runs
from tests.integration.inproc import running_daemon
from tests.integration.mcp_rig import until

pytestmark = pytest.mark.timeout(90)

ANN = "U0ANN"
BOB = "U0BOB"
GENERAL = "C0GENERAL"


def section(slack: FakeSlackServer, **changes: Any) -> dict[str, Any]:
    return {
        "bot_token": DEFAULT_BOT_TOKEN,
        "app_token": DEFAULT_APP_TOKEN,
        "base_url": slack.base_url,
        "allowed_users": [ANN, BOB],
        "stream_edits": False,
        "min_send_interval": 0,
        "working_reaction": "",
        **changes,
    }


def buttons_of(posted: Posted) -> list[tuple[str, str, str]]:
    """(label, value, style) of each button under a posted message."""
    [actions] = [b for b in posted.blocks if b["type"] == "actions"]
    return [(e["text"]["text"], e["value"], e.get("style", "")) for e in actions["elements"]]


async def ask_and_press(slack: FakeSlackServer, llm: FakeLLM) -> None:
    """Ann asks in a thread; Bob's press is refused; Ann's press runs the tool once."""
    mention = slack.inject_app_mention(GENERAL, "run pid", user=ANN)
    [question] = await slack.wait_for_posted(lambda p: "Approval needed" in p.text, 30)
    assert question.thread_ts == mention.ts
    assert buttons_of(question) == [
        ("✅ Approve", "/approve 1", "primary"),
        ("❌ Deny", "/deny 1", "danger"),
    ]
    [shown] = [b for b in question.blocks if b["type"] == "section"]
    assert shown["text"]["text"].startswith("🔐 Approval needed #1")  # readable without buttons

    bob = slack.press_button(GENERAL, question.ts, "/approve 1", user=BOB)
    [refusal] = await slack.wait_for_posted(lambda p: "Only the person who asked" in p.text, 30)
    assert refusal.thread_ts == mention.ts
    assert tool_runs(llm) == 0
    ann = slack.press_button(GENERAL, question.ts, "/approve 1", user=ANN)
    [done] = await slack.wait_for_posted(lambda p: p.text.startswith("done:"), 30)
    assert done.thread_ts == mention.ts
    assert f"[approved by slack:{ANN}]" in done.text
    await slack.wait_until_acked(bob.event_id, ann.event_id)
    assert tool_runs(llm) == 1


async def test_approval_buttons_over_socket_mode(tmp_path: Path) -> None:
    async with FakeSlackServer(ack_timeout=2.0) as slack, FakeLLM() as llm:
        llm.responder = responder
        async with running_daemon(
            tmp_path, llm, "slack", section(slack), extra={"mcp": MCP}
        ) as herald:
            await mcp_ready(herald.url)
            await ask_and_press(slack, llm)
            interactive = [e for e in slack.envelopes if e.event_type == "block_actions"]
            # The two presses; an ack later than `ack_timeout` on a busy machine makes Slack
            # deliver a press again (retry_attempt > 0), which Herald must (and does) ignore.
            assert len([e for e in interactive if e.retry_attempt == 0]) == 2


async def test_approval_buttons_over_the_interactivity_url(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}/webhooks/slack"
    changes = {"mode": "events", "app_token": None, "signing_secret": DEFAULT_SIGNING_SECRET}
    async with FakeSlackServer() as slack, FakeLLM() as llm:
        llm.responder = responder
        async with running_daemon(
            tmp_path, llm, "slack", section(slack, **changes), port=port, extra={"mcp": MCP}
        ) as herald:
            await mcp_ready(herald.url)
            slack.use_events_api(f"{base}/events", interactivity_url=f"{base}/interactivity")
            await ask_and_press(slack, llm)
            presses = [d for d in slack.http_deliveries if d.url.endswith("/interactivity")]
            assert [d.status for d in presses] == [200, 200]

            # A press that Slack did not sign is refused and changes nothing.
            forged = slack.signed_request(b"payload=%7B%7D", wrong_signature=True)
            forged.headers["Content-Type"] = "application/x-www-form-urlencoded"
            async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
                answer = await client.post(
                    f"{base}/interactivity", content=forged.body, headers=forged.headers
                )
            assert answer.status_code == 401
            await until(lambda: tool_runs(llm) == 1)
