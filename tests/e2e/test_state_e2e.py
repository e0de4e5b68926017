"""Two `herald run` instances with their own state directories on one PostgreSQL share
everything a turn reads: the memory written in a turn on one is in the next turn's prompt on
the other, a skill the agent wrote on one is listed and read on the other, a job's output is
read through either's API, and a state directory wiped between turns loses nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.store import Store
from tests.e2e.daemon import Daemon, running
from tests.fakes.llm import FakeLLM, Reply
from tests.unit.skills.helpers import skill_text

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(180)]
KEY = "state-key"
HEADERS = {"Authorization": f"Bearer {KEY}", "X-Herald-User-Id": "ann"}


def settings(name: str, url: str, llm: FakeLLM) -> dict[str, Any]:
    return {
        "instance_id": name,
        "database_url": url,
        "llm": {"base_url": llm.base_url, "api_key": "sk-fake", "memory_pass": False},
        "api": {"key": KEY},
    }


async def ask(daemon: Daemon, text: str, session: str) -> str:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30.0, trust_env=False) as api:
        response = await api.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text}]},
            headers={**HEADERS, "X-Herald-Session-Id": session},
        )
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def system_of(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


def tool_results(request: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in request["messages"] if m["role"] == "tool"]


async def test_two_machines_share_memory_skills_and_job_outputs_through_the_database(
    tmp_path: Path, pg_url: str
) -> None:
    async with Store.open(pg_url):
        pass  # migrated once, before both start
    async with (
        FakeLLM() as llm,
        running(tmp_path / "a", **settings("herald-a", pg_url, llm)) as a,
        running(tmp_path / "b", **settings("herald-b", pg_url, llm)) as b,
    ):
        # On A: a memory and a skill of Ann's, written by the agent in one turn.
        note = {"action": "add", "target": "user", "content": "Ann takes her tea with lemon"}
        skill = {
            "action": "create",
            "name": "tea-ritual",
            "content": skill_text("tea-ritual", "How Ann likes her tea made.", "1. Add lemon."),
        }
        llm.script(
            Reply(tool_calls=[("memory", note), ("skill_manage", skill)]), Reply(text="Noted.")
        )
        assert await ask(a, "remember how I take my tea", "kitchen") == "Noted."
        results = tool_results(llm.requests[-1])
        assert results[0] == "saved to user", results
        assert "tea-ritual" in results[1], results

        # B's state directory is wiped (a new container): nothing is lost.
        shutil.rmtree(b.state_dir)
        b.state_dir.mkdir()

        # On B, a new conversation of Ann's: her memory and her skill are there.
        view = {"name": "tea-ritual"}
        llm.script(Reply(tool_calls=[("skill_view", view)]), Reply(text="Lemon, as always."))
        assert await ask(b, "make me a tea", "living-room") == "Lemon, as always."
        first, second = llm.requests[-2:]
        assert "Ann takes her tea with lemon" in system_of(first)
        assert "tea-ritual" in system_of(first)
        assert "1. Add lemon." in tool_results(second)[0]

        # A's own state directory wiped too, then a turn there sees the same.
        shutil.rmtree(a.state_dir)
        a.state_dir.mkdir()
        llm.script(Reply(text="Hello again."))
        await ask(a, "hello", "hall")
        assert "Ann takes her tea with lemon" in system_of(llm.requests[-1])
        assert "tea-ritual" in system_of(llm.requests[-1])

        # A job run on A is read through B's API.
        auth = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(timeout=30.0, trust_env=False, headers=auth) as api:
            created = await api.post(
                f"{a.url}/api/jobs",
                json={"name": "tea report", "prompt": "report on tea", "schedule": "every 1h"},
            )
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            llm.script(Reply(text="All teas accounted for."))
            assert (await api.post(f"{a.url}/api/jobs/{job_id}/run")).status_code == 202
            runs: list[dict[str, Any]] = []
            async with __import__("asyncio").timeout(60):
                while not any(r.get("output") for r in runs):
                    runs = (await api.get(f"{b.url}/api/jobs/{job_id}")).json()["runs"]
                    await __import__("asyncio").sleep(0.1)
        assert [r["output"] for r in runs if r.get("output")] == ["All teas accounted for."]
        assert not list(a.state_dir.glob("cron/**/*.md")), json.dumps(runs)
