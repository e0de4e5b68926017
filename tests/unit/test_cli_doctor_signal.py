"""`herald doctor` checks the Signal account against the signal-cli daemon (the fake one):
the daemon answers and serves the number, with the CLI run as a real subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.signal_cli import FakeSignalCli
from tests.unit.doctor_harness import run_doctor

pytestmark = pytest.mark.e2e  # runs `herald` as a subprocess


async def test_doctor_checks_that_the_daemon_serves_the_number(tmp_path: Path) -> None:
    async with FakeSignalCli(multi_account=True) as signal:
        section = {"number": signal.number, "url": signal.url, "multi_account": True}
        (tmp_path / "good").mkdir()
        (tmp_path / "bad").mkdir()
        good = await run_doctor(tmp_path / "good", {"signal": section})
        assert good.returncode == 0, good.stdout + good.stderr
        verdict, detail = good.verdicts["platforms.signal"]
        assert verdict == "OK"
        assert detail.startswith(f"{signal.number} on signal-cli")

        other = {**section, "number": "+15550000001"}
        bad = await run_doctor(tmp_path / "bad", {"signal": other})
        assert bad.returncode == 1, bad.stdout + bad.stderr
        verdict, detail = bad.verdicts["platforms.signal"]
        assert verdict == "FAIL"
        assert "+15550000001 is not registered in the signal-cli daemon" in detail
