"""Profiles through the whole daemon: bindings choose the agent of a chat (persona, model,
memory namespace, session_search, jobs and their home), the HTTP API picks one by `model`
or header, `/v1/models` lists them. The loopback platform against its fake chat server, the
fake LLM, one daemon for the lot."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy

from gateway.contracts.config import BusyMode
from gateway.contracts.ids import SessionKey
from gateway.cron.targets import HOME_SETTING
from gateway.profiles import Binding
from gateway.sessions import ACKS
from gateway.store.profiles import StoredBindings
from tests.e2e.daemon import free_port
from tests.fakes.chat_server import FakeChatServer, Sent
from tests.fakes.clock import FakeClock
from tests.fakes.honcho_server import FakeHoncho
from tests.fakes.llm import FakeLLM, Reply
from tests.integration.inproc import Herald, running_daemon
from tests.integration.media_rig import image_parts, picture

pytestmark = pytest.mark.timeout(120)

TOKEN = "4242:loopback-secret"
KEY = "api-secret"
HOOK_SECRET = "a-trigger-secret-0123456789"
WAIT = 15.0
WORK_SOUL = "You are Ledger, the work assistant."
FAMILY_SOUL = "You are Hearth, the family assistant."
WORK_TOOLS = ("memory", "session_search", "schedule_job")
PROFILES = {
    "work": {
        "soul": WORK_SOUL,
        "llm": {"model": "work-model"},
        "home": "test:work-home",
        "tools": list(WORK_TOOLS),
    },
    "family": {"soul": FAMILY_SOUL, "llm": {"model": "family-model"}},
}
BINDINGS = [
    # Every chat of the bot account answers as `work` …
    {"profile": "work", "platform": "test", "account": "bot1"},
    # … but one chat of it, more specific, as `family`; and one as the default profile.
    {"profile": "family", "platform": "test", "account": "bot1", "chat": "fam"},
    {"profile": "default", "platform": "test", "chat": "plain"},
]


@dataclass
class Rig:
    herald: Herald
    chat: FakeChatServer
    llm: FakeLLM
    api: httpx.AsyncClient

    async def say(self, chat_id: str, text: str, sender: str = "alice") -> Sent:
        """`text` from `sender` in a private chat `chat_id`; the first reply to it."""
        before = len([s for s in self.chat.sent if s.chat_id == chat_id])
        self.chat.inject(chat_id, text, sender_id=sender)
        await self.chat.wait_for_sent(
            lambda s: (
                s.chat_id == chat_id
                and len([x for x in self.chat.sent if x.chat_id == chat_id]) > before
            ),
            WAIT,
        )
        return [s for s in self.chat.sent if s.chat_id == chat_id][before]

    def asked(self, text: str) -> dict[str, Any]:
        """The first request to the model whose last message contains `text`."""
        for body in self.llm.requests:
            if text in str(body["messages"][-1].get("content")):
                return body
        raise AssertionError(f"the model was never asked {text!r}")

    def tool_result(self, text: str) -> str:
        """The content of the first tool result containing `text` the model was sent."""
        for body in self.llm.requests:
            for message in body["messages"]:
                if message["role"] == "tool" and text in str(message["content"]):
                    return str(message["content"])
        raise AssertionError(f"no tool result with {text!r}")


def system(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


async def bindings_table(rig: Rig, name: str, to: str) -> None:
    """Rename the stored bindings' table: away, every read of the bindings fails as a
    database that lost it would."""
    async with rig.herald.store.write() as conn:
        await conn.execute(sqlalchemy.text(f"ALTER TABLE {name} RENAME TO {to}"))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with rigged(tmp_path) as r:
        yield r


@contextlib.asynccontextmanager
async def rigged(
    tmp_path: Path, *, config: dict[str, Any] | None = None, **section_keys: Any
) -> AsyncIterator[Rig]:
    """The daemon of this module's profiles and bindings (`section_keys` added to the
    loopback platform's section; `config`: top-level sections merged over the module's)."""
    port = free_port()
    async with FakeLLM() as llm, FakeChatServer(TOKEN) as chat:
        section = {
            "url": chat.base_url,
            "token": TOKEN,
            "account": "bot1",
            "allowed_users": ["*"],
            "stream_edits": False,
            "poll_timeout": 1,
            **section_keys,
        }
        extra: dict[str, Any] = {
            "api": {"host": "127.0.0.1", "port": port, "key": KEY},
            "cron": {"poll_interval": 0.1},
            "access": {"operators": ["test:alice"]},
            "home": {"targets": ["test:default-home"]},
            "llm": {
                "base_url": llm.base_url,
                "api_key": "k",
                "memory_pass": False,
                "model": "default-model",
            },
            "profiles": PROFILES,
            "bindings": BINDINGS,
            "triggers": {
                "gh": {
                    "scheme": "github",
                    "secret": HOOK_SECRET,
                    "prompt": "Review PR {{ payload.number }}",
                    "profile": "work",
                }
            },
        }
        for name, keys in (config or {}).items():
            extra[name] = {**extra.get(name, {}), **keys}
        clock = FakeClock(datetime(2026, 11, 23, 7, 0, tzinfo=UTC))
        async with (
            running_daemon(
                tmp_path, llm, "test", section, port=port, extra=extra, cron_clock=clock
            ) as herald,
            httpx.AsyncClient(
                base_url=herald.url,
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=10.0,
                trust_env=False,
            ) as api,
        ):
            yield Rig(herald, chat, llm, api)


async def test_each_bound_chat_answers_with_its_profiles_persona_model_and_memory(
    rig: Rig,
) -> None:
    await rig.say("w1", "first to work")
    work = rig.asked("first to work")
    assert work["model"] == "work-model"
    assert WORK_SOUL in system(work)
    assert FAMILY_SOUL not in system(work)
    # The profile's tool list narrows what the model is offered.
    assert {t["function"]["name"] for t in work["tools"]} == set(WORK_TOOLS)
    await rig.say("fam", "first to family")
    family = rig.asked("first to family")
    assert family["model"] == "family-model"
    assert FAMILY_SOUL in system(family)
    assert WORK_SOUL not in system(family)
    assert "send_message" in {t["function"]["name"] for t in family["tools"]}
    await rig.say("plain", "first to default")
    plain = rig.asked("first to default")
    assert plain["model"] == "default-model"
    assert WORK_SOUL not in system(plain)
    assert FAMILY_SOUL not in system(plain)

    # A memory written through `work` …
    rig.llm.script(
        Reply(
            tool_calls=[
                ("memory", {"action": "add", "target": "user", "content": "sails on Sundays"})
            ]
        ),
        Reply("noted"),
    )
    await rig.say("w1", "remember: I sail on Sundays")
    # … is in the prompt of a new `work` session of the same person, and in no other
    # profile's (a new family session, and the default profile's).
    await rig.say("w2", "hello work again")
    assert "sails on Sundays" in system(rig.asked("hello work again"))
    await rig.say("fam2", "hello family again")
    # fam2 is a chat of bot1 too: `work` answers there (the family binding names "fam").
    assert rig.asked("hello family again")["model"] == "work-model"
    rig.llm.script(Reply(tool_calls=[("session_search", {"query": "sail"})]), Reply("none"))
    await rig.say("fam", "what do I do on Sundays?")
    assert "sails on Sundays" not in system(rig.asked("what do I do on Sundays?"))
    # session_search stays within the profile: family finds nothing of the work chat …
    assert "No messages match 'sail'" in rig.tool_result("No messages match")
    # … while work finds it.
    rig.llm.script(Reply(tool_calls=[("session_search", {"query": "Sundays"})]), Reply("found"))
    await rig.say("w2", "search my work chats")
    assert "I sail on Sundays" in rig.tool_result("## test:bot1:w1")

    # A binding stored by `herald profiles bind` (the table every instance reads) changes
    # who answers at the next message; the chat's session starts anew with that profile.
    await StoredBindings(rig.herald.store).bind(
        Binding("family", "test", "bot1", "w1", source="cli")
    )
    await rig.say("w1", "who answers now?")
    now = rig.asked("who answers now?")
    assert now["model"] == "family-model"
    assert FAMILY_SOUL in system(now)
    assert "first to work" not in str(now["messages"])  # not the work conversation


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("steer", "after rebinding"),
        ("queue", "/steer after rebinding"),
        ("collect", "/steer after rebinding"),
        ("interrupt", "/steer after rebinding"),
    ],
)
async def test_a_message_after_a_rebinding_never_joins_the_old_profiles_turn(
    tmp_path: Path, mode: str, said: str
) -> None:
    """A turn of `work` runs in w1 when w1 is bound to `family`; the next message of w1 (in
    busy mode steer, or `/steer TEXT` in any mode) is not steered into the work turn (work's
    model never reads it) but answered in a turn of its own, by family, in a new session."""
    async with rigged(tmp_path, busy_mode=mode) as rig:
        gate = asyncio.Event()
        rig.llm.script(
            Reply(tool_calls=[("session_search", {"query": "anything"})], gate=gate),
            Reply("work is done"),
            Reply("family answers"),
        )
        rig.chat.inject("w1", "start some work", sender_id="alice")
        await rig.llm.wait_for_requests(1, WAIT)
        await StoredBindings(rig.herald.store).bind(
            Binding("family", "test", "bot1", "w1", source="cli")
        )
        rig.chat.inject("w1", said, sender_id="alice")

        async def stored() -> bool:
            return any(r["text"] == "after rebinding" for r in await rig.herald.rows())

        await rig.herald.until(stored, WAIT)
        gate.set()  # the tool runs; its boundary is where a steered message would join
        await rig.chat.wait_for_sent(lambda s: s.text == "family answers", WAIT)
        work = [b for b in rig.llm.requests if b["model"] == "work-model"]
        assert len(work) == 2
        assert not any("after rebinding" in str(b["messages"]) for b in work)
        family = rig.asked("after rebinding")
        assert family["model"] == "family-model"
        assert FAMILY_SOUL in system(family)
        assert "start some work" not in str(family["messages"])  # a new session
        rows = {r["text"]: r for r in await rig.herald.rows()}
        assert rows["after rebinding"]["outcome"] == "answered"
        assert rows["after rebinding"]["turn_id"] != rows["start some work"]["turn_id"]
        # Told it waits (queued), never that it joins the answer being written.
        told = [m.text for m in rig.chat.sent if m.chat_id == "w1"]
        assert ACKS[BusyMode.STEER] not in told
        assert ACKS[BusyMode.QUEUE] in told


async def test_a_message_whose_binding_cannot_be_read_waits_and_is_answered_once(
    tmp_path: Path,
) -> None:
    """Busy mode steer, w1 bound to `work` throughout: while a work turn runs, the stored
    bindings cannot be read when a message of w1 arrives (their table is gone for a moment).
    It is not steered in (fails closed) but waits as a plain message, and is answered exactly
    once, in the next turn."""
    async with rigged(tmp_path, busy_mode="steer") as rig:
        gate = asyncio.Event()
        rig.llm.script(
            Reply(tool_calls=[("session_search", {"query": "anything"})], gate=gate),
            Reply("work is done"),
            Reply("answered on its own"),
        )
        rig.chat.inject("w1", "start some work", sender_id="alice")
        await rig.llm.wait_for_requests(1, WAIT)
        await bindings_table(rig, "profile_bindings", "profile_bindings_away")
        rig.chat.inject("w1", "while unreadable", sender_id="alice")

        async def waits_plain() -> bool:
            rows = [r for r in await rig.herald.rows() if r["text"] == "while unreadable"]
            return bool(rows) and rows[0]["status"] == "pending" and not rows[0]["steer"]

        await rig.herald.until(waits_plain, WAIT)
        await bindings_table(rig, "profile_bindings_away", "profile_bindings")
        gate.set()
        await rig.chat.wait_for_sent(lambda s: s.text == "answered on its own", WAIT)
        asked = [b for b in rig.llm.requests if "while unreadable" in str(b["messages"])]
        assert len(asked) == 1
        assert "while unreadable" in str(asked[0]["messages"][-1]["content"])
        rows = {r["text"]: r for r in await rig.herald.rows()}
        assert rows["while unreadable"]["outcome"] == "answered"
        assert len(rig.llm.requests) == 3


async def test_a_message_waiting_out_an_outage_is_read_by_the_profile_rebound_since(
    tmp_path: Path,
) -> None:
    """A message of w1 (bound to `work`) is tried while the model is unreachable, so it waits,
    stored in work's session; w1 is bound to `family` meanwhile. The next try is family's, in
    a new session: family reads the message (stored again there, as `/new` does), and never
    work's conversation."""
    config = {
        "sessions": {"drain_timeout": 2, "ack_interval": 0, "model_retry_initial": 0.05},
        "llm": {"max_retries": 0},
    }
    async with rigged(tmp_path, config=config) as rig:
        await rig.say("w1", "earlier work")
        gate = asyncio.Event()
        rig.llm.script(Reply(status=503, gate=gate), Reply("family answers"))
        rig.chat.inject("w1", "the waiting question", sender_id="alice")
        await rig.llm.wait_for_requests(2, WAIT)
        await StoredBindings(rig.herald.store).bind(
            Binding("family", "test", "bot1", "w1", source="cli")
        )
        gate.set()  # the work model fails: the message waits for the next try
        await rig.chat.wait_for_sent(lambda s: s.text == "family answers", WAIT)
        family = rig.llm.requests[-1]
        assert family["model"] == "family-model"
        assert "the waiting question" in str(family["messages"])
        assert "earlier work" not in str(family["messages"])
        rows = {r["text"]: r for r in await rig.herald.rows()}
        assert rows["the waiting question"]["outcome"] == "answered"


