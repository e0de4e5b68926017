"""Cluster signals: what other instances ask of the turns running here, and work that no
live instance is doing (several instances on one PostgreSQL; nothing happens on one)."""

from __future__ import annotations

import asyncio
import logging

from gateway.cluster.bus import Signal, SignalAction
from gateway.cluster.lanes import LaneState
from gateway.contracts.ids import SessionKey
from gateway.sessions.context import SessionContext
from gateway.sessions.state import INTERRUPTED_BY_NEWER, Lane, Running
from gateway.store import inbox as inbox_sql

logger = logging.getLogger(__name__)


class ClusterSignals:
    """Reacts to signals from other instances, sends them its own, and scans for orphans."""

    def __init__(self, ctx: SessionContext, scan_interval: float) -> None:
        self.ctx = ctx
        self.scan_interval = scan_interval
        self.scan = asyncio.Event()
        """Set to look for orphaned sessions at once (after a resync, when draining)."""

    def on_signal(self, signal: Signal) -> None:
        """A hint from another instance (see `gateway.cluster.bus`)."""
        ctx = self.ctx
        if signal.action is SignalAction.RESYNC:
            self.scan.set()
            assert ctx.tg is not None
            ctx.tg.create_task(self._missed_signals(), name="missed signals")
            return
        if not signal.key or not ctx.accepting:
            return
        key = SessionKey(signal.key)
        lane = ctx.lanes.get(key)
        running = lane.running if lane is not None else None
        if signal.action in (SignalAction.CANCEL, SignalAction.INTERRUPT):
            # Any role that can connect may NOTIFY: only the lane's stored request counts.
            if lane is not None and running is not None and lane.claim is not None:
                assert ctx.tg is not None
                ctx.tg.create_task(
                    self._confirm_cancel(key, lane, running, signal), name=f"cancel {key}"
                )
                return
        elif signal.action is SignalAction.STEER and running is not None:
            assert ctx.tg is not None
            ctx.tg.create_task(self._pick_up_steer(key, running), name=f"steer {key}")
            return
        if signal.action is not SignalAction.CANCEL and lane is not None and lane.claim is not None:
            ctx.wake(key)  # a lane free here is found by the scan, if nobody else runs it

    async def _missed_signals(self) -> None:
        """The signal connection came back: what was asked of the turns running here while
        it was away (cancels are stored on the lane, steer texts in the inbox)."""
        for key, lane in list(self.ctx.lanes.items()):
            running, claim = lane.running, lane.claim
            if running is None or claim is None:
                continue
            try:
                reason = await self.ctx.lane_store.cancel_requested(claim)
            except Exception as err:  # the next resync looks again
                logger.warning("could not read cancel requests for %s: %s", key, err)
                continue
            if reason is not None:
                logger.info("%s: a cancel came while signals were away (%s)", key, reason)
                running.cancel(reason)
            else:
                await self._pick_up_steer(key, running)

    async def _confirm_cancel(
        self, key: SessionKey, lane: Lane, running: Running, signal: Signal
    ) -> None:
        """Cancel the running turn only when the lane's row in SQL asks for it (a signal is
        only a hint to look): what another instance asks is stored with its signal."""
        claim = lane.claim
        if claim is None:
            return
        try:
            reason = await self.ctx.lane_store.cancel_requested(claim)
        except Exception as err:  # the next resync reads it again
            logger.warning("could not read the cancel request for %s: %s", key, err)
            return
        if reason is None:
            self.ctx.bus.ignore(
                "unconfirmed",
                f"{signal.action} for {key} from {signal.origin!r}, which no stored request "
                "confirms",
            )
            return
        if lane.running is not running:
            return  # that turn ended meanwhile; a request for a later one is read anew
        if reason != INTERRUPTED_BY_NEWER:
            lane.stops += 1  # a /stop: what this turn would try again is dropped instead
        running.cancel(reason)

    async def _pick_up_steer(self, key: SessionKey, running: Running) -> None:
        """Steer rows another instance stored for the turn running here."""
        try:
            async with self.ctx.store.read() as conn:
                rows = await inbox_sql.pending(conn, key)
        except Exception as err:  # the row stays pending and becomes the next turn
            logger.warning("could not read steer messages for %s: %s", key, err)
            return
        known = {*running.ids, *running.steer.taken, *(i for i, _ in running.steer.waiting)}
        for row in rows:
            if not row.steer or row.id in known:
                continue
            if not await self.ctx.steers_into(
                running, row.platform, row.account, row.chat_id, row.thread_id
            ):
                try:  # the chat is bound to another profile now: a turn of its own
                    async with self.ctx.store.write() as conn:
                        await inbox_sql.unsteer(conn, [row.id])
                except Exception as err:
                    logger.warning("could not give message %s its own turn: %s", row.id, err)
                continue
            speaker = self.ctx.speaker(
                row.platform,
                row.sender_id,
                row.sender_name,
                direct=row.is_direct,
                account=row.account,
            )
            running.steer.add(row.id, row.text, speaker=speaker, files=bool(row.attachments))
        self.ctx.wake(key)

    async def scanner(self) -> None:
        """Take up work no live instance is doing, every `scan_interval` seconds (and at once
        after the signal connection came back)."""
        ctx = self.ctx
        while ctx.accepting:
            try:
                async with asyncio.timeout(self.scan_interval):
                    await self.scan.wait()
            except TimeoutError:
                pass
            self.scan.clear()
            if ctx.draining.is_set():  # drain began while waiting
                return
            try:
                orphans = await ctx.lane_store.orphans()
            except Exception as err:  # the database may be away for a moment
                logger.warning("looking for orphaned sessions failed: %s", err)
                continue
            for key in orphans:
                lane = ctx.lanes.get(key)
                # A lane in use here is not an orphan, whatever SQL says about its owner.
                if lane is None or (lane.worker is None and lane.claim is None and not lane.users):
                    ctx.wake(key)

    async def elsewhere(self, key: SessionKey) -> LaneState | None:
        """The lane of `key` when another instance holds it."""
        if not self.ctx.clustered:
            return None
        async with self.ctx.store.read() as conn:
            state = await self.ctx.lane_store.state(conn, key)
        return state if state.owner not in (None, self.ctx.instance) else None

    async def tell_owner(self, key: SessionKey, action: SignalAction, reason: str) -> None:
        """Signal the instance running `key`, when that is another one."""
        ctx = self.ctx
        if not ctx.clustered:
            return
        async with ctx.store.write() as conn:
            state = await ctx.lane_store.state(conn, key)
            if state.owner is not None and state.owner != ctx.instance:
                if action is SignalAction.CANCEL and state.turn_id is not None:
                    await ctx.lane_store.request_cancel(conn, key, state.turn_id, reason)
                await ctx.bus.publish(conn, Signal(action, key, reason))
