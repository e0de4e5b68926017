"""`herald doctor` checks the Slack app's tokens against the Web API (the fake, in-process),
with the CLI run as a real subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.slack import (
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    DEFAULT_SIGNING_SECRET,
    FakeSlackServer,
)
from tests.unit.doctor_harness import Doctor, run_doctor

pytestmark = pytest.mark.e2e  # runs `herald` as a subprocess

WRONG_BOT_TOKEN = "xoxb-1-wrong-doctor-token"
WRONG_APP_TOKEN = "xapp-1-A1-wrong-doctor-token"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer() as server:
        yield server


async def doctor(tmp_path: Path, slack: FakeSlackServer, **changes: Any) -> Doctor:
    """Run `herald doctor` with Slack pointed at the fake and the default (echo) LLM."""
    section: dict[str, Any] = {
        "bot_token": DEFAULT_BOT_TOKEN,
        "app_token": DEFAULT_APP_TOKEN,
        "base_url": slack.base_url,
    }
    section.update(changes)
    return await run_doctor(tmp_path, {"slack": section})


async def test_doctor_names_the_bot_and_checks_the_app_token(
    tmp_path: Path, slack: FakeSlackServer
) -> None:
    result = await doctor(tmp_path, slack)

    assert result.returncode == 0, result.stdout + result.stderr
    found = result.verdicts
    assert found["platforms.slack"] == (
        "OK",
        "herald (UBOT) in herald-test, app token ok (Socket Mode)",
    )
    assert found["llm"][0] == "WARN"  # the offline echo provider
    assert [(c.method, c.token) for c in slack.calls] == [
        ("auth.test", DEFAULT_BOT_TOKEN),
        ("apps.connections.open", DEFAULT_APP_TOKEN),
    ]
    assert slack.sockets_opened == 0  # checked, not connected: nothing taken over
    assert slack.rejected == []


async def test_doctor_in_events_api_mode(tmp_path: Path, slack: FakeSlackServer) -> None:
    result = await doctor(
        tmp_path, slack, mode="events", app_token=None, signing_secret=DEFAULT_SIGNING_SECRET
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.verdicts["platforms.slack"] == ("OK", "herald (UBOT) in herald-test, Events API")
    assert [c.method for c in slack.calls] == ["auth.test"]


async def test_doctor_fails_on_a_wrong_bot_token(tmp_path: Path, slack: FakeSlackServer) -> None:
    result = await doctor(tmp_path, slack, bot_token=WRONG_BOT_TOKEN)

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.verdicts["platforms.slack"] == (
        "FAIL",
        "credentials refused: slack: auth.test: invalid_auth",
    )
    assert [(r.method, r.error) for r in slack.rejected] == [("auth.test", "invalid_auth")]
    assert WRONG_BOT_TOKEN not in result.stdout + result.stderr


async def test_doctor_fails_on_a_wrong_app_token(tmp_path: Path, slack: FakeSlackServer) -> None:
    result = await doctor(tmp_path, slack, app_token=WRONG_APP_TOKEN)

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.verdicts["platforms.slack"] == (
        "FAIL",
        "credentials refused: slack: apps.connections.open: invalid_auth",
    )
    assert WRONG_APP_TOKEN not in result.stdout + result.stderr


async def test_doctor_never_prints_the_tokens(tmp_path: Path, slack: FakeSlackServer) -> None:
    printed = ""
    for changes in (
        {},
        {"bot_token": WRONG_BOT_TOKEN},
        {"base_url": f"{slack.url}/not-the-web-api/"},  # 404 unknown_method: a failure
    ):
        result = await doctor(tmp_path, slack, **changes)
        assert "platforms.slack" in result.verdicts, result.stdout + result.stderr
        printed += result.stdout + result.stderr
    assert result.verdicts["platforms.slack"][0] == "FAIL"
    for token in (DEFAULT_BOT_TOKEN, DEFAULT_APP_TOKEN, WRONG_BOT_TOKEN):
        assert token not in printed
        assert token.split("-", 1)[1] not in printed  # not even without its prefix