async def test_a_job_of_a_profile_runs_as_it_and_reports_to_its_home(rig: Rig) -> None:
    rig.llm.script(
        Reply(
            tool_calls=[
                (
                    "schedule_job",
                    {
                        "action": "create",
                        "prompt": "weekly work report",
                        "schedule": "every 30m",
                        "targets": ["home"],
                    },
                )
            ]
        ),
        Reply("scheduled"),
    )
    await rig.say("w1", "schedule the work report")
    [job] = (await rig.api.get("/api/jobs")).json()["jobs"]
    assert job["targets"] == ["home"]
    assert job["profile"] == "work"  # made in a turn of work, so a job of work
    queued = await rig.api.post(f"/api/jobs/{job['id']}/run")
    assert queued.status_code == 202, queued.text
    [_report] = await rig.chat.wait_for_sent(
        lambda s: s.chat_id == "work-home" and "weekly work report" in s.text, WAIT
    )
    run = rig.asked("weekly work report")
    assert run["model"] == "work-model"
    assert WORK_SOUL in system(run)
    assert not [s for s in rig.chat.sent if s.chat_id == "default-home"]
    # Another profile's agent does not see (nor change) the jobs of work.
    rig.llm.script(Reply(tool_calls=[("schedule_job", {"action": "list"})]), Reply("none"))
    await rig.say("fam", "which jobs do I have?")
    assert "No scheduled jobs." in rig.tool_result("No scheduled jobs")
    # Through the jobs API a job names its profile; an unknown one is refused.
    bad = await rig.api.post(
        "/api/jobs", json={"prompt": "p", "schedule": "every 30m", "profile": "nope"}
    )
    assert bad.status_code == 400
    assert "no profile 'nope' (profiles: default, work, family)" in bad.text
    made = await rig.api.post(
        "/api/jobs", json={"prompt": "p", "schedule": "every 30m", "profile": "family"}
    )
    assert made.status_code == 201, made.text
    assert made.json()["profile"] == "family"


