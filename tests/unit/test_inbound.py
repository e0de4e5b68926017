"""What every adapter's inbound path shares: skipped updates, message keys, file screening."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from adapters.inbound import Skipped, file_refusal, log_skipped, message_key

pytestmark = pytest.mark.timeout(30)


@dataclass(frozen=True)
class Rules:
    attachment_types: tuple[str, ...] = ("image/*",)
    attachment_max_bytes: int = 100


def test_a_message_key_is_container_and_message() -> None:
    assert message_key(-100123, 55) == "-100123:55"
    assert message_key("C1", "1795000000.000100") == "C1:1795000000.000100"


def test_file_refusal_says_why_a_file_is_not_downloaded() -> None:
    assert file_refusal("a.png", "image/png", 100, Rules()) is None
    assert file_refusal("a.png", "image/png", None, Rules()) is None
    assert file_refusal("a.pdf", "application/pdf", 1, Rules()) == (
        "[file a.pdf (application/pdf) not downloaded: type not allowed]"
    )
    assert file_refusal("a.png", "image/png", 101, Rules()) == (
        "[file a.png (101 bytes) not downloaded: larger than 100 bytes]"
    )


def test_a_quiet_reason_is_logged_at_debug_others_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.inbound")
    with caplog.at_level(logging.DEBUG, logger="tests.inbound"):
        log_skipped(logger, "chat: update 7", Skipped("not addressed"), quiet=("not addressed",))
        log_skipped(logger, "chat: update 8", Skipped("no text"), quiet=("not addressed",))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "chat: update 7 skipped: not addressed"),
        (logging.INFO, "chat: update 8 skipped: no text"),
    ]
