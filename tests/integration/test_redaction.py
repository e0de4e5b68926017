"""Secrets from outside never reach people: a model endpoint that echoes the refused key in its
401, a tool error quoting a configured token, and a mail server's refusal quoting the mailbox
password leave no configured secret in the API's error, `/health`, the log, the chat, the
store, the outbox, the console or the memory provider (the whole daemon in-process, through
the real SDKs and the fakes)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gateway.contracts.messages import utcnow
from gateway.redact import URL_LOGGERS, Redactor, install
from gateway.store.outbox import Outbox, OutboxStatus
from gateway.store.tables import inbox, messages, turns
from tests.e2e.daemon import free_port
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.dovecot import PASSWORD as MAIL_PASSWORD
from tests.fakes.dovecot import Dovecot
from tests.fakes.llm import FakeLLM, Reply, you_said
from tests.fakes.mem0_server import FakeMem0
from tests.fakes.smtp_server import SmtpServer
from tests.integration.inproc import Herald, running_daemon
from tests.integration.mcp_rig import stdio_server

pytestmark = pytest.mark.timeout(90)

WAIT = 30.0
"""Upper bound of a wait for what the daemon does."""

LLM_KEY = "sk-echoed-llm-key-0123456789abcdef"
API_KEY = "redaction-api-key-0123456789"
CHAT_TOKEN = "4242:chat-platform-secret-token-0123"
MEM0_KEY = "mem0-provider-key-0123456789"
MCP_TOKEN = "mcp-service-token-0123456789"
SECRETS = (LLM_KEY, API_KEY, CHAT_TOKEN, CHAT_TOKEN.split(":")[1], MEM0_KEY, MCP_TOKEN)


@dataclass
class Rig:
    herald: Herald
    llm: FakeLLM
    chat: FakeChatServer
    api: httpx.AsyncClient
    """Carries the API key."""

    async def stored(self) -> str:
        """Every text the daemon stored: messages, turn errors, message outcomes."""
        async with self.herald.store.read() as conn:
            rows = [
                *(await conn.execute(select(messages))).mappings().all(),
                *(await conn.execute(select(turns))).mappings().all(),
                *(await conn.execute(select(inbox))).mappings().all(),
            ]
        return json.dumps([dict(r) for r in rows], default=str)


@asynccontextmanager
async def rig(tmp_path: Path, *, stream_edits: bool = False, **extra: Any) -> AsyncIterator[Rig]:
    port = free_port()
    async with FakeLLM() as llm, FakeChatServer(CHAT_TOKEN) as chat:
        section = {
            "url": chat.base_url,
            "token": CHAT_TOKEN,
            "account": "bot1",
            "allowed_users": ["alice"],
            "stream_edits": stream_edits,
            "poll_timeout": 1,
        }
        config = {
            "api": {"host": "127.0.0.1", "port": port, "key": API_KEY},
            "llm": {
                "base_url": llm.base_url,
                "api_key": LLM_KEY,
                "memory_pass": False,
                "max_retries": 0,
            },
            **extra,
        }
        async with (
            running_daemon(tmp_path, llm, "test", section, port=port, extra=config) as herald,
            httpx.AsyncClient(
                base_url=herald.url,
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=10.0,
                trust_env=False,
            ) as api,
        ):
            yield Rig(herald, llm, chat, api)


def assert_clean(where: str, text: str) -> None:
    for secret in SECRETS:
        at = text.find(secret)
        assert at < 0, f"{secret!r} in {where}: …{text[max(0, at - 120) : at + 40]}…"


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every record at DEBUG, through the redaction `herald run` installs (the SDK loggers'
    levels put back afterwards)."""
    levels = {name: logging.getLogger(name).level for name in URL_LOGGERS}
    caplog.set_level(logging.DEBUG)
    install(Redactor(SECRETS))
    try:
        yield caplog
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


async def test_a_key_echoed_by_the_model_endpoint_reaches_nobody(
    tmp_path: Path, logged: pytest.LogCaptureFixture
) -> None:
    async with rig(tmp_path, stream_edits=True) as r:
        r.llm.responder = lambda _: Reply(
            status=401, error="Incorrect API key provided: {key}. Find your key at …"
        )
        asked = {"messages": [{"role": "user", "content": "hello"}]}
        named = await r.api.post(
            "/v1/chat/completions", json=asked, headers={"X-Herald-Session-Id": "s1"}
        )
        assert named.status_code == 502, named.text
        assert "the API key was refused" in named.text
        streamed = await r.api.post(
            "/v1/chat/completions", json={**asked, "stream": True, "user": "bob"}
        )
        stateless = await r.api.post("/v1/chat/completions", json=asked)
        assert stateless.status_code == 502, stateless.text
        assert r.llm.headers[0]["authorization"] == f"Bearer {LLM_KEY}"  # it was echoed

        r.chat.inject("c1", "hi there", sender_id="alice")
        await r.chat.wait_for_sent(1)
        await r.herald.answered(1)

        with_key = (await r.api.get("/health")).json()
        assert with_key["llm"]["state"] == "rejected"
        assert "***" in with_key["llm"]["error"]
        async with httpx.AsyncClient(base_url=r.herald.url, trust_env=False) as anyone:
            without_key = await anyone.get("/health")
            not_ready = await anyone.get("/ready")
        assert without_key.json() == {"status": "ok"}  # no details without the key
        assert set(not_ready.json()) == {"ready"}

        for where, text in [
            ("the API's 502", named.text),
            ("the streamed error", streamed.text),
            ("the stateless 502", stateless.text),
            ("/health with the key", json.dumps(with_key)),
            ("/health without it", without_key.text),
            ("the chat", json.dumps(r.chat.texts_in("c1"))),
            ("the store", await r.stored()),
            ("the log", logged.text),
        ]:
            assert_clean(where, text)

        # A person pasting a configured secret: the model's echo of it leaves as `***`, in
        # the streamed preview and in the reply that replaces it.
        r.llm.responder = you_said
        r.llm.script(Reply(text=f"You said: is {CHAT_TOKEN} my token?", chunk_delay=0.2))
        r.chat.inject("c1", f"is {CHAT_TOKEN} my token?", sender_id="alice")
        await r.herald.until(lambda: any(e.text.endswith("my token?") for e in r.chat.edits))
        asked = {"messages": [{"role": "user", "content": f"is {LLM_KEY} right?"}]}
        answer = await r.api.post("/v1/chat/completions", json=asked)
        assert answer.status_code == 200, answer.text
        shown = [*(s.text for s in r.chat.sent), *(e.text for e in r.chat.edits)]
        assert "You said: is *** my token?" in shown
        assert_clean("the chat", json.dumps(shown))
        assert answer.json()["choices"][0]["message"]["content"] == "You said: is *** right?"
        r.llm.script(Reply(text=f"You said: is {LLM_KEY} right?", chunks=20))
        streamed = await r.api.post("/v1/chat/completions", json={**asked, "stream": True})
        assert_clean("the streamed answer", streamed.text)
        events = [
            json.loads(line[6:])
            for line in streamed.text.splitlines()
            if line.startswith("data: {")
        ]
        said = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
        )
        assert said == "You said: is *** right?"