async def test_a_trigger_of_a_profile_runs_as_it_and_reports_to_its_home(rig: Rig) -> None:
    body = json.dumps({"number": 7}).encode()
    mac = hmac.new(HOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
    posted = await rig.api.post(
        "/hooks/gh",
        content=body,
        headers={
            "X-Hub-Signature-256": f"sha256={mac}",
            "X-GitHub-Delivery": "d1",
            "X-GitHub-Event": "pull_request",
            "Content-Type": "application/json",
        },
    )
    assert posted.status_code == 202, posted.text
    await rig.chat.wait_for_sent(
        lambda s: s.chat_id == "work-home" and "Review PR “7”" in s.text, WAIT
    )
    run = rig.asked("Review PR “7”")
    assert run["model"] == "work-model"
    assert WORK_SOUL in system(run)
    assert not [s for s in rig.chat.sent if s.chat_id == "default-home"]


async def test_the_api_lists_the_profiles_and_routes_by_model(rig: Rig) -> None:
    sdk = openai.AsyncOpenAI(
        base_url=f"{rig.herald.url}/v1", api_key=KEY, max_retries=0, timeout=30.0
    )
    async with sdk:
        models = [m.id async for m in sdk.models.list()]
        assert models == ["herald", "herald:default", "herald:work", "herald:family"]
        answer = await sdk.chat.completions.create(
            model="herald:work",
            messages=[{"role": "user", "content": "api to work"}],
            extra_headers={"X-Herald-Session-Id": "s1"},
        )
        assert answer.choices[0].message.content == "You said: api to work"
        assert rig.asked("api to work")["model"] == "work-model"
        assert WORK_SOUL in system(rig.asked("api to work"))
        # The same session name under another profile is another conversation.
        await sdk.chat.completions.create(
            model="herald",
            messages=[{"role": "user", "content": "api to default"}],
            extra_headers={"X-Herald-Session-Id": "s1"},
        )
        default = rig.asked("api to default")
        assert default["model"] == "default-model"
        assert "api to work" not in str(default["messages"])
        # /new in work's session starts work's next conversation (not one of the default).
        await sdk.chat.completions.create(
            model="herald:work",
            messages=[{"role": "user", "content": "/new"}],
            extra_headers={"X-Herald-Session-Id": "s1"},
        )
        renewed = await rig.herald.store.get_session(SessionKey("api:work:s1"))
        assert renewed is not None
        assert (renewed.profile, renewed.epoch) == ("work", 1)
        # The header picks one too; a stateless request as well.
        await sdk.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "stateless to family"}],
            extra_headers={"X-Herald-Profile": "family"},
        )
        assert rig.asked("stateless to family")["model"] == "family-model"
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(
                model="herald:nope", messages=[{"role": "user", "content": "hi"}]
            )
        assert "no profile 'nope'" in str(refused.value)
        assert "herald:work" in str(refused.value)
        with pytest.raises(openai.BadRequestError) as both:
            await sdk.chat.completions.create(
                model="herald:work",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Herald-Profile": "family"},
            )
        assert "name one profile" in str(both.value)
    assert not [b for b in rig.llm.requests if b["messages"][-1].get("content") == "hi"]


