"""`herald users unlink` in the whole daemon (in-process): after the operator's identity and
another are linked, talk and are unlinked, nothing of the operator's is reachable from the
other one: not their search, their MCP tools, their USER.md, their memory files, nor their
rights in a job the other one made while linked."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent_core.memory import MemoryFiles, MemoryScope, person
from gateway.access import Access
from gateway.contracts.messages import utcnow
from gateway.store.jobs import JobStore
from gateway.store.memory_docs import SqlMemoryDocs
from tests.e2e.daemon import free_port
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.integration.inproc import Herald, running_daemon
from tests.integration.mcp_rig import stdio_server

pytestmark = pytest.mark.timeout(120)

TOKEN = "4242:loopback-secret"
OPERATOR, OTHER = "1001", "1002"
_TOOL = re.compile(r"TOOL:(\w+):(\{.*\})", re.DOTALL)


def scripted(body: dict[str, Any]) -> Reply:
    """`TOOL:<name>:<json>` in the person's message calls that tool; a tool's result is
    answered with `tool said: <result>`; anything else with `You said: <text>`."""
    last = (body.get("messages") or [{}])[-1]
    if last.get("role") == "tool":
        return Reply(text=f"tool said: {last.get('content')}")
    text = last_user_text(body)
    found = _TOOL.search(text)
    if found:
        return Reply(tool_calls=[(found[1], json.loads(found[2]))])
    return Reply(text=f"You said: {text}")


def tools_of(body: dict[str, Any]) -> set[str]:
    """The names of the tools a model request offers."""
    return {t["function"]["name"] for t in body.get("tools") or []}


def system_of(body: dict[str, Any]) -> str:
    """The system prompt of a model request."""
    first = (body.get("messages") or [{}])[0]
    return str(first.get("content") or "") if first.get("role") == "system" else ""


@asynccontextmanager
async def daemon(tmp_path: Path, llm: FakeLLM) -> AsyncIterator[tuple[Herald, FakeChatServer]]:
    """Herald with the `test` platform, `test:1001` its operator and the only person the MCP
    server `ops` is for; scheduled jobs looked at every 0.2 s."""
    async with FakeChatServer(TOKEN) as chat:
        section = {
            "url": chat.base_url,
            "token": TOKEN,
            "account": "bot1",
            "allowed_users": [OPERATOR, OTHER],
            "stream_edits": False,
            "poll_timeout": 1,
        }
        extra = {
            "access": {"operators": [f"test:{OPERATOR}"]},
            "mcp": {"servers": {"ops": {**stdio_server(), "users": [f"test:{OPERATOR}"]}}},
            "cron": {"poll_interval": 0.2},
        }
        async with running_daemon(
            tmp_path, llm, "test", section, port=free_port(), extra=extra
        ) as herald:
            yield herald, chat


class Talk:
    """Direct messages to the daemon, each waited for until answered."""

    def __init__(self, chat: FakeChatServer, llm: FakeLLM) -> None:
        self.chat = chat
        self.llm = llm
        self.sent = 0

    async def say(self, sender: str, text: str) -> list[dict[str, Any]]:
        """Send `text` in `sender`'s direct chat; the model requests of its turn."""
        before = len(self.llm.requests)
        self.chat.inject(sender, text, sender_id=sender)
        self.sent += 1
        await self.chat.wait_for_sent(self.sent)
        return self.llm.requests[before:]


async def test_an_unlinked_identity_reaches_nothing_of_the_user_it_left(tmp_path: Path) -> None:
    async with FakeLLM() as llm, daemon(tmp_path, llm) as (herald, chat):
        llm.responder = scripted
        store = herald.store
        talk = Talk(chat, llm)
        memory = MemoryFiles(SqlMemoryDocs(store))
        add = {"action": "add", "target": "user"}
        await talk.say(OPERATOR, "my vault code is 7777")
        await talk.say(OPERATOR, "TOOL:memory:" + json.dumps({**add, "content": "Vault 7777"}))
        operator = await store.resolve_user("test", OPERATOR)
        assert "Vault 7777" in await memory.read(MemoryScope.USER, person(operator))

        await store.link_identities(("test", OPERATOR), ("test", OTHER))
        linked = await talk.say(OTHER, "hello")
        assert "Vault 7777" in system_of(linked[0]), "linked: one person"
        job = {"action": "create", "prompt": 'TOOL:ops__echo:{"text": "job"}'}
        await talk.say(OTHER, "TOOL:schedule_job:" + json.dumps({**job, "schedule": "every 1h"}))
        (made,) = await JobStore(store).find(user_id=operator)
        assert made.created_by == f"test:{OTHER}", "a job records the identity that made it"

        assert await store.unlink_identity(("test", OTHER)) == operator

        # The chat it already had runs as a user of its own: no USER.md, search, tools.
        search = await talk.say(OTHER, 'TOOL:session_search:{"query": "vault"}')
        own = await store.resolve_user("test", OTHER)
        assert own != operator
        assert all("7777" not in system_of(r) for r in search)
        assert "ops__echo" not in tools_of(search[0])
        assert "7777" not in str(search[-1]["messages"][-1]["content"]), "search: its own only"
        await talk.say(OTHER, "TOOL:memory:" + json.dumps({**add, "content": "Likes tea"}))
        assert "Likes tea" not in await memory.read(MemoryScope.USER, person(operator))
        assert "Likes tea" in await memory.read(MemoryScope.USER, person(own))
        # /new too.
        await talk.say(OTHER, "/new")
        fresh = await talk.say(OTHER, "who am I?")
        assert "7777" not in system_of(fresh[0])
        assert "ops__echo" not in tools_of(fresh[0])

        # The job it made while linked is its own now, and runs with its rights only.
        moved = await JobStore(store).get(made.id)
        assert moved is not None
        assert moved.user_id == own
        before = len(llm.requests)
        await JobStore(store).queue(made.id, utcnow())
        await herald.until(lambda: len(llm.requests) > before)
        run = llm.requests[before]
        assert last_user_text(run).endswith('TOOL:ops__echo:{"text": "job"}')
        assert "ops__echo" not in tools_of(run), "the operator's tool is not the job's"
        assert "7777" not in system_of(run)
        access = Access(store, {}, herald.config.access)
        assert not await access.job_operator(moved.user_id, moved.created_by)
