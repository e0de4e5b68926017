"""Slack approval buttons: Button → Block Kit, and a `block_actions` press → the presser's own
command message, against a recorded payload (tests/data/slack/block_actions.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from adapters.inbound import Incoming, Skipped
from adapters.slack import PLATFORM as SLACK
from adapters.slack.convert import SECTION_CHARS, BotIdentity, blocks_for, pressed
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import Button

DATA = Path(__file__).resolve().parents[1] / "data" / "slack"
BOT = BotIdentity("UBOT", "B0BOT")
BUTTONS = (Button("✅ Approve", "/approve 1"), Button("❌ Deny", "/deny 1"))


def payload() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "block_actions.json").read_text(encoding="utf-8"))
    return data


def press(data: Any) -> Incoming[Any] | Skipped:
    return pressed(data, bot=BOT, account=AccountId("ws"))


def test_the_text_is_a_section_and_the_buttons_an_actions_block() -> None:
    text = "Approval needed (#1): t__pid\n  (no arguments)"
    assert blocks_for(text, BUTTONS, mrkdwn=False) == [
        {"type": "section", "text": {"type": "plain_text", "text": text}},
        {
            "type": "actions",
            "block_id": "herald_buttons",
            "elements": [
                {
                    "type": "button",
                    "action_id": "herald_0",
                    "text": {"type": "plain_text", "text": "✅ Approve", "emoji": True},
                    "value": "/approve 1",
                    "style": "primary",
                },
                {
                    "type": "button",
                    "action_id": "herald_1",
                    "text": {"type": "plain_text", "text": "❌ Deny", "emoji": True},
                    "value": "/deny 1",
                    "style": "danger",
                },
            ],
        },
    ]


def test_long_text_is_cut_into_sections_slack_accepts() -> None:
    blocks = blocks_for("*a*" * 1500, BUTTONS, mrkdwn=True)
    sections = [b for b in blocks if b["type"] == "section"]
    assert [len(b["text"]["text"]) for b in sections] == [SECTION_CHARS, 4500 - SECTION_CHARS]
    assert {b["text"]["type"] for b in sections} == {"mrkdwn"}
    assert "".join(b["text"]["text"] for b in sections) == "*a*" * 1500


def test_a_press_is_the_pressers_command_in_the_thread_of_the_question() -> None:
    result = press(payload())
    assert isinstance(result, Incoming)
    message = result.message
    assert message.platform is SLACK
    assert message.text == "/approve 1"
    assert (message.chat_id, message.thread_id) == ("C0GEN", "1795000000.000200")
    assert (message.sender.id, message.sender.display_name) == ("U0ANN", "ann")
    assert message.session_key == "slack:ws:C0GEN:1795000000.000200"
    assert message.mentions_bot
    assert not message.is_direct
    assert message.platform_message_id == (
        "C0GEN:1795000010.000300:b7800000000001.1234567890.0a1b2c3d4e5f60718293a4b5c6d7e8f9"
    )
    assert result.files == ()


def test_a_press_in_a_direct_message_is_direct() -> None:
    data = payload()
    data["container"] = {"type": "message", "message_ts": "1795000010.000300", "channel_id": "D0A"}
    data["channel"] = {"id": "D0A", "name": "directmessage"}
    del data["message"]["thread_ts"]
    result = press(data)
    assert isinstance(result, Incoming)
    assert result.message.is_direct
    assert result.message.thread_id is None
    assert result.message.session_key == "slack:ws:D0A"


def test_presses_herald_did_not_offer_are_skipped() -> None:
    other = payload()
    other["actions"][0]["value"] = "/forget everything"
    no_actions = payload()
    no_actions["actions"] = []
    by_bot = payload()
    by_bot["user"]["id"] = "UBOT"
    no_channel = payload()
    del no_channel["container"], no_channel["channel"]
    cases: list[Any] = [other, no_actions, by_bot, no_channel, {"type": "view_submission"}, []]
    for data in [*cases, None]:
        assert isinstance(press(copy.deepcopy(data)), Skipped), data