async def test_only_the_default_namespace_reaches_the_memory_provider(tmp_path: Path) -> None:
    port = free_port()
    async with FakeLLM() as llm, FakeChatServer(TOKEN) as chat, FakeHoncho() as honcho:
        section = {
            "url": chat.base_url,
            "token": TOKEN,
            "allowed_users": ["*"],
            "stream_edits": False,
            "poll_timeout": 1,
        }
        extra = {
            "api": {"host": "127.0.0.1", "port": port},
            "memory": {
                "provider": "honcho",
                "honcho": {"base_url": honcho.base_url, "api_key": honcho.key},
                "recall_timeout": 5.0,
                "sync_retry_initial": 0.1,
                "sync_retry_max": 0.3,
            },
            "profiles": {"work": {"soul": WORK_SOUL}},
            "bindings": [{"profile": "work", "platform": "test", "chat": "w"}],
        }
        async with running_daemon(tmp_path, llm, "test", section, port=port, extra=extra):
            chat.inject("w", "The merger is called Project Falcon", sender_id="alice")
            await chat.wait_for_sent(1)
            chat.inject("d", "My cat is called Tom", sender_id="alice")
            await chat.wait_for_sent(2)
            # Syncs of one person go in order: once the default chat's turn is synced, the
            # work turn before it would have been too.
            await honcho.wait_for(lambda: "My cat is called Tom" in str(honcho.messages))
            chat.inject("w", "What is my cat called?", sender_id="alice")
            await chat.wait_for_sent(3)
    assert "Falcon" not in str(honcho.messages)
    work_turns = [b for b in llm.requests if WORK_SOUL in system(b)]
    assert len(work_turns) == 2
    # No recall in a profile of its own namespace: the default profile's memory stays there.
    assert "<recalled-memory" not in str(work_turns[-1]["messages"])


