"""Report targets: checked when a job is saved, resolved to chats when it runs."""

from __future__ import annotations

import pytest

from gateway.contracts.config import PlatformSection
from gateway.cron.targets import (
    TargetError,
    normalize_targets,
    resolve,
    session_chat,
)
from gateway.store.outbox import Target

pytestmark = pytest.mark.timeout(30)

CONFIGURED = {(p, "default") for p in ("telegram", "slack", "twilio", "email", "test")}


def test_targets_are_normalized() -> None:
    assert normalize_targets(
        [
            "home",
            "ALL",
            "telegram:-100123:7",
            "slack:C042",
            "email:Ada@Example.org",
            "sms:+15551234567",
            "whatsapp:+15551234567",
            "home",
        ],
        CONFIGURED,
    ) == (
        "home",
        "all",
        "telegram:-100123:7",
        "slack:C042",
        "email:ada@example.org",
        "sms:+15551234567",
        "whatsapp:+15551234567",
    )


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("discord:123", "platform discord is not configured"),
        ("nowhere", "is not a target"),
        ("pigeon:42", "unknown platform 'pigeon'"),
        ("sms:5551234", "E.164"),
        ("email:nobody", "email needs an address"),
        ("cron:x", "unknown platform"),
    ],
)
def test_bad_targets_say_why(target: str, reason: str) -> None:
    with pytest.raises(TargetError, match=reason):
        normalize_targets([target], CONFIGURED)


def test_no_target_is_refused() -> None:
    with pytest.raises(TargetError, match="at least one target"):
        normalize_targets([], CONFIGURED)


def test_resolve_home_all_and_aliases() -> None:
    sections = {
        ("telegram", "bot"): PlatformSection(account="bot"),
        ("twilio", "+15550000000"): PlatformSection(account="+15550000000"),
    }
    resolved = resolve(
        ["home", "whatsapp:+15551234567", "sms:+15557654321", "slack:C1"],
        homes=["telegram:1", "telegram:2:9"],
        sethome="telegram:5",
        sections=sections,
    )
    assert resolved.targets == (
        Target("telegram", "bot", "5"),  # type: ignore[arg-type]
        Target("twilio", "+15550000000", "whatsapp:+15551234567"),  # type: ignore[arg-type]
        Target("twilio", "+15550000000", "+15557654321"),  # type: ignore[arg-type]
    )
    assert resolved.problems == ("slack:C1: platform slack is not configured",)
    everyone = resolve(
        ["all"], homes=["telegram:1", "telegram:2:9"], sethome=None, sections=sections
    )
    assert [(t.chat_id, t.thread_id) for t in everyone.targets] == [("1", None), ("2", "9")]
    nowhere = resolve(["home"], homes=[], sethome=None, sections=sections)
    assert nowhere.targets == ()
    assert "no home channel" in nowhere.problems[0]


def test_the_chat_of_a_session() -> None:
    assert session_chat("telegram:bot:-100:7") == "telegram:-100:7"
    assert session_chat("test:bot1:c7") == "test:c7"
    assert session_chat("slack:T1:C1:u=U9") == "slack:C1"
    assert session_chat("twilio:acct:whatsapp%3A+1555") == "twilio:whatsapp:+1555"
    assert session_chat("api:default:mine") is None
    assert session_chat("cron:default:abc") is None
