"""Adapters' checkpoints on every store: durable, per account, any name length."""

from __future__ import annotations

import pytest

from gateway.checkpoints import MemoryCheckpoints, StoreCheckpoints
from gateway.store import Store

pytestmark = pytest.mark.timeout(30)


async def test_values_survive_a_reopen_and_stay_per_account(store_url: str) -> None:
    async with Store.open(store_url) as store:
        mine = StoreCheckpoints(store, "email", "default")
        other = StoreCheckpoints(store, "email", "work")
        assert await mine.get("uidvalidity") is None
        await mine.set("uidvalidity", "1")
        await mine.set("uidvalidity", "2")
        await other.set("uidvalidity", "9")
    async with Store.open(store_url) as store:
        assert await StoreCheckpoints(store, "email", "default").get("uidvalidity") == "2"
        assert await StoreCheckpoints(store, "email", "work").get("uidvalidity") == "9"


async def test_a_name_longer_than_the_key_column_is_kept(store: Store) -> None:
    checkpoints = StoreCheckpoints(store, "discord", "default")
    long_a, long_b = "last:" + "a" * 300, "last:" + "a" * 299 + "b"
    await checkpoints.set(long_a, "1")
    await checkpoints.set(long_b, "2")
    assert await checkpoints.get(long_a) == "1"
    assert await checkpoints.get(long_b) == "2"


async def test_memory_checkpoints() -> None:
    checkpoints = MemoryCheckpoints()
    assert await checkpoints.get("x") is None
    await checkpoints.set("x", "y")
    assert await checkpoints.get("x") == "y"
