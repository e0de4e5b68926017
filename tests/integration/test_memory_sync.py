"""The external memory provider in the whole daemon (in-process), through the real SDKs and
the fake services: recall reaches the model in the user turn, each person's memory stays
theirs, linked identities are one peer, stateless calls and groups sync nothing, and syncs
arrive in order and exactly once after an outage and across a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from agent_core.memory import MemoryFiles, MemoryScope, person
from gateway.store import Store
from gateway.store.memory_docs import SqlMemoryDocs
from gateway.store.tables import memory_syncs
from tests.e2e.daemon import free_port
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.honcho_server import FakeHoncho
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.fakes.mem0_server import FakeMem0
from tests.fakes.memory_service import FakeMemoryService
from tests.integration.inproc import Herald, running_daemon

TOKEN = "4242:loopback-secret"
KEY = "api-secret"


@dataclass
class Rig:
    herald: Herald
    llm: FakeLLM
    chat: FakeChatServer
    api: httpx.AsyncClient

    async def ask(self, text: str, *, user: str, session: str, header: str = "X-Herald") -> str:
        """One API turn of `user` in session `session`; the answer."""
        response = await self.api.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text}]},
            headers={f"{header}-Session-Id": session, f"{header}-User-Id": user},
        )
        assert response.status_code == 200, response.text
        answer: str = response.json()["choices"][0]["message"]["content"]
        return answer

    def prompt_for(self, text: str) -> dict[str, Any]:
        """The model request whose last user message ends with `text`."""
        found = [r for r in self.llm.requests if last_user_text(r).endswith(text)]
        assert found, f"no model request for {text!r}"
        return found[-1]

    async def queued(self) -> int:
        async with self.herald.store.read() as conn:
            return int(await conn.scalar(select(func.count()).select_from(memory_syncs)) or 0)


def memory_section(fake: FakeMemoryService, provider: str) -> dict[str, Any]:
    return {
        "provider": provider,
        provider: {"base_url": fake.base_url, "api_key": fake.key},
        "recall_timeout": 5.0,  # generous: this machine may be busy (the bound is tested apart)
        "sync_retry_initial": 0.1,
        "sync_retry_max": 0.3,
    }


@asynccontextmanager
async def rig(
    tmp_path: Path,
    memory: dict[str, Any],
    llm: FakeLLM | None = None,
    allowed: tuple[str, ...] = ("*",),
    group_sessions: str = "chat",
) -> AsyncIterator[Rig]:
    port = free_port()
    async with FakeLLM() if llm is None else _same(llm) as model, FakeChatServer(TOKEN) as chat:
        section = {
            "url": chat.base_url,
            "token": TOKEN,
            "account": "bot1",
            "allowed_users": list(allowed),
            "stream_edits": False,
            "poll_timeout": 1,
            "group_sessions": group_sessions,
        }
        extra = {"api": {"host": "127.0.0.1", "port": port, "key": KEY}, "memory": memory}
        async with (
            running_daemon(tmp_path, model, "test", section, port=port, extra=extra) as herald,
            httpx.AsyncClient(
                base_url=herald.url,
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=10.0,
                trust_env=False,
            ) as api,
        ):
            yield Rig(herald, model, chat, api)


@asynccontextmanager
async def _same(llm: FakeLLM) -> AsyncIterator[FakeLLM]:
    yield llm


async def test_recall_reaches_the_model_in_the_user_turn_never_the_system_prompt(
    tmp_path: Path,
) -> None:
    async with FakeHoncho() as honcho, rig(tmp_path, memory_section(honcho, "honcho")) as r:
        r.chat.inject("c1", "My cat is called Tom", sender_id="alice")
        await r.chat.wait_for_sent(1)
        await honcho.wait_for(lambda: honcho.said_by("herald"))
        r.chat.inject("c1", "What is my cat called?", sender_id="alice")
        await r.chat.wait_for_sent(2)
        contexts = sum(1 for s in honcho.seen if s.path.endswith("/context"))
        r.chat.inject("c1", "thanks!", sender_id="alice")  # trivial: no recall
        await r.chat.wait_for_sent(3)

        body = r.prompt_for("What is my cat called?")
        user = last_user_text(body)
        assert user.startswith('<recalled-memory source="honcho">')
        assert "not instructions" in user
        assert "My cat is called Tom" in user
        assert user.endswith("</recalled-memory>\n\nWhat is my cat called?")
        system = body["messages"][0]
        assert system["role"] == "system"
        assert "recalled" not in system["content"]
        assert "Tom" not in system["content"]
        assert sum(1 for s in honcho.seen if s.path.endswith("/context")) == contexts
        assert "<recalled-memory" not in last_user_text(r.prompt_for("thanks!"))
        # What was stored is the person's words, not the recalled block.
        await honcho.wait_for(lambda: len(honcho.said_by("herald")) == 3)
        person = honcho.messages[0].peer
        assert honcho.said_by(person) == [
            "My cat is called Tom",
            "What is my cat called?",
            "thanks!",
        ]
        health = (await r.api.get("/health")).json()["memory"]
        assert health["provider"] == "honcho"
        assert health["state"] == "ok"


async def test_two_people_never_see_each_others_memories(tmp_path: Path) -> None:
    async with FakeMem0() as mem0, rig(tmp_path, memory_section(mem0, "mem0")) as r:
        await r.ask("My locker code is 4242", user="alice", session="a1")
        await r.ask("My dog is called Rex", user="bob", session="b1", header="X-Hermes")
        await mem0.wait_for(lambda: len(mem0.adds) == 2)
        await r.ask("What is my locker code?", user="alice", session="a2")
        await r.ask("What is my dog called?", user="bob", session="b2", header="X-Hermes")
        alice = last_user_text(r.prompt_for("What is my locker code?"))
        bob = last_user_text(r.prompt_for("What is my dog called?"))
        assert "4242" in alice
        assert "Rex" not in alice
        assert "Rex" in bob
        assert "4242" not in bob
        users = {add["user_id"] for add in mem0.adds}
        assert len(users) == 2


async def test_linked_identities_are_one_peer(tmp_path: Path) -> None:
    async with FakeHoncho() as honcho, rig(tmp_path, memory_section(honcho, "honcho")) as r:
        await r.herald.store.link_identities(("test", "alice"), ("api", "alice-api"))
        person = await r.herald.store.resolve_user("test", "alice")
        r.chat.inject("c1", "I am learning Portuguese", sender_id="alice")
        await r.chat.wait_for_sent(1)
        await r.ask("Do you remember which language I learn?", user="alice-api", session="s")
        await honcho.wait_for(lambda: len(honcho.said_by(person)) == 2)
        assert "Portuguese" in last_user_text(r.prompt_for("which language I learn?"))
        peers = {m.peer for m in honcho.messages}
        assert peers == {person, "herald"}


async def test_stateless_calls_unknown_senders_and_group_chats_sync_nothing(
    tmp_path: Path,
) -> None:
    async with FakeHoncho() as honcho:
        memory = memory_section(honcho, "honcho")
        async with rig(tmp_path, memory, allowed=("dave",)) as r:
            r.chat.inject("c9", "I am Mallory, remember my card 1234", sender_id="mallory")
            response = await r.api.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "I am Carol, remember me"}]},
                headers={"X-Herald-User-Id": "carol"},  # no session: stateless
            )
            assert response.status_code == 200
            r.chat.inject("g1", "We meet on Friday", sender_id="dave", chat_type="group")
            await r.chat.wait_for_sent(1)
            await r.ask("Anything about me?", user="erin", session="e")  # a person: synced
            await honcho.wait_for(lambda: len(honcho.messages) == 2)
            assert honcho.messages[0].content == "Anything about me?"
            await r.herald.until(lambda: _empty(r.herald.store))
            rows = await r.herald.answered(2)
            assert [row["outcome"] for row in rows] == ["rejected", "answered"]
            contents = [m.content for m in honcho.messages]
            assert "I am Mallory, remember my card 1234" not in contents
            assert "I am Carol, remember me" not in contents
            assert "We meet on Friday" not in contents


@pytest.mark.parametrize("provider", ["mem0", "honcho"])
async def test_a_persons_own_session_in_a_group_is_a_group_turn_for_memory(
    tmp_path: Path, provider: str
) -> None:
    """With `group_sessions: user`, Alice's turn in a group gets neither a recall of what she
    told the agent privately, nor her USER.md, nor a search of her conversations, and nothing
    of it is synced: not her lines, not what the agent noted (in the group's files)."""
    fake: FakeMemoryService = FakeMem0() if provider == "mem0" else FakeHoncho()
    async with fake as service:
        memory = memory_section(service, provider)
        async with rig(tmp_path, memory, group_sessions="user") as r:
            alice = await r.herald.store.resolve_user("test", "alice", "Alice")

            def synced() -> list[str]:
                """Her lines and what the agent wrote about her, as the provider has them."""
                if isinstance(service, FakeMem0):
                    return service.of(alice)
                assert isinstance(service, FakeHoncho)
                return service.said_by(alice) + [c["content"] for c in service.conclusions]

            private = {"action": "add", "target": "user", "content": "Vault code 7777"}
            r.llm.script(Reply(tool_calls=[("memory", private)]), Reply(text="Saved."))
            r.chat.inject("alice", "My locker code is 4242", sender_id="alice")
            await r.chat.wait_for_sent(1)
            await service.wait_for(lambda: "My locker code is 4242" in synced())
            files = MemoryFiles(SqlMemoryDocs(r.herald.store))
            assert "Vault code 7777" in await files.read(MemoryScope.USER, person(alice))
            # In the group the agent notes something about her (in her USER.md): not mirrored.
            note = {"action": "add", "target": "user", "content": "Meets the team on Friday"}
            search = ("session_search", {"query": "locker code"})
            r.llm.script(Reply(tool_calls=[("memory", note), search]), Reply(text="Noted."))
            r.chat.inject(
                "g1",
                "What is my locker code? We meet on Friday",
                sender_id="alice",
                sender_name="Alice",
                chat_type="group",
                mentions_bot=True,
            )
            await r.chat.wait_for_sent(2)
            group_turn = r.prompt_for("We meet on Friday")
            assert "<recalled-memory" not in last_user_text(group_turn)
            assert "4242" not in str(group_turn["messages"])
            assert "7777" not in str(group_turn["messages"]), "her USER.md is not the group's"
            assert "Friday" not in await files.read(MemoryScope.USER, person(alice))
            # Her syncs are sent in order: once a later direct line arrived, a group line
            # would have arrived before it.
            r.chat.inject("alice", "I like green tea", sender_id="alice")
            await r.chat.wait_for_sent(3)
            await service.wait_for(lambda: "I like green tea" in synced())
            assert not [line for line in synced() if "Friday" in line]
            assert "<recalled-memory" in last_user_text(r.prompt_for("I like green tea"))


async def test_syncs_arrive_in_order_exactly_once_after_an_outage_and_a_restart(
    tmp_path: Path,
) -> None:
    async with FakeHoncho() as honcho, FakeLLM() as llm:
        memory = memory_section(honcho, "honcho")
        await honcho.down()
        async with rig(tmp_path, memory, llm) as r:
            for n in range(1, 4):
                await r.ask(f"note {n}", user="alice", session="s")  # answered all the same
            assert await r.queued() == 3
            await r.herald.until(
                lambda: (
                    r.herald.supervisor.memory is not None
                    and r.herald.supervisor.memory.sender.status.counts.queued == 3
                )
            )
            health = (await r.api.get("/health")).json()["memory"]
            assert health["state"] == "unreachable"
            assert health["queued"] == 3
            metrics = (await r.api.get("/metrics")).text
            assert 'herald_memory_recall_failures_total{kind="error"} 3.0' in metrics
        # Herald stopped with the provider away; it comes back while Herald is down.
        await honcho.up()
        honcho.rate_limit(1, retry_after=0.2)
        honcho.fail(1, 502)
        async with rig(tmp_path, memory, llm) as r:
            await r.ask("note 4", user="alice", session="s")
            await honcho.wait_for(lambda: len(honcho.said_by("herald")) == 4)
            await r.herald.until(lambda: _empty(r.herald.store))
            person = honcho.messages[0].peer
            assert honcho.said_by(person) == ["note 1", "note 2", "note 3", "note 4"]
            assert await r.queued() == 0
            ids = [m.metadata["herald_sync_id"] for m in honcho.messages if m.peer == person]
            assert ids == sorted(ids)
            assert len(set(ids)) == 4


async def test_recall_needs_no_provider_at_start(tmp_path: Path) -> None:
    """Herald starts and answers while Mem0 is down; syncs go out once it is up."""
    async with FakeMem0() as mem0:
        await mem0.down()
        async with rig(tmp_path, memory_section(mem0, "mem0")) as r:
            assert "You said" in await r.ask("I like tea", user="alice", session="s")
            await mem0.up()
            await mem0.wait_for(lambda: bool(mem0.memories))
            await r.herald.until(lambda: _empty(r.herald.store))


async def _empty(store: Store) -> bool:
    async with store.read() as conn:
        return not await conn.scalar(select(func.count()).select_from(memory_syncs))
