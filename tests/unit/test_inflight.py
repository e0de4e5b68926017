"""Calls under way hold an adapter's connection open until they end (or the limit passes)."""

from __future__ import annotations

import asyncio

import pytest

from adapters.inflight import InFlight

pytestmark = pytest.mark.timeout(10)


async def test_drained_waits_for_every_call_under_way() -> None:
    inflight = InFlight()
    assert await inflight.drained(0)
    release = asyncio.Event()
    ended: list[str] = []

    async def call(name: str) -> None:
        async with inflight.track():
            await release.wait()
            ended.append(name)

    async with asyncio.TaskGroup() as group:
        group.create_task(call("a"))
        group.create_task(call("b"))
        await asyncio.sleep(0)
        waiting = group.create_task(inflight.drained(5))
        await asyncio.sleep(0)
        assert not waiting.done()
        release.set()
        assert await waiting
    assert sorted(ended) == ["a", "b"]


async def test_a_failed_call_counts_as_ended_and_a_stuck_one_times_out() -> None:
    inflight = InFlight()
    with pytest.raises(RuntimeError):
        async with inflight.track():
            raise RuntimeError("the platform refused")
    assert await inflight.drained(0)
    stuck = asyncio.Event()

    async def hang() -> None:
        async with inflight.track():
            await stuck.wait()

    async with asyncio.TaskGroup() as group:
        group.create_task(hang())
        await asyncio.sleep(0)
        assert not await inflight.drained(0.01)
        stuck.set()
