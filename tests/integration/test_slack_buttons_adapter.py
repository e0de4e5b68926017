"""Slack buttons at the adapter level: a message sent with buttons carries Block Kit blocks, a
press is the presser's own command (acknowledged after it is stored), and an interaction Herald
does not handle is acknowledged and passed over."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import SecretStr

from adapters.slack import PLATFORM as SLACK
from adapters.slack.adapter import SlackAdapter
from adapters.slack.config import SlackConfig
from gateway.contracts.adapter import AdapterState
from gateway.contracts.errors import NotReady
from gateway.contracts.ids import AccountId, ChatId, ThreadId
from gateway.contracts.messages import Button, OutboundMessage, TextFormat
from tests.fakes.sink import ListSink, receiving, run_until_error
from tests.fakes.slack import DEFAULT_APP_TOKEN, DEFAULT_BOT_TOKEN, FakeSlackServer

pytestmark = pytest.mark.timeout(60)

ANN = "U0ANN"
GENERAL = "C0GENERAL"
BUTTONS = (Button("✅ Approve", "/approve 7"), Button("❌ Deny", "/deny 7"))


def adapter_for(slack: FakeSlackServer, tmp_path: Path) -> SlackAdapter:
    config = SlackConfig(
        bot_token=SecretStr(DEFAULT_BOT_TOKEN),
        app_token=SecretStr(DEFAULT_APP_TOKEN),
        base_url=slack.base_url,
        min_send_interval=0,
    )
    return SlackAdapter(config, tmp_path / "files")


async def until_receiving(adapter: SlackAdapter) -> None:
    async with asyncio.timeout(10):
        while adapter.liveness() is not AdapterState.RECEIVING:
            await asyncio.sleep(0.02)


async def test_buttons_are_sent_as_blocks_and_a_press_is_the_pressers_command(
    tmp_path: Path,
) -> None:
    async with FakeSlackServer(ack_timeout=1.0) as slack:
        sink = ListSink()
        async with adapter_for(slack, tmp_path) as adapter, receiving(adapter, sink):
            await until_receiving(adapter)
            question = OutboundMessage(
                platform=SLACK,
                account=AccountId("default"),
                chat_id=ChatId(GENERAL),
                thread_id=ThreadId("1795000000.000200"),
                text="Approve <this> & that?",
                format=TextFormat.PLAIN,
                idempotency_key="q",
                buttons=BUTTONS,
            )
            await adapter.send(question)
            await adapter.send(
                OutboundMessage(
                    platform=SLACK,
                    account=AccountId("default"),
                    chat_id=ChatId(GENERAL),
                    text="no buttons",
                    idempotency_key="p",
                )
            )
            sent, plain = slack.posted
            assert sent.text == "Approve &lt;this&gt; &amp; that?"  # the fallback text
            assert sent.blocks[0] == {
                "type": "section",
                "text": {"type": "plain_text", "text": "Approve <this> & that?"},
            }
            assert [e["value"] for e in sent.blocks[1]["elements"]] == ["/approve 7", "/deny 7"]
            assert plain.blocks is None

            other = slack.inject_interactive(
                {"type": "shortcut", "callback_id": "x", "trigger_id": "1.2.3", "user": {"id": ANN}}
            )
            await slack.wait_until_acked(other)
            press = slack.press_button(GENERAL, sent.ts, "/deny 7", user=ANN)
            await slack.wait_until_acked(press.event_id)
            [message] = sink.messages
            assert (message.text, message.sender.id) == ("/deny 7", ANN)
            assert (message.chat_id, message.thread_id) == (GENERAL, "1795000000.000200")
            assert message.platform_message_id.startswith(f"{GENERAL}:{sent.ts}:b")


async def test_a_press_that_cannot_be_stored_is_not_acknowledged(tmp_path: Path) -> None:
    async with FakeSlackServer(ack_timeout=1.0, max_retries=1) as slack:
        sink = ListSink(fail_on=lambda message: message.text.startswith("/approve"))
        async with adapter_for(slack, tmp_path) as adapter:
            await adapter.send(
                OutboundMessage(
                    platform=SLACK,
                    account=AccountId("default"),
                    chat_id=ChatId(GENERAL),
                    text="Approve?",
                    idempotency_key="q",
                    buttons=BUTTONS,
                )
            )
            [sent] = slack.posted
            press = slack.press_button(GENERAL, sent.ts, "/approve 7", user=ANN)
            with pytest.raises(NotReady, match="could not be stored"):
                await run_until_error(adapter, sink)
            assert press.event_id not in slack.acked
            assert slack.pending == [press.event_id]  # Slack sends it again
