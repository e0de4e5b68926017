"""A server that echoes a platform's secret in its error does not get it into the log, for
every platform: each adapter starts against a server that puts the credentials it was sent
into the error it answers (`tests/fakes/echoing.py`). The positive control is that the server
did send the secret back and that its error text reached the log, so the secret would be
there without redaction; the log (at DEBUG) holds the error, masked, and never the secret.
Telegram's own case (the SDK putting the token in an InvalidURL) is in test_secrets_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemon import free_port
from tests.e2e.test_secrets_e2e import (
    DISCORD_TOKEN,
    EMAIL_PASSWORD,
    SLACK_APP_TOKEN,
    SLACK_BOT_TOKEN,
    TWILIO_AUTH_TOKEN,
    debug_daemon,
    run_until_retried,
)
from tests.fakes.echoing import EchoingHTTP, EchoingIMAP

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SID = "AC" + "2e" * 16
MATRIX_TOKEN = "syt_aGVyYWxk_e2eSecretMatrixToken_0a1b2c"
MATTERMOST_TOKEN = "e2esecretmattermosttoken9z"
SIGNAL_TOKEN = "signal-proxy-e2eSecretToken-7f3a9c"


def section(platform: str, port: int) -> tuple[dict[str, Any], str, str]:
    """The platform's section against the echoing server on `port`, its secret, and words of
    the server's error that must reach the log."""
    url = f"http://127.0.0.1:{port}"
    if platform == "slack":
        return (
            {"bot_token": SLACK_BOT_TOKEN, "app_token": SLACK_APP_TOKEN, "base_url": f"{url}/api/"},
            SLACK_BOT_TOKEN,
            "invalid_auth",
        )
    if platform == "discord":
        return (
            {"token": DISCORD_TOKEN, "api_base": f"{url}/api/v10"},
            DISCORD_TOKEN,
            "Missing Access",
        )
    if platform == "twilio":
        return (
            {
                "account_sid": SID,
                "auth_token": TWILIO_AUTH_TOKEN,
                "from_number": "+15550000001",
                "public_url": "http://127.0.0.1:9",
                "base_url": url,
            },
            TWILIO_AUTH_TOKEN,
            "Authenticate",
        )
    if platform == "matrix":
        return (
            {"homeserver": url, "user_id": "@herald:example.org", "access_token": MATRIX_TOKEN},
            MATRIX_TOKEN,
            "upstream refused",
        )
    if platform == "mattermost":
        return ({"url": url, "token": MATTERMOST_TOKEN}, MATTERMOST_TOKEN, "upstream refused")
    if platform == "signal":
        return (
            {"number": "+15550009999", "url": url, "auth_token": SIGNAL_TOKEN},
            SIGNAL_TOKEN,
            "upstream refused",
        )
    assert platform == "email"
    return (
        {
            "imap_host": "127.0.0.1",
            "imap_port": port,
            "imap_security": "none",
            "smtp_host": "127.0.0.1",
            "smtp_port": free_port(),
            "smtp_security": "none",
            "username": "herald@example.com",
            "address": "herald@example.com",
            "password": EMAIL_PASSWORD,
        },
        EMAIL_PASSWORD,
        "AUTHENTICATIONFAILED",
    )


@pytest.mark.parametrize(
    "platform", ["slack", "discord", "twilio", "email", "matrix", "mattermost", "signal"]
)
async def test_a_secret_echoed_by_the_platform_stays_out_of_the_log(
    tmp_path: Path, platform: str
) -> None:
    server = EchoingIMAP() if platform == "email" else EchoingHTTP(platform)
    async with server:
        platform_section, secret, error_words = section(platform, server.port)
        daemon = debug_daemon(tmp_path, platform, platform_section)
        output = await run_until_retried(daemon, platform)

    # The positive control: the secret came back from the server, and its error was logged.
    assert any(secret in sent for sent in server.sent), server.sent
    # The error's line holds the echo, masked where the secret stood.
    echoed = [line for line in output.splitlines() if error_words in line]
    assert echoed, output[-3000:]
    assert any("***" in line for line in echoed), echoed
    assert secret not in output, output[output.find(secret) - 300 : output.find(secret) + 100]
