"""The soak's short form (`make soak` runs the long one): every platform but Matrix at once
against its fake, random faults, a failing and slow fake LLM, mixed busy modes, scheduled
jobs, a few SIGKILLs and a SIGTERM, a hundred-odd messages; every invariant of bench/soak.py
holds (on Signal, every message is accepted exactly once except what signal-cli wrote to the
stream of a killed process, which it never sends again). The scale is `make soak`'s (5,000
messages, 20 kills)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import Plan, markdown, soak
from tests.fakes.dovecot import dovecot_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


async def test_short_soak_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    dovecot_binary()  # skips (fails in CI) without Dovecot, which the email platform needs
    plan = Plan(messages=120, kills=2, seed=20261126, settle_timeout=150)
    result = await soak(plan, tmp_path)
    report = markdown(result)
    assert result.ok, report
    assert result.kills == plan.kills
    assert result.exit_code == 0
    platforms = {p.platform for p in result.platforms}
    assert platforms == {
        "test",
        "telegram",
        "slack",
        "discord",
        "email",
        "twilio",
        "mattermost",
        "signal",
    }
    for p in result.platforms:
        assert p.sent > 0
        assert not p.lost, report
        # Only Signal may lose what signal-cli wrote to a killed process (no redelivery).
        assert p.lost_with_killed_stream == 0 or p.platform == "signal", report
        assert p.accepted + p.lost_with_killed_stream == p.sent, report
        assert sum(p.outcomes.values()) == p.accepted, report
        assert not p.unmarked_duplicates, report
    assert sum(sum(p.faults.values()) for p in result.platforms) > 0
    assert result.rss
