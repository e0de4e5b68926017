"""`send_message` (and `send_file`'s targets) through the outbox: this chat for everyone,
other chats for operators among `tools.send_message.targets` only."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_core.tools import ToolContext, ToolError
from gateway.contracts.config import PlatformSection
from gateway.contracts.history import SessionInfo
from gateway.contracts.ids import SessionId, SessionKey
from gateway.media import file_destination
from gateway.store import Store
from gateway.tools.places import Places
from tests.fakes.platform import inbound
from tests.integration.mcp_rig import mcp_rig
from tests.unit.agent.fakes import ScriptedProvider, answer, call, use_tools

pytestmark = pytest.mark.timeout(60)


def send(target: str, text: str, call_id: str = "s1") -> object:
    return call(call_id, "send_message", {"target": target, "text": text})


async def test_a_person_may_send_to_this_chat_only(store: Store, tmp_path: Path) -> None:
    llm = ScriptedProvider(
        use_tools(
            call("s1", "send_message", {"target": "here", "text": "note to self"}),
            call("s2", "send_message", {"target": "test:c1", "text": "same chat by name"}),
            call("s3", "send_message", {"target": "test:c9", "text": "elsewhere"}),
            call("s4", "send_message", {"target": "home", "text": "to home"}),
        ),
        answer("done"),
    )
    async with mcp_rig(store, tmp_path, llm, {}, homes=("test:home",)) as rig:
        await rig.manager.accept(inbound("send", chat="c1"))
        await rig.said("c1", "done")
        await rig.said("c1", "note to self")
        await rig.said("c1", "same chat by name")
    here, by_name, elsewhere, home = rig.tool_results()
    assert here == "queued for delivery to test:c1"
    assert by_name == "queued for delivery to test:c1"
    assert elsewhere.startswith("error: you may send only to this chat")
    assert home.startswith("error: you may send only to this chat")
    assert not [d for d in rig.adapter.delivered if d.chat_id in ("c9", "home")]


async def test_an_operator_may_send_to_the_allowed_targets(store: Store, tmp_path: Path) -> None:
    llm = ScriptedProvider(
        use_tools(
            call("s1", "send_message", {"target": "home", "text": "report for home"}),
            call("s2", "send_message", {"target": "test:team", "text": "for the team"}),
            call("s3", "send_message", {"target": "test:c9", "text": "not listed"}),
            call("s4", "send_message", {"target": "nowhere:1", "text": "bad"}),
        ),
        answer("done"),
    )
    async with mcp_rig(
        store,
        tmp_path,
        llm,
        {},
        operators=("test:op",),
        homes=("test:home",),
        send_targets=("home", "test:team"),
    ) as rig:
        await rig.manager.accept(inbound("send", chat="op"))
        await rig.said("op", "done")
        await rig.said("home", "report for home")
        await rig.said("team", "for the team")
    home, team, unlisted, unknown = rig.tool_results()
    assert home == "queued for delivery to test:home"
    assert team == "queued for delivery to test:team"
    assert "test:c9 is not among the allowed targets" in unlisted
    assert "unknown platform 'nowhere'" in unknown
    assert not [d for d in rig.adapter.delivered if d.chat_id == "c9"]


async def test_send_file_targets_follow_the_same_rules(store: Store) -> None:
    section = PlatformSection(account="acct", allowed_users=("*",))
    places = Places(
        store,
        {("test", "acct"): section},
        homes=("test:home", "test:team"),
        allowed=("home", "all"),
    )
    resolve = file_destination(places)
    now = datetime.now(UTC)
    session = SessionInfo(
        SessionId(1), SessionKey("test:acct:c1"), 0, "test", None, None, "", "", now, now, 0
    )
    person = ToolContext(session=session, user_id=None)
    operator = ToolContext(session=session, user_id=None, operator=True)

    assert (await resolve("here", person)).chat_id == "c1"
    assert (await resolve("test:c1", person)).account == "acct"
    with pytest.raises(ToolError, match="only Herald's operators"):
        await resolve("home", person)
    assert (await resolve("home", operator)).chat_id == "home"
    with pytest.raises(ToolError, match="a file goes to one chat"):
        await resolve("all", operator)
    with pytest.raises(ToolError, match="not among the allowed targets"):
        await resolve("test:elsewhere", operator)
