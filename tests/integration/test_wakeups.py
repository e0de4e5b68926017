"""A guard on the loop's wake-ups per answered turn (issue 38, part 3): tasks created and
timers armed by the turn's path (`bench.wakeups`), over turns answered one after another
through the in-process rig, each waited for on the adapter's condition. Counts, never a time.

Left out, each for its reason: the cluster scanner (a timer per `scan_interval`, so its count
follows the clock), the test's own `asyncio.timeout` per wait, and the store's tasks
(SQLAlchemy shields each connection's close in a task: 16-17 a turn on SQLite today; the
store's trips have their own guard)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.wakeups import Wakeups
from gateway.store import Store
from tests.fakes.platform import inbound
from tests.integration.rig import running_rig

TURNS = 10
TASKS_PER_TURN = 4
"""The lane's worker, the agent's turn, the typing indicator and the delivery of the answer
(measured 2026-11-28; lower it when a long-lived task takes one over)."""
TIMERS_PER_TURN = 6
"""The typing indicator's two, the turn's deadline, and one for each pass of the delivery
worker, which passes two or three times a turn (how the answer's wake and the send's end fall
together; 20-27 over ten turns measured on both stores)."""
NOT_THE_TURN = {"ClusterSignals.scanner", "count_turns"}
STORE_TASKS = {"AsyncConnection.close"}


async def count_turns(store: Store, tmp_path: Path) -> Wakeups:
    """Counts over `TURNS` answered turns, after one warm-up turn."""
    async with running_rig(store, tmp_path, gated=False) as rig:
        await rig.manager.accept(inbound("warm up", chat="w"))
        await rig.adapter.wait_for(lambda d: len(d) >= 1)
        with Wakeups.on(asyncio.get_running_loop()) as counts:
            for i in range(TURNS):
                await rig.manager.accept(inbound(f"question {i}", chat=f"c{i}"))
                await rig.adapter.wait_for(lambda d, n=i + 2: len(d) >= n)
    return counts


async def test_an_answered_turn_creates_at_most_four_tasks_and_arms_six_timers(
    store: Store, tmp_path: Path
) -> None:
    counts = await count_turns(store, tmp_path)
    tasks = {name: n for name, n in counts.tasks.items() if name not in STORE_TASKS}
    timers = {
        caller: n
        for (method, caller), n in counts.by_caller.items()
        if method == "call_at" and caller not in NOT_THE_TURN and not caller.startswith("test_")
    }
    assert sum(tasks.values()) <= TASKS_PER_TURN * TURNS, tasks
    assert sum(timers.values()) <= TIMERS_PER_TURN * TURNS, timers
