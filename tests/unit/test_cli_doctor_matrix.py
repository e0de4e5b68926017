"""`herald doctor` checks the Matrix account's access token with `whoami` on a real Synapse
(the run's shared one), with the CLI run as a real subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.synapse import shared_synapse
from tests.unit.doctor_harness import run_doctor

pytestmark = pytest.mark.e2e  # runs `herald` as a subprocess


async def test_doctor_checks_the_token_with_whoami_and_never_prints_it(tmp_path: Path) -> None:
    synapse = await shared_synapse()
    bot = await synapse.register("doctor")
    section = {"homeserver": synapse.url, "user_id": bot.user_id, "access_token": bot.access_token}
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good = await run_doctor(tmp_path / "good", {"matrix": section})
    assert good.returncode == 0, good.stdout + good.stderr
    verdict, detail = good.verdicts["platforms.matrix"]
    assert verdict == "OK"
    assert detail.startswith(bot.user_id)

    wrong = "syt_wrong_doctor_token_0000000000"
    bad = await run_doctor(tmp_path / "bad", {"matrix": {**section, "access_token": wrong}})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    verdict, detail = bad.verdicts["platforms.matrix"]
    assert verdict == "FAIL"
    assert "credentials refused: matrix: whoami: M_UNKNOWN_TOKEN" in detail
    for token in (wrong, bot.access_token):
        assert token not in good.stdout + good.stderr + bad.stdout + bad.stderr
