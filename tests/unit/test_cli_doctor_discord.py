"""`herald doctor` checks the Discord bot's token over REST (the fake, in-process), with the
CLI run as a real subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.discord_server import BOT_ID, DEFAULT_TOKEN, FakeDiscordServer
from tests.unit.doctor_harness import Doctor, run_doctor

pytestmark = pytest.mark.e2e  # runs `herald` as a subprocess

WRONG_TOKEN = "MTAwMA.wrong.doctor-token"


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscordServer]:
    async with FakeDiscordServer() as server:
        yield server


async def doctor(tmp_path: Path, discord: FakeDiscordServer, **changes: Any) -> Doctor:
    """Run `herald doctor` with Discord pointed at the fake and the default (echo) LLM."""
    section: dict[str, Any] = {"token": DEFAULT_TOKEN, "api_base": discord.api_base}
    section.update(changes)
    return await run_doctor(tmp_path, {"discord": section})


async def test_doctor_names_the_bot_without_connecting(
    tmp_path: Path, discord: FakeDiscordServer
) -> None:
    result = await doctor(tmp_path, discord)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.verdicts["platforms.discord"] == (
        "OK",
        f"herald ({BOT_ID}) of application Herald, 1000 gateway sessions left today",
    )
    assert discord.connections == 0  # checked, not connected: no gateway session used
    assert "GET /api/v10/gateway/bot" in discord.rest_calls


async def test_doctor_fails_on_a_wrong_token_and_never_prints_it(
    tmp_path: Path, discord: FakeDiscordServer
) -> None:
    result = await doctor(tmp_path, discord, token=WRONG_TOKEN)

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.verdicts["platforms.discord"] == (
        "FAIL",
        "credentials refused: discord: login: the token was refused",
    )
    for token in (WRONG_TOKEN, DEFAULT_TOKEN):
        assert token not in result.stdout + result.stderr


async def test_doctor_reports_an_unreachable_discord(
    tmp_path: Path, discord: FakeDiscordServer
) -> None:
    result = await doctor(tmp_path, discord, api_base=f"{discord.base_url}/not-the-api")

    assert result.returncode == 1, result.stdout + result.stderr
    verdict, detail = result.verdicts["platforms.discord"]
    assert verdict == "FAIL"
    assert "discord: login" in detail
