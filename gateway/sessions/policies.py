"""Busy modes: what a message does when it arrives while its session is still answering.

One class per mode behind `BusyPolicy`. Adding a mode is a class here, listed in `POLICIES`,
and a member of `BusyMode` (`gateway/contracts/config.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.contracts.config import BusyMode
from gateway.store.inbox import InboxRow


class BusyPolicy(Protocol):
    """How one busy mode treats a message arriving while a turn of its session runs, and
    which waiting messages form the session's next turn."""

    mode: BusyMode
    ack: str
    """The short acknowledgement a sender gets for a message that arrives while busy."""
    capped: bool
    """Whether such a message counts against `sessions.queue_cap` (refused past it)."""
    steers: bool
    """Whether it is injected into the running turn at its next tool or model boundary."""
    interrupts: bool
    """Whether it cancels the running turn and is answered next."""
    debounce: bool
    """Whether the next turn waits for `sessions.debounce_seconds` without a new message."""

    def next_turn(self, waiting: Sequence[InboxRow], cap: int) -> list[InboxRow]:
        """The waiting rows (oldest first, at least one) that the next turn answers."""
        ...


class QueuePolicy:
    """`queue`: each message is its own turn, in order."""

    mode = BusyMode.QUEUE
    ack = "⏳ Still working on your previous message; this one is queued."
    capped, steers, interrupts, debounce = True, False, False, False

    def next_turn(self, waiting: Sequence[InboxRow], cap: int) -> list[InboxRow]:
        """The oldest message alone."""
        return list(waiting[:1])


class CollectPolicy:
    """`collect`: what arrives meanwhile (or within the debounce window) is one next turn."""

    mode = BusyMode.COLLECT
    ack = "⏳ Still working; I'll read this together with your other new messages."
    capped, steers, interrupts, debounce = True, False, False, True

    def next_turn(self, waiting: Sequence[InboxRow], cap: int) -> list[InboxRow]:
        """Everything waiting, up to the cap."""
        return list(waiting[: cap + 1])


class SteerPolicy:
    """`steer`: injected into the running turn; if that ends first, the next turn."""

    mode = BusyMode.STEER
    ack = "↪ Got it; I'll take this into account in the answer I'm writing."
    capped, steers, interrupts, debounce = False, True, False, False

    def next_turn(self, waiting: Sequence[InboxRow], cap: int) -> list[InboxRow]:
        """Everything waiting, up to the cap (steer messages the turn did not read)."""
        return list(waiting[: cap + 1])


class InterruptPolicy:
    """`interrupt`: the running turn is cancelled and the new message answered next."""

    mode = BusyMode.INTERRUPT
    ack = "⏹ Stopping the current answer to read your new message."
    capped, steers, interrupts, debounce = False, False, True, False

    def next_turn(self, waiting: Sequence[InboxRow], cap: int) -> list[InboxRow]:
        """The newest interrupting message first (it is stored with priority), alone."""
        return list(waiting[:1])


POLICIES: dict[BusyMode, BusyPolicy] = {
    p.mode: p for p in (QueuePolicy(), CollectPolicy(), SteerPolicy(), InterruptPolicy())
}
"""Every busy mode's policy."""

ACKS = {mode: policy.ack for mode, policy in POLICIES.items()}
"""The acknowledgement of each mode, as the sender reads it."""


def policy(mode: BusyMode) -> BusyPolicy:
    """The policy of a busy mode."""
    return POLICIES[mode]
