"""`herald doctor` checks the Telegram bot's token against the Bot API (the fake, in-process),
with the CLI run as a real subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.telegram import FakeTelegramServer
from tests.unit.doctor_harness import Doctor, run_doctor

pytestmark = pytest.mark.e2e  # runs `herald` as a subprocess

TOKEN = "123456:doctor-test-token"


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, bot_username="herald_bot") as server:
        yield server


async def doctor(
    tmp_path: Path, tg: FakeTelegramServer, *, token: str = TOKEN, base_url: str | None = None
) -> Doctor:
    """Run `herald doctor` with Telegram pointed at the fake and the default (echo) LLM."""
    section = {
        "token": token,
        "base_url": base_url or tg.base_url,
        "base_file_url": tg.base_file_url,
    }
    return await run_doctor(tmp_path, {"telegram": section})


async def test_doctor_names_the_bot(tmp_path: Path, tg: FakeTelegramServer) -> None:
    result = await doctor(tmp_path, tg)

    assert result.returncode == 0, result.stdout + result.stderr
    found = result.verdicts
    assert found["platforms.telegram"] == ("OK", "@herald_bot (id 123456), polling mode")
    assert found["llm"][0] == "WARN"  # the offline echo provider
    assert [call.method for call in tg.calls] == ["getMe"]  # nothing taken over
    assert tg.webhook is None


async def test_doctor_fails_on_a_wrong_token(tmp_path: Path, tg: FakeTelegramServer) -> None:
    result = await doctor(tmp_path, tg, token="123456:wrong")

    assert result.returncode == 1, result.stdout + result.stderr
    verdict, detail = result.verdicts["platforms.telegram"]
    assert verdict == "FAIL"
    assert detail.startswith("credentials refused: telegram: getMe:")
    assert tg.calls == []  # refused before any method ran


async def test_doctor_does_not_print_the_token(tmp_path: Path, tg: FakeTelegramServer) -> None:
    result = await doctor(tmp_path, tg, base_url=f"{tg.url}/not-the-bot-api/bot")

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.verdicts["platforms.telegram"][0] == "FAIL"
    secret = TOKEN.split(":", 1)[1]
    assert secret not in result.stdout + result.stderr


async def test_doctor_checks_each_account(tmp_path: Path, tg: FakeTelegramServer) -> None:
    async with FakeTelegramServer("654321:work-token", bot_username="work_bot") as work:
        accounts = {
            "family": {"token": TOKEN, "base_url": tg.base_url},
            "work": {"token": "654321:work-token", "base_url": work.base_url},
        }
        result = await run_doctor(tmp_path, {"telegram": {"accounts": accounts}})

    assert result.returncode == 0, result.stdout + result.stderr
    found = result.verdicts
    assert found["platforms.telegram.accounts.family"] == (
        "OK",
        "@herald_bot (id 123456), polling mode",
    )
    assert found["platforms.telegram.accounts.work"] == (
        "OK",
        "@work_bot (id 654321), polling mode",
    )