async def test_cron_lists_only_the_jobs_of_the_chats_profile(rig: Rig) -> None:
    rig.llm.script(
        Reply(
            tool_calls=[
                (
                    "schedule_job",
                    {"action": "create", "prompt": "work digest", "schedule": "every 30m"},
                )
            ]
        ),
        Reply("scheduled"),
    )
    await rig.say("w1", "schedule the work digest")
    [job] = (await rig.api.get("/api/jobs")).json()["jobs"]
    assert job["profile"] == "work"
    # The same person's /cron in a chat of another profile does not show work's job …
    assert job["id"] not in (await rig.say("fam", "/cron")).text
    # … in a chat of work it does.
    assert job["id"] in (await rig.say("w2", "/cron")).text
    # A job of work reporting to work's home is listed in that chat (work's home, not the
    # default profile's).
    homed = await rig.api.post(
        "/api/jobs",
        json={"prompt": "p", "schedule": "every 30m", "targets": ["home"], "profile": "work"},
    )
    assert homed.status_code == 201, homed.text
    assert homed.json()["id"] in (await rig.say("work-home", "/cron")).text
    # Over the API too: the owner's job of family is listed in a session of family only.
    made = await rig.api.post(
        "/api/jobs", json={"prompt": "family digest", "schedule": "every 30m", "profile": "family"}
    )
    assert made.status_code == 201, made.text
    job = made.json()
    for model, shown in (("herald:work", False), ("herald:family", True)):
        answer = await rig.api.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "/cron"}]},
            headers={"X-Herald-Session-Id": "c1"},
        )
        assert answer.status_code == 200, answer.text
        assert (job["id"] in answer.text) is shown, (model, answer.text)


