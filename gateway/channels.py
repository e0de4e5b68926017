"""The platform accounts Herald can deliver to, and how to reach their live adapters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.contracts.adapter import Adapter
from gateway.contracts.messages import SendLimits


@dataclass(frozen=True, slots=True)
class _Channel:
    limits: SendLimits
    live: Callable[[], Adapter | None]


class Channels:
    """A registry keyed by (platform, account), filled by the supervisor at startup."""

    def __init__(self) -> None:
        self._channels: dict[tuple[str, str], _Channel] = {}

    def register(
        self, platform: str, account: str, limits: SendLimits, live: Callable[[], Adapter | None]
    ) -> None:
        """Make an account known; `live` returns its connected adapter, or None while down."""
        self._channels[(platform, account)] = _Channel(limits, live)

    def known(self, platform: str, account: str) -> bool:
        """Whether that account is configured (connected or not)."""
        return (platform, account) in self._channels

    def adapter(self, platform: str, account: str) -> Adapter | None:
        """The connected adapter of the account, or None (unknown or reconnecting)."""
        channel = self._channels.get((platform, account))
        return None if channel is None else channel.live()

    def limits(self, platform: str, account: str) -> SendLimits:
        """What the account's adapter can send in one message (defaults when unknown)."""
        channel = self._channels.get((platform, account))
        return SendLimits() if channel is None else channel.limits

    def away(self) -> list[tuple[str, str]]:
        """The accounts configured here whose adapter is not connected here (reconnecting,
        or their receiver runs on another instance): their chats are left alone here, so
        that they neither take the places of other accounts' chats in a look nor hold up
        a flush."""
        return sorted(key for key, c in self._channels.items() if c.live() is None)

    def platforms(self) -> list[str]:
        """The platforms with a connected account here: what this instance can deliver.

        A platform whose adapter is reconnecting, or whose receiver runs on another instance
        (standby here), is left to that instance or to later; its chunks wait in the outbox
        (and are dead-lettered by age when they are finally looked at)."""
        return sorted({platform for (platform, _), c in self._channels.items() if c.live()})
