"""`herald doctor` logs in to the mailbox's IMAP (a real Dovecot) and SMTP (aiosmtpd) servers,
with the CLI run as a real subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.dovecot import USER, Dovecot
from tests.fakes.smtp_server import SmtpServer
from tests.unit.doctor_harness import run_doctor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@pytest.fixture
async def dovecot() -> AsyncIterator[Dovecot]:
    async with Dovecot() as server:
        yield server


@pytest.fixture
async def smtp() -> AsyncIterator[SmtpServer]:
    async with SmtpServer() as server:
        yield server


async def test_doctor_logs_in_to_both_servers(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    result = await run_doctor(tmp_path, {"email": dovecot.section(**smtp.section())})

    assert result.returncode == 0, result.stdout + result.stderr
    verdict, detail = result.verdicts["platforms.email"]
    assert verdict == "OK", detail
    assert detail.startswith(f"{USER}: IMAP 127.0.0.1 INBOX (UIDVALIDITY ")
    assert detail.endswith(f", IDLE; SMTP 127.0.0.1:{smtp.port} login ok")
    assert smtp.received == []  # checked, nothing sent


async def test_doctor_reports_refused_credentials(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    wrong_imap = dovecot.section(password="wrong", **smtp.section())
    (tmp_path / "imap").mkdir()
    (tmp_path / "smtp").mkdir()
    result = await run_doctor(tmp_path / "imap", {"email": wrong_imap})
    assert result.returncode != 0
    verdict, detail = result.verdicts["platforms.email"]
    assert verdict == "FAIL"
    assert detail.startswith("credentials refused: email: IMAP login refused")

    smtp.password = "changed"
    result = await run_doctor(tmp_path / "smtp", {"email": dovecot.section(**smtp.section())})
    verdict, detail = result.verdicts["platforms.email"]
    assert verdict == "FAIL"
    assert detail.startswith("credentials refused: email: SMTP login refused: 535")


async def test_doctor_reports_an_unreachable_server(tmp_path: Path, smtp: SmtpServer) -> None:
    async with Dovecot() as gone:
        section = gone.section(**smtp.section())
    result = await run_doctor(tmp_path, {"email": section})
    verdict, detail = result.verdicts["platforms.email"]
    assert verdict == "FAIL"
    assert detail.startswith("unreachable: email: IMAP 127.0.0.1:")
