"""Busy policies: every busy mode has exactly one, and each says plainly what it does."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.contracts.config import BusyMode
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    InboxId,
    PlatformMessageId,
    SessionKey,
)
from gateway.sessions import ACKS, POLICIES
from gateway.store.inbox import InboxRow, Status

NOW = datetime(2026, 11, 26, tzinfo=UTC)


def row(n: int) -> InboxRow:
    return InboxRow(
        id=InboxId(n),
        platform="test",
        account=AccountId("acct"),
        platform_message_id=PlatformMessageId(str(n)),
        session_key=SessionKey("test:acct:c1"),
        chat_id=ChatId("c1"),
        thread_id=None,
        sender_id=ExternalUserId("c1"),
        sender_name="",
        text=f"m{n}",
        is_direct=True,
        kind="message",
        priority=0,
        steer=False,
        attempts=0,
        status=Status.PENDING,
        outcome=None,
        outcome_detail=None,
        turn_id=None,
        user_id=None,
        received_at=NOW,
        accepted_at=NOW,
    )


def test_every_busy_mode_has_one_policy_and_an_acknowledgement() -> None:
    assert set(POLICIES) == set(BusyMode)
    for mode, policy in POLICIES.items():
        assert policy.mode is mode
        assert ACKS[mode]


def test_which_waiting_messages_form_the_next_turn() -> None:
    waiting = [row(n) for n in range(1, 6)]
    assert [r.id for r in POLICIES[BusyMode.QUEUE].next_turn(waiting, cap=20)] == [1]
    assert [r.id for r in POLICIES[BusyMode.INTERRUPT].next_turn(waiting, cap=20)] == [1]
    assert len(POLICIES[BusyMode.COLLECT].next_turn(waiting, cap=20)) == 5
    assert len(POLICIES[BusyMode.COLLECT].next_turn(waiting, cap=2)) == 3
    assert len(POLICIES[BusyMode.STEER].next_turn(waiting, cap=20)) == 5


def test_what_an_arriving_message_does_while_busy() -> None:
    flags = {m: (p.capped, p.steers, p.interrupts, p.debounce) for m, p in POLICIES.items()}
    assert flags == {
        BusyMode.QUEUE: (True, False, False, False),
        BusyMode.COLLECT: (True, False, False, True),
        BusyMode.STEER: (False, True, False, False),
        BusyMode.INTERRUPT: (False, False, True, False),
    }
