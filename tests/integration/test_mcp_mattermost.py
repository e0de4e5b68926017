"""Approval on Mattermost: the question comes with Approve / Deny interactive message buttons
whose action posts to Herald's `/webhooks/mattermost/actions` with the command signed in its
context; a press is the presser's own /approve (another person's press is refused like their
/approve), and a press with a forged signature is refused before it reaches the inbox."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM
from tests.fakes.mattermost_server import TOKEN, FakeMattermostServer
from tests.integration.button_rig import MCP, mcp_ready, responder, tool_runs
from tests.integration.inproc import running_daemon

PRESS = re.compile(r":b[0-9a-f]{32}$")
"""A button press's message id (`<channel>:<post>:b<digest>`); not `:b` anywhere: a post
id may start with b."""

pytestmark = pytest.mark.timeout(90)

ANN = "annannannannannannannanna1"
BOB = "bobbobbobbobbobbobbobbobb1"
TOWN = "towntowntowntowntowntowna1"
SECRET = "a-button-secret-for-tests"


def answered(mm: FakeMattermostServer, text: str) -> list[dict[str, Any]]:
    return [p for p in mm.posted if text in p["message"]]


async def test_approval_buttons_on_mattermost(tmp_path: Path) -> None:
    port = free_port()
    async with FakeMattermostServer() as mm, FakeLLM() as llm:
        mm.add_user(ANN, "ann")
        mm.add_user(BOB, "bob")
        mm.add_channel(TOWN, "O", "town-square")
        llm.responder = responder
        section: dict[str, Any] = {
            "url": mm.base_url,
            "token": TOKEN,
            "allowed_users": [ANN, BOB],
            "stream_edits": False,
            "min_send_interval": 0,
            "working_reaction": "",
            "public_url": f"http://127.0.0.1:{port}",
            "action_secret": SECRET,
        }
        async with running_daemon(
            tmp_path, llm, "mattermost", section, port=port, extra={"mcp": MCP}
        ) as herald:
            await mcp_ready(herald.url)
            await mm.wait_for(lambda: mm.connected > 0)
            mm.inject_post(TOWN, "@herald run pid", user=ANN, mention=True)
            await mm.wait_for(lambda: bool(answered(mm, "Approval needed")), 30)
            [question] = answered(mm, "Approval needed")
            actions = question["props"]["attachments"][0]["actions"]
            assert [a["integration"]["context"]["command"] for a in actions] == [
                "/approve 1",
                "/deny 1",
            ]
            forged = {"command": "/approve 1", "signature": "f" * 64}
            assert (await mm.press(question["id"], 0, user=ANN, context=forged))[0] == 403
            assert (await mm.press(question["id"], 0, user=BOB))[0] == 200
            await mm.wait_for(lambda: bool(answered(mm, "Only the person who asked")), 30)
            assert tool_runs(llm) == 0
            assert (await mm.press(question["id"], 0, user=ANN))[0] == 200
            await mm.wait_for(lambda: any(p["message"].startswith("done:") for p in mm.posted), 30)
            [done] = [p for p in mm.posted if p["message"].startswith("done:")]
            assert f"[approved by mattermost:{ANN}]" in done["message"]
            assert done["channel_id"] == TOWN
            assert tool_runs(llm) == 1
            rows = await herald.rows()
            presses = [r for r in rows if PRESS.search(str(r["platform_message_id"]))]
            assert [r["text"] for r in presses] == [
                "/approve 1",
                "/approve 1",
            ]
