"""No secret reaches the log or `herald doctor`'s output, at any log level: each platform runs
with a malformed base URL (the form that makes its SDK fail on every try) under `herald run`
at DEBUG, and through `herald doctor`; neither output holds the token."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemon import HERALD, STOP_TIMEOUT, Daemon, free_port
from tests.unit.doctor_harness import run_doctor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TELEGRAM_TOKEN = "8101123456789:AAH-e2e-secret-telegram-token-0123456789"
SLACK_BOT_TOKEN = "xoxb-1-e2e-secret-slack-bot-token"
SLACK_APP_TOKEN = "xapp-1-A1-e2e-secret-slack-app-token"
TWILIO_AUTH_TOKEN = "5ec12e7f0a1b2c3d4e5f60718293a4b5"
DISCORD_TOKEN = "MTE5.e2e-secret-discord-token.XYZ"
EMAIL_PASSWORD = "e2e-secret-mail-password"
LLM_KEY = "sk-e2e-secret-llm-key"
API_KEY = "e2e-secret-api-key"

TRIES = 1
"""Failed connections of the adapter to see in the log: the first (later ones are retried
with backoff and summarised once per interval, so they add no line within the test)."""
WAIT = 60.0


def closed_url() -> str:
    """http://127.0.0.1:<a port nothing listens on>."""
    return f"http://127.0.0.1:{free_port()}"


def platforms() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """Each platform's section with a malformed base URL, and the secrets it holds."""
    return {
        # Without the `/bot` suffix the SDK appends the token where the port goes.
        "telegram": (
            {"token": TELEGRAM_TOKEN, "base_url": "http://127.0.0.1:1", "allowed_users": ["*"]},
            [TELEGRAM_TOKEN, TELEGRAM_TOKEN.split(":", 1)[1]],
        ),
        "slack": (
            {
                "bot_token": SLACK_BOT_TOKEN,
                "app_token": SLACK_APP_TOKEN,
                "base_url": f"{closed_url()}/api/",
            },
            [SLACK_BOT_TOKEN, SLACK_APP_TOKEN],
        ),
        "twilio": (
            {
                "account_sid": "AC" + "1f" * 16,
                "auth_token": TWILIO_AUTH_TOKEN,
                "from_number": "+15550000001",
                "public_url": "http://127.0.0.1:9",
                "base_url": f"{closed_url()}/twilio",
            },
            [TWILIO_AUTH_TOKEN],
        ),
        "discord": (
            {"token": DISCORD_TOKEN, "api_base": f"{closed_url()}/api/v10"},
            [DISCORD_TOKEN],
        ),
        "email": (
            {
                "imap_host": "127.0.0.1",
                "imap_port": free_port(),
                "imap_security": "none",
                "smtp_host": "127.0.0.1",
                "smtp_port": free_port(),
                "smtp_security": "none",
                "username": "herald@example.com",
                "address": "herald@example.com",
                "password": EMAIL_PASSWORD,
            },
            [EMAIL_PASSWORD],
        ),
    }


def debug_daemon(tmp_path: Path, platform: str, section: dict[str, Any]) -> Daemon:
    """A daemon logging at DEBUG with `section` as its one platform, and an LLM key and an
    API key that are secrets too (the LLM is never called)."""
    return Daemon(
        tmp_path / "state",
        {
            "log_level": "DEBUG",
            "llm": {"base_url": closed_url() + "/v1", "api_key": LLM_KEY},
            "api": {"key": API_KEY},
            "platforms": {platform: section},
        },
    )


async def run_until_retried(daemon: Daemon, platform: str) -> str:
    """Start `herald run`, wait until the adapter has failed `TRIES` times, SIGTERM it;
    return everything it logged."""
    daemon.write_config()
    daemon.log = daemon.state_dir.parent / f"{daemon.state_dir.name}.log"
    with daemon.log.open("ab") as log:
        daemon.process = await asyncio.create_subprocess_exec(
            str(HERALD),
            "run",
            "--config",
            str(daemon.config_path),
            stdout=log,
            stderr=log,
            env={"PATH": "/usr/bin:/bin", "HOME": str(daemon.state_dir.parent)},
        )
    marker = f"adapter {platform} "
    try:
        async with asyncio.timeout(WAIT):
            while daemon.output().count(marker) < TRIES:
                assert daemon.process.returncode is None, daemon.output()
                await asyncio.sleep(0.05)
        daemon.signal(signal.SIGTERM)
        async with asyncio.timeout(STOP_TIMEOUT):
            assert await daemon.process.wait() == 0, daemon.output()[-3000:]
    finally:
        if daemon.process.returncode is None:
            daemon.process.kill()
            await daemon.process.wait()
    return daemon.output()


@pytest.mark.parametrize("platform", list(platforms()))
async def test_no_secret_in_the_debug_log(tmp_path: Path, platform: str) -> None:
    section, secrets = platforms()[platform]
    daemon = debug_daemon(tmp_path, platform, section)

    output = await run_until_retried(daemon, platform)

    assert " DEBUG " in output  # the level under test
    for secret in [*secrets, LLM_KEY, API_KEY]:
        assert secret not in output, f"{secret!r} logged:\n{_around(output, secret)}"


def _around(text: str, secret: str) -> str:
    at = text.find(secret)
    return text[max(0, at - 300) : at + 100]


async def test_telegram_malformed_base_url_logs_the_error_redacted(tmp_path: Path) -> None:
    section, _ = platforms()["telegram"]
    daemon = Daemon(tmp_path / "state", {"platforms": {"telegram": section}})

    output = await run_until_retried(daemon, "telegram")

    assert "adapter telegram failed" in output
    assert "InvalidURL" in output  # the SDK's error, which held the token
    assert "Invalid port: '18101123456789:***'" in output  # the bot id stays, to tell bots apart


@pytest.mark.parametrize("platform", list(platforms()))
async def test_doctor_prints_no_secret(tmp_path: Path, platform: str) -> None:
    section, secrets = platforms()[platform]

    result = await run_doctor(tmp_path, {platform: section})

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.verdicts[f"platforms.{platform}"][0] == "FAIL"
    for secret in secrets:
        assert secret not in result.stdout + result.stderr, result.stdout + result.stderr
