"""`herald doctor` checks the Twilio credentials by fetching the account from the REST API (the
fake, in-process), with the CLI run as a real subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.sink import refusing_socket
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    FakeTwilioServer,
)
from tests.unit.doctor_harness import Doctor, run_doctor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

WRONG_TOKEN = "fedcba9876543210fedcba9876543210"


@pytest.fixture
async def twilio() -> AsyncIterator[FakeTwilioServer]:
    async with FakeTwilioServer() as server:
        yield server


async def doctor(tmp_path: Path, base_url: str, **changes: Any) -> Doctor:
    """Run `herald doctor` with Twilio pointed at `base_url` and the default (echo) LLM."""
    section: dict[str, Any] = {
        "account_sid": DEFAULT_ACCOUNT_SID,
        "auth_token": DEFAULT_AUTH_TOKEN,
        "from_number": HERALD_NUMBER,
        "public_url": "https://herald.example.com",
        "base_url": base_url,
    }
    section.update(changes)
    return await run_doctor(tmp_path, {"twilio": section})


async def test_doctor_fetches_the_account(tmp_path: Path, twilio: FakeTwilioServer) -> None:
    result = await doctor(tmp_path, twilio.base_url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.verdicts["platforms.twilio"] == (
        "OK",
        f"Herald test account ({DEFAULT_ACCOUNT_SID}, active); sends from {HERALD_NUMBER}",
    )
    assert twilio.refused == []
    assert twilio.sent == []  # checked, nothing sent


async def test_doctor_fails_on_a_wrong_auth_token(tmp_path: Path, twilio: FakeTwilioServer) -> None:
    result = await doctor(tmp_path, twilio.base_url, auth_token=WRONG_TOKEN)
    assert result.returncode == 1, result.stdout + result.stderr
    verdict, detail = result.verdicts["platforms.twilio"]
    assert verdict == "FAIL"
    assert detail.startswith("credentials refused: twilio: fetch account: HTTP 401, error 20003")
    assert [r.status for r in twilio.refused] == [401]
    output = result.stdout + result.stderr
    assert WRONG_TOKEN not in output
    assert DEFAULT_AUTH_TOKEN not in output


async def test_doctor_fails_on_a_suspended_account(tmp_path: Path) -> None:
    async with FakeTwilioServer(status="suspended") as twilio:
        result = await doctor(tmp_path, twilio.base_url)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.verdicts["platforms.twilio"] == (
        "FAIL",
        f"credentials refused: twilio: the account {DEFAULT_ACCOUNT_SID} is suspended",
    )


async def test_doctor_fails_when_twilio_is_unreachable(tmp_path: Path) -> None:
    with refusing_socket() as url:
        result = await doctor(tmp_path, url)
    assert result.returncode == 1, result.stdout + result.stderr
    verdict, detail = result.verdicts["platforms.twilio"]
    assert verdict == "FAIL"
    assert detail.startswith("unreachable: twilio: GET ")
