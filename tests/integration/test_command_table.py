"""One command table for every surface: over the HTTP API (and so in `herald chat`) a command
is answered at once from the same table as a platform chat's, never sent to the model; a
command that acts only in a platform chat says where it does; a skill command is expanded
everywhere (the whole daemon in-process, the real `openai` client, the fake model)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from sqlalchemy import select

from gateway.commands import API_HELP_TEXT, HELP_TEXT, TABLE, Command, Surface, not_here
from gateway.store.tables import messages
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.llm import FakeLLM, Reply
from tests.integration.inproc import Herald, running_daemon

pytestmark = pytest.mark.timeout(90)

API_KEY = "commands-api-key-0123456789"
TOKEN = "4242:commands-chat-token-0123"


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def herald(tmp_path: Path, llm: FakeLLM) -> AsyncIterator[Herald]:
    async with FakeChatServer(TOKEN) as chat:
        section = {"url": chat.base_url, "token": TOKEN, "account": "bot1", "poll_timeout": 1}
        extra = {"api": {"host": "127.0.0.1", "key": API_KEY}}
        async with running_daemon(tmp_path, llm, "test", section, extra=extra) as h:
            yield h


def client(herald: Herald, session: str | None = "ada") -> openai.AsyncOpenAI:
    headers = {"X-Herald-Session-Id": session} if session else {}
    return openai.AsyncOpenAI(
        base_url=f"{herald.url}/v1", api_key=API_KEY, max_retries=0, default_headers=headers
    )


async def say(c: openai.AsyncOpenAI, text: str) -> str:
    done = await c.chat.completions.create(
        model="herald", messages=[{"role": "user", "content": text}]
    )
    return done.choices[0].message.content or ""


async def say_streamed(c: openai.AsyncOpenAI, text: str) -> str:
    stream = await c.chat.completions.create(
        model="herald",
        messages=[{"role": "user", "content": text}],
        stream=True,
        stream_options={"include_usage": True},
    )
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def test_every_command_has_one_row_and_every_surface_a_help() -> None:
    assert set(TABLE) == set(Command)
    for command, spec in TABLE.items():
        assert spec.surfaces, command
        for surface in Surface:
            if surface not in spec.surfaces:
                assert spec.elsewhere, f"/{command} must say why not {surface}"
    assert "/stop" in HELP_TEXT
    assert "/status" in HELP_TEXT
    assert "/status" in API_HELP_TEXT
    # What does not act over the API is named as acting elsewhere, not offered.
    assert "/stop —" not in API_HELP_TEXT
    assert "/stop" in API_HELP_TEXT.splitlines()[-1]


async def test_commands_over_the_api_answer_without_the_model(herald: Herald, llm: FakeLLM) -> None:
    async with client(herald) as c:
        llm.script(Reply(text="hi there"))
        assert await say(c, "hello") == "hi there"
        calls = len(llm.requests)

        status = await say(c, "/status")
        assert status.startswith("Session api:default:ada\nConversation #1, 2 messages")
        assert "Idle" in status
        assert await say(c, "/help") == API_HELP_TEXT
        skills = await say_streamed(c, "/skills")
        assert skills.startswith("Skills (")
        assert "/daily-briefing" in skills
        assert (await say(c, "/cron")).startswith("No scheduled jobs")

        for command in (Command.STOP, Command.MODE, Command.SETHOME, Command.APPROVE):
            reply = await say(c, f"/{command} now")
            assert reply == not_here(command, Surface.API)
            assert "works in a platform chat" in reply
        assert await say_streamed(c, "/steer faster") == not_here(Command.STEER, Surface.API)

        assert "Started a new conversation" in await say(c, "/new")
        assert len(llm.requests) == calls  # no command reached the model
        llm.script(Reply(text="fresh"))
        assert await say(c, "after the reset") == "fresh"
        assert "Conversation #2, 2 messages" in await say(c, "/status")

    # Nothing but the two exchanges was stored: commands are not history.
    async with herald.store.read() as conn:
        texts = list(await conn.scalars(select(messages.c.content).order_by(messages.c.id)))
    assert texts == ["hello", "hi there", "after the reset", "fresh"]


async def test_a_skill_command_is_expanded_over_the_api(herald: Herald, llm: FakeLLM) -> None:
    async with client(herald) as c:
        llm.script(Reply(text="set for 7"))
        assert await say(c, "/daily_briefing at 7") == "set for 7"
    users = [m for m in llm.requests[-1]["messages"] if m["role"] == "user"]
    assert '<skill name="daily-briefing">' in str(users[-1]["content"])


async def test_a_stateless_request_is_told_which_commands_need_a_session(
    herald: Herald, llm: FakeLLM
) -> None:
    async with client(herald, session=None) as c:
        assert "applies to a named session" in await say(c, "/status")
        assert "applies to a named session" in await say(c, "/new")
        assert await say(c, "/help") == API_HELP_TEXT
        assert await say(c, "/stop") == not_here(Command.STOP, Surface.API)
    assert llm.requests == []


async def test_another_users_session_gets_409_for_a_command_too(herald: Herald) -> None:
    async with client(herald) as c:
        await say(c, "/status")  # creates ada's session for the key holder
    other = openai.AsyncOpenAI(
        base_url=f"{herald.url}/v1",
        api_key=API_KEY,
        max_retries=0,
        default_headers={"X-Herald-Session-Id": "ada", "X-Herald-User-Id": "mallory"},
    )
    async with other:
        with pytest.raises(openai.ConflictError):
            await say(other, "/new")
    async with client(herald) as c:
        assert "Conversation #1" in await say(c, "/status")  # /new did not happen