async def test_a_tool_error_quoting_a_token_is_redacted_before_shown_stored_or_synced(
    tmp_path: Path,
) -> None:
    async with FakeMem0(key=MEM0_KEY) as mem0:
        memory = {
            "provider": "mem0",
            "mem0": {"base_url": mem0.base_url, "api_key": MEM0_KEY},
            "recall_timeout": 5.0,
            "sync_retry_initial": 0.1,
        }
        # A tool server whose error quotes the token it was configured with.
        mcp = {"servers": {"svc": stdio_server(env={"SERVICE_TOKEN": MCP_TOKEN})}}
        async with rig(tmp_path, memory=memory, mcp=mcp) as r:
            await r.herald.until(mcp_ready(r.api))
            r.llm.script(Reply(tool_calls=[("svc__login", {})]))

            def quote_the_tool(body: dict[str, Any]) -> Reply:
                said = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
                return Reply(text=f"The tool said: {said[-1] if said else '-'}")

            r.llm.responder = quote_the_tool
            r.chat.inject("c1", "please log in", sender_id="alice")  # not an operator
            [shown] = await r.chat.wait_for_sent(1)
            assert "login refused for token" in shown.text
            await mem0.wait_for(lambda: mem0.adds)

            model_saw = json.dumps(r.llm.requests[1]["messages"])
            assert "***" in model_saw
            for where, text in [
                ("the chat", shown.text),
                ("what the model read", model_saw),
                ("the store", await r.stored()),
                ("the memory provider", json.dumps(mem0.adds)),
            ]:
                assert_clean(where, text)


def mcp_ready(api: httpx.AsyncClient) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        servers = (await api.get("/health")).json()["mcp"]
        return bool(servers["svc"]["state"] == "ready")

    return check


async def test_a_send_refusal_quoting_the_password_is_stored_and_shown_masked(
    tmp_path: Path, logged: pytest.LogCaptureFixture
) -> None:
    """The mail server's 550 quotes the mailbox password (as a server echoing the login it
    refused might): the dead-lettered answer's error, the console's deliveries page and the
    log carry the refusal, masked, never the password."""
    # The logged fixture's redactor knows this module's secrets; install the mailbox's too.
    install(Redactor((*SECRETS, MAIL_PASSWORD)))
    refusal = f"550 5.7.1 refused for herald@example.com:{MAIL_PASSWORD}"
    async with (
        Dovecot() as dovecot,
        SmtpServer() as smtp,
        FakeLLM() as llm,
    ):
        section = dovecot.section(
            allowed_senders=["ann@example.com"], idle_renew=30, timeout=5, **smtp.section()
        )
        smtp.refusals.append(refusal)
        port = free_port()
        async with running_daemon(tmp_path, llm, "email", section, port=port) as herald:
            message = EmailMessage()
            message["From"] = "ann@example.com"
            message["To"] = section["address"]
            message["Subject"] = "hello"
            message["Message-ID"] = make_msgid()
            message["Date"] = format_datetime(utcnow())
            message.set_content("are you there?")
            await dovecot.append(message.as_bytes())
            outbox = Outbox(herald.store)
            async with asyncio.timeout(WAIT):
                while not (rows := await outbox.list()) or rows[0].status is not OutboxStatus.DEAD:
                    await asyncio.sleep(0.05)
            error = rows[0].last_error or ""
            async with httpx.AsyncClient(base_url=herald.url, timeout=10.0) as http:
                page = (await http.get("/console/deliveries")).text
    # The positive control: the server's refusal carried the password, and it reached Herald.
    assert MAIL_PASSWORD in refusal
    assert "550 5.7.1 refused" in error, error
    assert "***" in error, error
    assert "550 5.7.1 refused" in page, page[-2000:]
    logs = logged.text
    assert "550 5.7.1 refused" in logs
    for where, text in [("the outbox", error), ("the console", page), ("the log", logs)]:
        at = text.find(MAIL_PASSWORD)
        assert at < 0, f"the password in {where}: …{text[max(0, at - 120) : at + 40]}…"
