"""Signal under attack and misuse, converted without I/O: JSON-RPC failures whose cause is
not the message (a network failure to every recipient, a captcha challenge) and envelopes a
daemon should not write but might (odd mention fields)."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import pytest

from adapters.inbound import Incoming
from adapters.signal.config import SignalConfig
from adapters.signal.convert import data_uri, error_from, to_event
from gateway.contracts.errors import NotReady, RateLimited
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import Attachment

ME = "+15550009999"
ANN = "+15551230001"
T = 1764392400000
NOW = datetime.fromtimestamp(T / 1000, UTC) + timedelta(seconds=2)
CONFIG = SignalConfig(number=ME, allowed_users=(ANN,))


def failure(*kinds: str, **extra: Any) -> dict[str, Any]:
    """A JSON-RPC error's `data` as signal-cli writes it after a send failed everywhere."""
    results = [
        {"recipientAddress": {"number": f"+1555123000{i}"}, "type": kind, **extra}
        for i, kind in enumerate(kinds)
    ]
    return {"response": {"timestamp": T, "results": results}}


def test_a_send_that_failed_on_the_network_everywhere_is_retried_not_given_up() -> None:
    # signal-cli answers -1 "Failed to send message" when no recipient got it, whatever
    # the reason: Signal's servers being unreachable is no reason to drop the message.
    found = error_from(-1, "Failed to send message", failure("NETWORK_FAILURE"), "send")
    assert isinstance(found, NotReady)
    mixed = failure("NETWORK_FAILURE", "RATE_LIMIT_FAILURE")
    assert isinstance(error_from(-1, "Failed to send message", mixed, "send"), NotReady)


def test_a_captcha_challenge_tells_the_operator_how_to_answer_it() -> None:
    data = failure("RATE_LIMIT_FAILURE", token="tok-123", retryAfterSeconds=86400)
    found = error_from(-5, "Failed to send message due to rate limiting", data, "send")
    assert isinstance(found, RateLimited)
    assert found.retry_after == 86400
    assert "submitRateLimitChallenge --challenge tok-123" in str(found)


def test_mentions_with_odd_fields_are_read_without_failing() -> None:
    event = {
        "account": ME,
        "envelope": {
            "sourceNumber": ANN,
            "timestamp": T,
            "dataMessage": {
                "timestamp": T,
                "message": "\ufffc hi \ufffc",
                "mentions": [
                    {"number": ME, "start": "zero", "length": 1},
                    {"number": ANN, "start": {"x": 1}, "length": 1},
                    {"number": ME, "start": 0, "length": 1},
                ],
            },
        },
    }
    found = to_event(event, config=CONFIG, account=AccountId("default"), now=NOW)
    assert isinstance(found, Incoming)
    assert found.message.text.startswith(f"@{ME} hi")


SIGNAL_CLI_DATA_URI = re.compile(
    r"\Adata:(?P<type>.+?/.+?)?(?P<parameters>;.+?=.+?)?(?P<base64>;base64)?,(?P<data>.+)\Z",
    re.IGNORECASE | re.DOTALL,
)
"""signal-cli's DataURI.DATA_URI_PATTERN; its parameters are read with `\\G;(.+)=(.+)`
(greedy) and URL-decoded (Java's URLDecoder: `+` is a space, a stray `%` an error)."""


@pytest.mark.parametrize(
    "name", ["100% sure.pdf", "a+b.txt", "semi;colon,comma.txt", "%zz.txt", "plain.png"]
)
def test_a_sent_files_name_reaches_signal_cli_as_it_is(name: str, tmp_path: Path) -> None:
    # An agent's file may be named anything; signal-cli URL-decodes the name of a data URI.
    attachment = Attachment(tmp_path / "x", "text/plain; charset=utf-8", 3, filename=name)
    uri = data_uri(attachment, b"abc")
    found = SIGNAL_CLI_DATA_URI.match(uri)
    assert found is not None
    parameters = found.group("parameters")
    key, _, value = parameters.removeprefix(";").rpartition("=")
    assert key == "filename"
    assert unquote_plus(value, errors="strict") == name
    assert found.group("type") == "text/plain"
    assert base64.b64decode(found.group("data")) == b"abc"