async def test_a_stored_binding_of_a_removed_profile_is_skipped_saying_so_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    # `herald profiles bind` checked the profile, then the operator removed it from the config.
    await StoredBindings(rig.herald.store).bind(Binding("gone", "test", "bot1", "w9", source="cli"))
    with caplog.at_level(logging.WARNING, logger="gateway.agents"):
        await rig.say("w9", "first while gone")
        await rig.say("w9", "second while gone")
    # The next binding that matches answers (work, by the account) …
    assert rig.asked("second while gone")["model"] == "work-model"
    # … and the log says once which stored binding names no profile and how to remove it.
    said = [r.getMessage() for r in caplog.records if "'gone'" in r.getMessage()]
    assert len(said) == 1, said
    assert "herald profiles unbind --platform test --account bot1 --chat w9" in said[0]


async def test_a_profiles_model_gets_pictures_only_when_it_can_see(tmp_path: Path) -> None:
    """`vision` is a key of the model: a profile whose model cannot see is told a picture
    came (no image parts), and one whose model can is shown it, whatever the default's."""
    png = base64.b64encode(picture(64, 48)).decode()
    port = free_port()
    async with FakeLLM() as llm, FakeChatServer(TOKEN) as chat:
        section = {"url": chat.base_url, "token": TOKEN, "allowed_users": ["*"]}
        extra = {
            "api": {"host": "127.0.0.1", "port": port},
            "llm": {"base_url": llm.base_url, "memory_pass": False, "vision": True},
            "profiles": {
                "blind": {"llm": {"model": "text-only", "vision": False}},
                "sees": {"llm": {"model": "sees-model"}},
            },
        }
        async with (
            running_daemon(tmp_path, llm, "test", section, port=port, extra=extra) as herald,
            httpx.AsyncClient(base_url=herald.url, timeout=30.0, trust_env=False) as http,
        ):
            for model in ("herald:blind", "herald:sees"):
                parts = [
                    {"type": "text", "text": f"what is this, {model}?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                ]
                answer = await http.post(
                    "/v1/chat/completions",
                    json={
                        "model": model,
                        "user": "ann",
                        "messages": [{"role": "user", "content": parts}],
                    },
                )
                assert answer.status_code == 200, answer.text
    blind = next(b for b in llm.requests if b["model"] == "text-only")
    sees = next(b for b in llm.requests if b["model"] == "sees-model")
    assert image_parts(blind) == []
    assert len(image_parts(sees)) == 1


async def test_sethome_in_a_chat_of_another_profile_changes_nothing_and_says_why(rig: Rig) -> None:
    # alice is an operator; w1 answers as work, whose home is set in the config.
    said = await rig.say("w1", "/sethome")
    assert "profiles.work.home" in said.text
    assert await rig.herald.store.get_setting(HOME_SETTING) is None
    # In a chat of the default profile /sethome does what it did.
    assert "Scheduled reports will come to this chat" in (await rig.say("plain", "/sethome")).text
    assert await rig.herald.store.get_setting(HOME_SETTING) == "test:plain"


async def test_health_names_a_profiles_model_failing_apart_from_the_default(
    tmp_path: Path,
) -> None:
    """A profile's broken model shows under its name in /health; the default model's state
    stays its own (one outage is not reported as the other's)."""
    port = free_port()
    closed = free_port()
    async with FakeLLM() as llm, FakeChatServer(TOKEN) as chat:
        section = {"url": chat.base_url, "token": TOKEN, "allowed_users": ["*"]}
        extra = {
            "api": {"host": "127.0.0.1", "port": port, "key": KEY},
            "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
            "profiles": {
                "broken": {
                    "llm": {
                        "base_url": f"http://127.0.0.1:{closed}/v1",
                        "api_key": "broken-key",
                        "model": "gone-model",
                        "max_retries": 0,
                        "connect_timeout": 0.5,
                    }
                }
            },
        }
        async with (
            running_daemon(tmp_path, llm, "test", section, port=port, extra=extra) as herald,
            httpx.AsyncClient(
                base_url=herald.url,
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=30.0,
                trust_env=False,
            ) as http,
        ):
            for model in ("herald", "herald:broken"):
                await http.post(
                    "/v1/chat/completions",
                    json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                )
            body = (await http.get("/health")).json()
    assert body["llm"]["state"] == "ok", body["llm"]
    broken = body["llm"]["profiles"]["broken"]
    assert broken["model"] == "gone-model"
    assert broken["state"] == "unreachable"
    assert "broken-key" not in json.dumps(body)


async def test_odd_profile_names_in_the_model_or_header_are_refused_briefly(rig: Rig) -> None:
    for headers, model in (
        ({"X-Herald-Profile": "../../etc/passwd"}, "herald"),
        ({"X-Herald-Profile": "w" * 4000}, "herald"),
        ({}, "herald:" + "ü" * 100_000),
        ({}, "herald:work/../default"),
        ({}, "herald:WORK"),
        ({"X-Herald-Profile": "work"}, "herald:" + "x" * 100_000),
    ):
        refused = await rig.api.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "odd"}]},
            headers=headers,
        )
        assert refused.status_code == 400, refused.text
        assert len(refused.text) < 600, refused.text[:200]
        # Says which models there are (a header over 256 characters: that it is too long).
        assert any(
            said in refused.text for said in ("herald:work", "longer than 256", "name one profile")
        )
    assert not [b for b in rig.llm.requests if "odd" in str(b["messages"][-1])]
