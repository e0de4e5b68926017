"""Adapters' durable checkpoints, kept in the settings table (or in memory for one-off checks)."""

from __future__ import annotations

import hashlib

from gateway.store import Store
from gateway.store.store import set_setting

_MAX_KEY = 128
"""The settings table's key width."""


class StoreCheckpoints:
    """`Checkpoints` of one platform account, stored as `checkpoint:<platform>:<account>:<name>`.

    A key longer than the settings column is replaced by its SHA-256, so any name fits.
    """

    def __init__(self, store: Store, platform: str, account: str) -> None:
        self._store = store
        self._prefix = f"checkpoint:{platform}:{account}:"

    def _key(self, name: str) -> str:
        key = self._prefix + name
        if len(key) <= _MAX_KEY:
            return key
        return "checkpoint:sha256:" + hashlib.sha256(key.encode()).hexdigest()

    async def get(self, name: str) -> str | None:
        """The value last set under `name`, or None."""
        return await self._store.get_setting(self._key(name))

    async def set(self, name: str, value: str) -> None:
        """Store `value` under `name`; durable when this returns."""
        async with self._store.write() as conn:
            await set_setting(conn, self._key(name), value)


class MemoryCheckpoints:
    """`Checkpoints` that live only as long as the object (for `herald doctor` and tests)."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    async def get(self, name: str) -> str | None:
        """The value last set under `name`, or None."""
        return self._values.get(name)

    async def set(self, name: str, value: str) -> None:
        """Store `value` under `name` for the object's lifetime."""
        self._values[name] = value
