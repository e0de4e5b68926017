"""Who an API session runs as: its creator, never whoever names it next."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import func, select

from gateway.store import Store
from gateway.store.tables import identities, messages, sessions, turns
from tests.e2e.daemon import HERALD, Daemon, running
from tests.e2e.test_bad_input_e2e import raw_request, request_head
from tests.fakes.llm import FakeLLM, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
KEY = "identity-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SECRET = "hunter2"


def settings(llm: FakeLLM, *, key: bool = True) -> dict[str, Any]:
    """The fake LLM, no memory pass (every model call is a turn's), with or without a key."""
    config: dict[str, Any] = {
        "llm": {"base_url": llm.base_url, "api_key": "sk-fake", "memory_pass": False}
    }
    if key:
        config["api"] = {"key": KEY}
    return config


def ask(text: str, **body: Any) -> dict[str, Any]:
    """A chat-completions body with one user message."""
    return {"model": "herald", "messages": [{"role": "user", "content": text}], **body}


async def counts(daemon: Daemon) -> dict[str, int]:
    """How many rows each table that a request could write holds."""
    async with Store.open(daemon.database_url) as store, store.read() as conn:
        return {
            table.name: int(await conn.scalar(select(func.count()).select_from(table)) or 0)
            for table in (sessions, turns, messages, identities)
        }


def tool_results(llm: FakeLLM) -> list[str]:
    """What tools returned to the model, over every request so far."""
    return [
        str(m["content"])
        for request in llm.requests
        for m in request["messages"]
        if m["role"] == "tool"
    ]


async def test_a_session_used_with_another_users_header_is_refused(tmp_path: Path) -> None:
    async with FakeLLM() as llm, running(tmp_path / "s", **settings(llm)) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as http:
            alice = {**AUTH, "X-Herald-Session-Id": "plans", "X-Herald-User-Id": "alice"}
            first = await http.post("/v1/chat/completions", json=ask("hi"), headers=alice)
            assert first.status_code == 200
            assert await http.post("/v1/chat/completions", json=ask("again"), headers=alice)
            before = await counts(daemon)

            bob = {**alice, "X-Herald-User-Id": "bob"}
            refused = await http.post("/v1/chat/completions", json=ask("let me in"), headers=bob)
            assert refused.status_code == 409
            error = refused.json()["error"]
            assert error["type"] == "conflict_error"
            # The refusal says whose the session is and the ways on.
            assert "session 'plans' belongs to api:alice, not api:bob" in error["message"]
            assert "X-Herald-User-Id: alice" in error["message"]
            assert "`herald users link api:bob api:alice`" in error["message"]
            # The key holder without a user header is the owner: not alice either.
            owner = {**AUTH, "X-Herald-Session-Id": "plans"}
            as_owner = await http.post("/v1/chat/completions", json=ask("me?"), headers=owner)
            assert as_owner.status_code == 409
            assert "herald users link local:owner api:alice" in as_owner.json()["error"]["message"]
            streamed = await http.post(
                "/v1/chat/completions", json=ask("stream?", stream=True), headers=bob
            )
            assert streamed.status_code == 409
            assert await counts(daemon) == before  # not even a user row for bob
            assert len(llm.requests) == 2

            # Bob's own session is his.
            mine = {**bob, "X-Herald-Session-Id": "bobs"}
            assert (
                await http.post("/v1/chat/completions", json=ask("hi"), headers=mine)
            ).is_success

            # As the refusal said: once the two are one person, the owner goes on with it.
            link = await asyncio.create_subprocess_exec(
                str(HERALD),
                *("users", "link", "local:owner", "api:alice", "--config", str(daemon.config_path)),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(link.communicate(), 60)
            assert link.returncode == 0, (out + err).decode()
            again = await http.post("/v1/chat/completions", json=ask("me?"), headers=owner)
            assert again.status_code == 200, again.text
        assert await daemon.stop() == 0


async def test_the_user_field_scopes_a_session_to_that_user_not_the_owner(
    tmp_path: Path,
) -> None:
    state = tmp_path / "s"
    search = Reply(tool_calls=[("session_search", {"query": "password"})])
    async with FakeLLM() as llm:
        # The key holder (the local owner) tells a secret in a named session.
        async with running(state, **settings(llm)) as daemon:
            sdk = openai.AsyncOpenAI(base_url=f"{daemon.url}/v1", api_key=KEY, max_retries=0)
            async with sdk:
                owner = {"X-Herald-Session-Id": "owner-notes"}
                await sdk.chat.completions.create(
                    **ask(f"my password is {SECRET}"), extra_headers=owner
                )
                llm.script(search, Reply(text="found it"))
                await sdk.chat.completions.create(**ask("what was it?"), extra_headers=owner)
            assert SECRET in tool_results(llm)[-1]  # the owner's own search sees it
            assert await daemon.stop() == 0

        # Without a key, the `user` field names a user of that name, not the owner.
        async with running(state, **settings(llm, key=False)) as daemon:
            sdk = openai.AsyncOpenAI(base_url=f"{daemon.url}/v1", api_key="any", max_retries=0)
            async with sdk:
                llm.script(search, Reply(text="nothing"))
                raw = await sdk.chat.completions.with_raw_response.create(
                    **ask("any passwords?"), user="mallory"
                )
                assert raw.parse().choices[0].message.content == "nothing"
                assert raw.headers["x-herald-session-id"] == "mallory"
                found = tool_results(llm)[-1]
                assert SECRET not in found
                assert "owner-notes" not in found
                assert "api:default:mallory" in found  # only mallory's own words

                with pytest.raises(openai.ConflictError):
                    await sdk.chat.completions.create(**ask("hello"), user="owner-notes")
            assert await daemon.stop() == 0

    async with Store.open(daemon.database_url) as store:
        mallory = await store.get_session("api:default:mallory")
        notes = await store.get_session("api:default:owner-notes")
        assert mallory is not None
        assert notes is not None
        assert mallory.user_id != notes.user_id
        assert mallory.user_id is not None
        assert await store.identities_of(mallory.user_id) == [("api", "mallory")]
        assert notes.user_id is not None
        assert await store.identities_of(notes.user_id) == [("local", "owner")]


async def test_names_outside_latin1_are_checked_before_anything_runs(tmp_path: Path) -> None:
    async with FakeLLM() as llm, running(tmp_path / "s", **settings(llm)) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as http:
            # Non-ASCII bytes in a session or user header: 400, nothing stored, no turn.
            body = json.dumps(ask("hello")).encode()
            for name in ("X-Herald-Session-Id", "X-Herald-User-Id"):
                for value in ("🙂".encode(), "café".encode("latin-1")):
                    headers = {"Authorization": f"Bearer {KEY}".encode(), name: value}
                    if name == "X-Herald-User-Id":
                        headers["X-Herald-Session-Id"] = b"plain"
                    status = await raw_request(daemon, request_head(headers, len(body)), body)
                    assert status == 400, (name, value)
            # A C1 control character in the `user` field is refused like any control.
            bad = await http.post(
                "/v1/chat/completions", json=ask("x", user="a\x85b"), headers=AUTH
            )
            assert bad.status_code == 400
            assert await counts(daemon) == {
                "sessions": 0,
                "turns": 0,
                "messages": 0,
                "identities": 0,
            }
            assert llm.requests == []

            # The `user` field is JSON: any text names a session, echoed percent-encoded.
            for attempt in range(2):
                reply = await http.post(
                    "/v1/chat/completions", json=ask(f"try {attempt}", user="🙂"), headers=AUTH
                )
                assert reply.status_code == 200
                assert reply.headers["x-herald-session-id"] == "%F0%9F%99%82"
        assert await daemon.stop() == 0
    async with Store.open(daemon.database_url) as store:
        session = await store.get_session("api:default:🙂")
        assert session is not None
        contents = [m.content for m in await store.transcript(session.id)]
        assert contents == ["try 0", "You said: try 0", "try 1", "You said: try 1"]
