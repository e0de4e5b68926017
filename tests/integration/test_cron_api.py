"""Scheduled jobs through the whole daemon: the HTTP API (`/api/jobs`), the loopback
platform against its fake chat server, the fake LLM, and a fake clock for the scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.daemon import free_port
from tests.fakes.chat_server import FakeChatServer, Sent
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, Reply
from tests.integration.inproc import Herald, running_daemon

pytestmark = pytest.mark.timeout(90)

TOKEN = "4242:loopback-secret"
KEY = "api-secret"
START = datetime(2026, 11, 23, 7, 0, tzinfo=UTC)
"""A Monday; 09:00 in Berlin is 08:00 UTC."""
NINE = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
WAIT = 15.0


@dataclass
class Rig:
    herald: Herald
    chat: FakeChatServer
    llm: FakeLLM
    clock: FakeClock
    api: httpx.AsyncClient

    async def say(self, chat_id: str, text: str, sender: str | None = None) -> Sent:
        """Send `text` from a user in a private chat; return the first reply to it."""
        before = len([s for s in self.chat.sent if s.chat_id == chat_id])
        self.chat.inject(chat_id, text, sender_id=sender or chat_id)
        await self.chat.wait_for_sent(
            lambda s: (
                s.chat_id == chat_id
                and len([x for x in self.chat.sent if x.chat_id == chat_id]) > before
            ),
            WAIT,
        )
        return [s for s in self.chat.sent if s.chat_id == chat_id][before]

    async def job(self, job_id: str, predicate: Any) -> dict[str, Any]:
        """Poll `GET /api/jobs/{id}` until `predicate(body)` holds."""
        async with asyncio.timeout(WAIT):
            while True:
                body: dict[str, Any] = (await self.api.get(f"/api/jobs/{job_id}")).json()
                if predicate(body):
                    return body
                await asyncio.sleep(0.05)


@asynccontextmanager
async def daemon(tmp_path: Path, **config: Any) -> AsyncIterator[Rig]:
    port = free_port()
    clock = FakeClock(START)
    async with FakeLLM() as llm, FakeChatServer(TOKEN) as chat:
        section = {
            "url": chat.base_url,
            "token": TOKEN,
            "account": "bot1",
            "allowed_users": ["*"],
            "stream_edits": False,
            "poll_timeout": 1,
        }
        extra = {
            "api": {"host": "127.0.0.1", "port": port, "key": KEY},
            "cron": {"poll_interval": 0.1},
            "access": {"operators": ["test:owner"]},
            **config,
        }
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
            yield Rig(herald, chat, llm, clock, api)


def error(response: httpx.Response) -> str:
    message: str = response.json()["error"]["message"]
    return message


async def test_a_job_from_the_api_is_delivered_to_the_home_channel(tmp_path: Path) -> None:
    async with daemon(tmp_path) as rig:
        sethome = await rig.say("home-chat", "/sethome", sender="owner")
        assert "Scheduled reports will come to this chat (test:home-chat)" in sethome.text
        created = await rig.api.post(
            "/api/jobs",
            json={
                "name": "changes",
                "prompt": "summarise what changed",
                "schedule": "0 9 * * 1-5",
                "timezone": "Europe/Berlin",
            },
        )
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["targets"] == ["home"]
        assert job["next_run_at"] == NINE.isoformat()
        rig.clock.set(NINE)
        [report] = await rig.chat.wait_for_sent(
            lambda s: s.chat_id == "home-chat" and "summarise what changed" in s.text, WAIT
        )
        assert report.text.startswith("⏰ changes\n\nYou said:")
        listing = await rig.say("home-chat", "/cron", sender="owner")
        assert f"{job['id']} “changes”" in listing.text
        body = await rig.job(
            job["id"], lambda b: b["runs"] and b["runs"][0]["delivery_status"] == "delivered"
        )
        [run] = body["runs"]
        assert run["status"] == "ok"
        assert run["scheduled_for"] == NINE.isoformat()
        assert run["trigger"] == "schedule"
        assert body["next_run_at"] == (NINE + timedelta(days=1)).isoformat()
        # Run now, outside the schedule.
        queued = await rig.api.post(f"/api/jobs/{job['id']}/run")
        assert queued.status_code == 202
        assert queued.json()["status"] == "queued"
        await rig.job(
            job["id"],
            lambda b: (
                len(b["runs"]) == 2 and all(r["delivery_status"] == "delivered" for r in b["runs"])
            ),
        )


async def test_cron_in_a_configured_home_lists_the_jobs_reporting_there(tmp_path: Path) -> None:
    async with daemon(tmp_path, home={"targets": ["test:cfg-home"]}) as rig:
        made = await rig.api.post("/api/jobs", json={"prompt": "report", "schedule": "every 30m"})
        assert made.status_code == 201, made.text
        job = made.json()
        assert job["targets"] == ["home"]
        # No /sethome: the home is the first of home.targets, and its chat sees the job.
        listing = await rig.say("cfg-home", "/cron", sender="someone")
        assert job["id"] in listing.text
        elsewhere = await rig.say("c9", "/cron", sender="c9")
        assert "No scheduled jobs" in elsewhere.text


async def test_the_api_validates_and_changes_nothing_on_errors(tmp_path: Path) -> None:
    async with daemon(tmp_path) as rig:
        good = {"prompt": "report", "schedule": "every 30m"}
        bad: list[tuple[dict[str, Any], str]] = [
            ({**good, "schedule": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
            ({**good, "schedule": "every 10s"}, "too frequent"),
            ({**good, "schedule": "2020-01-01T00:00"}, "in the past"),
            ({**good, "schedule": "whenever"}, "cannot read 'whenever'"),
            ({**good, "schedule": "every 999999999999d"}, "too long"),
            ({**good, "schedule": "in 999999999999d"}, "too long"),
            ({**good, "schedule": "0 0 31 2 *"}, "never fires"),
            ({**good, "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
            ({**good, "targets": ["telegram:123"]}, "platform telegram is not configured"),
            ({**good, "targets": ["nowhere"]}, "is not a target"),
            ({**good, "targets": ["sms:12"]}, "E.164"),
            ({**good, "prompt": ""}, "prompt"),
            ({"prompt": "report"}, "schedule"),
            ({**good, "colour": "blue"}, "colour"),
            ({**good, "timeout": -1}, "timeout"),
        ]
        for body, reason in bad:
            response = await rig.api.post("/api/jobs", json=body)
            assert response.status_code == 400, (body, response.text)
            assert reason in error(response), (body, error(response))
        not_json = await rig.api.post(
            "/api/jobs", content=b"{", headers={"Content-Type": "application/json"}
        )
        assert not_json.status_code == 400
        assert (await rig.api.get("/api/jobs")).json() == {"jobs": []}

        created = await rig.api.post("/api/jobs", json={**good, "targets": ["test:c1", "all"]})
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["targets"] == ["test:c1", "all"]
        job_id = job["id"]
        patched = await rig.api.patch(f"/api/jobs/{job_id}", json={"schedule": "every day"})
        assert patched.status_code == 400
        assert "cannot read 'every day'" in error(patched)
        for schedule, reason in (("every 999999999999d", "too long"), ("0 0 30 2 *", "never")):
            patched = await rig.api.patch(f"/api/jobs/{job_id}", json={"schedule": schedule})
            assert patched.status_code == 400
            assert reason in error(patched)
        assert (await rig.api.get(f"/api/jobs/{job_id}")).json()["schedule"] == "every 30m"
        patched = await rig.api.patch(
            f"/api/jobs/{job_id}", json={"schedule": "0 7 * * *", "timezone": "Asia/Tokyo"}
        )
        assert patched.status_code == 200, patched.text
        assert patched.json()["schedule"] == "0 7 * * *"
        assert patched.json()["next_run_at"] == "2026-11-23T22:00:00+00:00"
        paused = await rig.api.post(f"/api/jobs/{job_id}/pause")
        assert paused.json()["enabled"] is False
        assert paused.json()["next_run_at"] is None
        resumed = await rig.api.post(f"/api/jobs/{job_id}/resume")
        assert resumed.json()["enabled"] is True

        for method, path in [
            ("GET", "/api/jobs/nope"),
            ("PATCH", "/api/jobs/nope"),
            ("DELETE", "/api/jobs/nope"),
            ("POST", "/api/jobs/nope/pause"),
            ("POST", "/api/jobs/nope/resume"),
            ("POST", "/api/jobs/nope/run"),
        ]:
            response = await rig.api.request(method, path, json={} if method == "PATCH" else None)
            assert response.status_code == 404, (method, path, response.text)
            assert "there is no job 'nope'" in error(response)

        async with httpx.AsyncClient(base_url=rig.herald.url, trust_env=False) as anonymous:
            assert (await anonymous.get("/api/jobs")).status_code == 401
            refused = await anonymous.post("/api/jobs", json=good)
            assert refused.status_code == 401
        assert (await rig.api.delete(f"/api/jobs/{job_id}")).status_code == 204
        assert (await rig.api.get(f"/api/jobs/{job_id}")).status_code == 404


async def test_a_job_created_by_asking_the_agent_in_chat(tmp_path: Path) -> None:
    async with daemon(tmp_path) as rig:
        rig.llm.script(
            Reply(
                tool_calls=[
                    (
                        "schedule_job",
                        {
                            "action": "create",
                            "name": "weekday summary",
                            "prompt": "summarise what changed",
                            "schedule": "0 9 * * 1-5",
                            "timezone": "Europe/Berlin",
                        },
                    )
                ]
            ),
            Reply(text="Done: every weekday at 9:00 Berlin time."),
        )
        answer = await rig.say(
            "c7", "Every weekday at 9, summarise what changed and post it to me", sender="u7"
        )
        assert answer.text == "Done: every weekday at 9:00 Berlin time."
        requests = await rig.llm.wait_for_requests(2)
        tool_result = requests[1]["messages"][-1]
        assert tool_result["role"] == "tool"
        assert tool_result["content"].startswith("Scheduled: ")
        [job] = (await rig.api.get("/api/jobs")).json()["jobs"]
        assert job["name"] == "weekday summary"
        assert job["targets"] == ["test:c7"]
        assert job["timezone"] == "Europe/Berlin"
        # The identity that asked (its rights are read from the config at each run), and the
        # user it belongs to.
        assert job["created_by"] == "test:u7"
        assert job["user_id"].startswith("u_")
        assert job["next_run_at"] == NINE.isoformat()

        listing = await rig.say("c7", "/cron", sender="u7")
        assert job["id"] in listing.text
        assert "weekday summary" in listing.text
        elsewhere = await rig.say("c8", "/cron", sender="u8")
        assert "No scheduled jobs" in elsewhere.text

        rig.clock.set(NINE)
        [report] = await rig.chat.wait_for_sent(
            lambda s: s.chat_id == "c7" and "summarise what changed" in s.text, WAIT
        )
        assert report.text.startswith("⏰ weekday summary\n\nYou said:")
