"""The memory provider's sync queue survives SIGKILL of a real `herald run`: a sync that
reached Honcho just before the kill is not sent twice, the others are sent after the restart,
in order, each once."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.daemon import Daemon, running
from tests.fakes.honcho_server import FakeHoncho
from tests.fakes.llm import FakeLLM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
KEY = "memory-key"


def settings(llm: FakeLLM, honcho: FakeHoncho) -> dict[str, Any]:
    return {
        "llm": {"base_url": llm.base_url, "api_key": "sk-fake", "memory_pass": False},
        "api": {"key": KEY},
        "memory": {
            "provider": "honcho",
            "honcho": {"base_url": honcho.base_url, "api_key": honcho.key},
            "sync_retry_initial": 0.1,
            "sync_retry_max": 0.5,
        },
    }


async def ask(daemon: Daemon, text: str) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30.0, trust_env=False) as api:
        response = await api.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text}]},
            headers={
                "Authorization": f"Bearer {KEY}",
                "X-Herald-Session-Id": "notes",
                "X-Herald-User-Id": "alice",
            },
        )
    assert response.status_code == 200, response.text


async def test_syncs_survive_sigkill_in_order_and_exactly_once(tmp_path: Path) -> None:
    async with FakeLLM() as llm, FakeHoncho() as honcho:
        state = tmp_path / "state"
        # Honcho stores what it is sent but answers late: the kill lands in flight.
        honcho.slow_answers(60, path="/messages")
        async with running(state, **settings(llm, honcho)) as daemon:
            await ask(daemon, "note 1")
            await ask(daemon, "note 2")
            await honcho.wait_for(lambda: "note 1" in [m.content for m in honcho.messages])
            daemon.signal(signal.SIGKILL)
            assert await daemon.wait() == -signal.SIGKILL
        honcho.slow_answers(0)
        async with running(state, **settings(llm, honcho)) as daemon:
            await ask(daemon, "note 3")
            await honcho.wait_for(lambda: len(honcho.said_by("herald")) >= 3, timeout=30)
            person = honcho.messages[0].peer
            assert honcho.said_by(person) == ["note 1", "note 2", "note 3"]
            assert len(honcho.said_by("herald")) == 3
