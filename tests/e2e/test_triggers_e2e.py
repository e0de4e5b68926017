"""`herald run` with a GitHub-style trigger set up as the README says: a signed
`pull_request` delivery answered 202, the process SIGKILLed during its run, and after the
restart one report in the home chat and one signed POST to a receiver (which fails twice
first); the redelivery runs nothing. Bad signatures and oversized bodies store nothing."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import signal
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from gateway.store import Store
from gateway.store.tables import trigger_runs
from tests.e2e.daemon import Daemon
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "trigger-token"
SECRET = "github-webhook-secret-0123"
RECEIVER_SECRET = "receiver-secret-0123456789"
PR = {
    "action": "opened",
    "number": 7,
    "pull_request": {"title": "Add triggers", "html_url": "https://example.invalid/pr/7"},
    "sender": {"login": "ada"},
}


def github_headers(body: bytes, delivery: str, secret: str = SECRET) -> dict[str, str]:
    """What GitHub sends with a delivery."""
    mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": f"sha256={mac}",
    }


async def test_a_signed_delivery_reports_once_across_a_sigkill(tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        llm.script(Reply(hang=True))  # the first run is cut off by the SIGKILL
        llm.responder = lambda _: Reply(text="PR 7 looks fine")
        chat = await stack.enter_async_context(FakeChatServer(TOKEN))
        receiver = await stack.enter_async_context(WebhookReceiver(RECEIVER_SECRET))
        (tmp_path / "state").mkdir()
        daemon = Daemon(
            tmp_path / "state",
            {
                "log_level": "INFO",
                "instance_id": "herald-e2e",
                "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
                "sessions": {"drain_timeout": 1},
                "delivery": {"backoff_initial": 0.05, "backoff_max": 0.2},
                "home": {"targets": ["test:home"]},
                "platforms": {
                    "test": {
                        "url": chat.base_url,
                        "token": TOKEN,
                        "allowed_users": ["*"],
                        "stream_edits": False,
                        "poll_timeout": 1,
                    }
                },
                "webhooks": {"ci": {"url": f"{receiver.url}/hook", "secret": RECEIVER_SECRET}},
                "triggers": {
                    "github": {
                        "scheme": "github",
                        "secret": SECRET,
                        "prompt": "Review pull request #{{ payload.number }}: "
                        "{{ payload.pull_request.title }} by {{ payload.sender.login }}.",
                        "filter": {
                            "headers": {"X-GitHub-Event": ["pull_request"]},
                            "fields": {"action": ["opened"]},
                        },
                        "targets": ["home", "webhook:ci"],
                        "max_body_bytes": 4096,
                    }
                },
            },
        )
        body = json.dumps(PR).encode()
        hook = f"{daemon.url}/hooks/github"
        try:
            await daemon.start()
            async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
                first = await client.post(hook, content=body, headers=github_headers(body, "g-1"))
                assert first.status_code == 202, first.text
                assert first.json()["status"] == "queued"
                forged = github_headers(body, "g-2", secret="not-the-secret-at-all")
                assert (await client.post(hook, content=body, headers=forged)).status_code == 401
                big = b"{" + b" " * 5000 + b"}"
                huge = await client.post(hook, content=big, headers=github_headers(big, "g-3"))
                assert huge.status_code == 413
            await llm.wait_for_requests(1, timeout=30)
            daemon.signal(signal.SIGKILL)
            await daemon.wait()

            receiver.fail_next(2)
            await daemon.start()
            [sent] = await chat.wait_for_sent(
                lambda s: "PR 7 looks fine" in chat.text_of(s.message_id), 60
            )
            assert sent.chat_id == "home"
            [taken] = await receiver.wait_taken(1, timeout=60)
            assert taken.data["text"] == "PR 7 looks fine"
            assert taken.data["delivery"] == "g-1"
            assert receiver.attempts == 3
            assert receiver.forged == 0
            async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
                again = await client.post(hook, content=body, headers=github_headers(body, "g-1"))
            assert (again.status_code, again.json()["status"]) == (202, "duplicate")
            assert await daemon.stop() == 0
            assert len(llm.requests) == 2  # the cut-off run, then its one rerun
            prompt = llm.requests[-1]["messages"][-1]["content"]
            assert "Review pull request #“7”: “Add triggers” by “ada”." in prompt
            reports = [t for t in chat.texts_in("home") if "PR 7 looks fine" in t]
            assert len(reports) == 1
            assert len(receiver.taken) == 1
            async with (
                Store.open(daemon.database_url, migrate=False) as store,
                store.read() as conn,
            ):
                rows = (await conn.execute(select(trigger_runs))).mappings().all()
            assert [(r["delivery_id"], r["status"], r["attempts"]) for r in rows] == [
                ("g-1", "ok", 2)
            ]
        finally:
            if daemon.process is not None and daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()
