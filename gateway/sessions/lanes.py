"""Lanes: one worker per session with waiting messages, at most one turn at a time.

A lane is claimed before its first turn (in a cluster, in SQL: one instance at a time), reads
the session's waiting rows, forms the next turn by the session's busy policy, hands it to the
turn runner, and lets the claim go when nothing waits. A worker that fails tries again with
backoff; draining stops every worker at its next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.cluster.lanes import Claim
from gateway.contracts.config import BusyMode
from gateway.contracts.errors import LeaseLost
from gateway.contracts.ids import SessionKey
from gateway.contracts.messages import utcnow
from gateway.sessions.context import SessionContext
from gateway.sessions.policies import policy
from gateway.sessions.state import INTERRUPTED_BY_NEWER, Lane
from gateway.store import inbox as inbox_sql
from gateway.store.inbox import InboxRow, Outcome

logger = logging.getLogger(__name__)

RunBatch = Callable[[SessionKey, Lane, list[InboxRow]], Awaitable[None]]
RunCommand = Callable[[InboxRow], Awaitable[None]]


class LaneWorkers:
    """Starts, runs and frees the lanes of `ctx.lanes`."""

    def __init__(self, ctx: SessionContext, run_batch: RunBatch, run_command: RunCommand) -> None:
        self.ctx = ctx
        self.run_batch = run_batch
        self.run_command = run_command

    def wake(self, key: SessionKey) -> None:
        """Nudge the lane of `key`, starting its worker when it has none (not when draining)."""
        if not self.ctx.accepting:
            return
        lane = self.ctx.lanes.setdefault(key, Lane())
        lane.wake.set()
        if lane.worker is None:
            lane.worker = self.ctx.spawn(self._worker(key, lane), f"lane {key}")

    def release(self, key: SessionKey, lane: Lane) -> None:
        """Forget the lane once nothing here uses it."""
        if lane.users == 0 and lane.worker is None and self.ctx.lanes.get(key) is lane:
            del self.ctx.lanes[key]

    async def claim(self, key: SessionKey, lane: Lane) -> Claim | None:
        """Hold the session's lane (once per lane, whoever asks); None while another
        instance holds it. A fresh claim in a cluster first runs the commands a stopped
        instance left unanswered."""
        async with lane.claiming:
            if lane.claim is not None:
                return lane.claim
            claim = await self.ctx.lane_store.claim(key)
            if claim is None:
                return None
            lane.claim = claim
        if self.ctx.clustered:
            async with self.ctx.store.read() as conn:
                commands = await inbox_sql.pending(conn, key, kind="command")
            for row in commands:
                await self.run_command(row)
        return claim

    async def unclaim(self, lane: Lane, *, worker: bool = False) -> bool:
        """Let the session's lane go when nothing here uses it any more; True if it did."""
        async with lane.claiming:
            if lane.claim is None or lane.users > 0 or (lane.worker is not None and not worker):
                return False
            claim, lane.claim = lane.claim, None
        await self.ctx.lane_store.release(claim)
        return True

    async def _worker(self, key: SessionKey, lane: Lane) -> None:
        failures = 0
        try:
            while self.ctx.accepting:
                try:
                    if lane.claim is None and await self.claim(key, lane) is None:
                        break  # another instance runs this session; it was told
                    if failures:
                        await self._release_unsettled(key, lane)
                    batch = await self._look(key, lane)
                    if batch is None:
                        if lane.wake.is_set():
                            continue
                        if await self.unclaim(lane, worker=True) and lane.wake.is_set():
                            continue  # something arrived while letting go
                        break
                    if batch:
                        await self.run_batch(key, lane, batch)
                    failures = 0
                except LeaseLost:
                    raise
                except Exception:
                    lane.drained = False  # whatever a settlement saw, look again
                    # The database may be away for a moment: try again, slower each time.
                    if failures == 0:
                        logger.exception("lane %s failed; trying again with backoff", key)
                    else:
                        logger.debug("lane %s failed again (%d)", key, failures, exc_info=True)
                    lane.retry_in = max(lane.retry_in, self.ctx.model_backoff.delay(failures))
                    failures += 1
                if lane.retry_in > 0:
                    await self.ctx.pause(lane.retry_in)
                    lane.retry_in = 0.0
        except LeaseLost as err:
            lane.claim = None
            logger.warning("%s; this instance stops working on it", err)
        finally:
            lane.worker = None
            self.release(key, lane)

    async def _look(self, key: SessionKey, lane: Lane) -> list[InboxRow] | None:
        """The next batch (as `_next_batch`); None without a read when the last turn's
        settlement saw nothing waiting and nothing woke the lane since."""
        drained, lane.drained = lane.drained, False
        if drained and not lane.wake.is_set():
            return None
        lane.wake.clear()
        return await self._next_batch(key, lane)

    async def _release_unsettled(self, key: SessionKey, lane: Lane) -> None:
        """After a failed try (the database went away mid-turn), the rows that turn took and
        could not settle wait again, first in line: later messages must not overtake them."""
        async with lane.lock, self.ctx.store.write() as conn:
            released = await inbox_sql.release_running(conn, key)
        if released:
            logger.info("lane %s: %d message(s) of an unsettled turn wait again", key, released)

    async def _drop_interrupted(self, key: SessionKey, lane: Lane, rows: list[InboxRow]) -> None:
        """Before an interrupting message's turn: the waiting rows that an earlier turn already
        stored in the history were what it interrupted, cut off by a stop before that turn
        settled them. They are dropped as the interrupt would have dropped them: answered
        after it, each would find the newer message, not itself, at the end of its history,
        and the newer message would be answered twice."""
        cut = [r.id for r in rows[1:] if r.turn_id is not None]
        if not cut:
            return
        async with lane.settling, self.ctx.store.write() as conn:
            dropped = await inbox_sql.settle(
                conn, cut, Outcome.DROPPED, detail=INTERRUPTED_BY_NEWER, only_pending=True
            )
        if dropped:
            self.ctx.metrics.outcomes.labels(outcome=str(Outcome.DROPPED)).inc(dropped)
            logger.info("lane %s: %d message(s) cut off by a stop were interrupted", key, dropped)

    async def _next_batch(self, key: SessionKey, lane: Lane) -> list[InboxRow] | None:
        """The rows of the next turn; [] to look again; None when nothing waits."""
        ctx = self.ctx
        lane.batch_stops = lane.stops

        async def look(conn: AsyncConnection) -> tuple[list[InboxRow], BusyMode | None]:
            rows = await inbox_sql.pending(conn, key)
            if not rows:
                return rows, None
            return rows, await ctx.mode(
                conn, key, ctx.platforms.get((rows[0].platform, rows[0].account))
            )

        rows, mode = await ctx.store.unit(look, write=False)
        if not rows or mode is None:
            return None
        if rows[0].priority > 0:
            await self._drop_interrupted(key, lane, rows)
            return rows[:1]  # an interrupting message is answered alone, first
        busy = policy(mode)
        if busy.debounce and ctx.config.debounce_seconds > 0:
            newest = max(r.accepted_at for r in rows)
            quiet = (utcnow() - newest).total_seconds()
            if quiet < ctx.config.debounce_seconds:
                try:
                    async with asyncio.timeout(ctx.config.debounce_seconds - quiet):
                        await lane.wake.wait()
                except TimeoutError:
                    pass
                return []
        return busy.next_turn(rows, ctx.config.queue_cap)
