"""`herald doctor` checks the Mattermost bot's token with `GET /users/me` on the fake
Mattermost, with the CLI run as a real subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.mattermost_server import BOT_ID, BOT_NAME, TOKEN, FakeMattermostServer
from tests.unit.doctor_harness import run_doctor

pytestmark = pytest.mark.e2e  # runs `herald` as a subprocess


async def test_doctor_checks_the_token_with_users_me_and_never_prints_it(tmp_path: Path) -> None:
    wrong = "wrongwrongwrongwrongwrong1"
    async with FakeMattermostServer() as mm:
        section = {"url": mm.base_url, "token": TOKEN}
        (tmp_path / "good").mkdir()
        (tmp_path / "bad").mkdir()
        good = await run_doctor(tmp_path / "good", {"mattermost": section})
        bad = await run_doctor(tmp_path / "bad", {"mattermost": {**section, "token": wrong}})
    assert good.returncode == 0, good.stdout + good.stderr
    verdict, detail = good.verdicts["platforms.mattermost"]
    assert verdict == "OK"
    assert detail.startswith(f"@{BOT_NAME} ({BOT_ID})")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    verdict, detail = bad.verdicts["platforms.mattermost"]
    assert verdict == "FAIL"
    assert "credentials refused: mattermost: GET /users/me: HTTP 401" in detail
    for token in (wrong, TOKEN):
        assert token not in good.stdout + good.stderr + bad.stdout + bad.stderr
