"""Two instances in one process on one PostgreSQL: a session's turns run on the instance
holding its lane, and busy-mode signals accepted by the other one reach that turn."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from gateway.cluster.node import Node
from gateway.config import ClusterConfig
from gateway.contracts.config import BusyMode
from gateway.contracts.history import Role
from gateway.contracts.ids import SessionKey
from gateway.store import Store
from gateway.store.inbox import Outcome
from tests.fakes.platform import GatedLLM, RecordingAdapter, inbound
from tests.integration.rig import Rig, running_rig
from tests.integration.test_busy_modes import (
    KEY,
    busy_config,
    by_text,
    entered_tool,
    quiet,
    replies,
    wait_replies,
)

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

CLUSTER = ClusterConfig(lease_ttl=3.0, heartbeat_interval=0.5, scan_interval=0.2)


@asynccontextmanager
async def two_instances(
    pg_url: str, tmp_path: Path, mode: BusyMode
) -> AsyncIterator[tuple[Rig, Rig]]:
    """Instances `a` and `b` sharing the database, one platform adapter and one LLM."""
    adapter = RecordingAdapter()
    llm = GatedLLM()
    async with (
        Store.open(pg_url) as store,
        Node(store, "a", CLUSTER, pg_url) as node_a,
        Node(store, "b", CLUSTER, pg_url) as node_b,
        running_rig(
            store, tmp_path / "a", node=node_a, adapter=adapter, llm=llm, sessions=busy_config(mode)
        ) as a,
        running_rig(
            store, tmp_path / "b", node=node_b, adapter=adapter, llm=llm, sessions=busy_config(mode)
        ) as b,
    ):
        async with asyncio.timeout(10):
            while not (node_a.bus.connected and node_b.bus.connected):
                await asyncio.sleep(0.01)
        yield a, b


async def test_a_steer_accepted_by_another_instance_joins_the_running_turn(
    pg_url: str, tmp_path: Path
) -> None:
    async with two_instances(pg_url, tmp_path, BusyMode.STEER) as (a, b):
        a.llm.release("tool:look it up", "also mention the weather")
        await a.manager.accept(inbound("tool:look it up"))
        await entered_tool(a)  # the turn runs on a, waiting inside the tool
        assert a.manager.running(SessionKey(KEY))

        await b.manager.accept(inbound("also mention the weather"))
        assert not b.manager.running(SessionKey(KEY)), "b did not start a turn of its own"
        async with asyncio.timeout(5):  # the signal reaches a
            while a.manager.steering(SessionKey(KEY)) == 0:
                await asyncio.sleep(0.01)
        a.tool.gate.set()

        rows = by_text(await a.settled(KEY, 2))
        assert await wait_replies(a, 1) == ["answer to also mention the weather"]
        assert rows["also mention the weather"].outcome is Outcome.STEERED
        assert rows["also mention the weather"].turn_id == rows["tool:look it up"].turn_id
        second = a.llm.calls[1]
        assert (second[-1].role, second[-1].content) == (Role.USER, "also mention the weather")
        await quiet(a)
        assert len(replies(a)) == 1


async def test_an_interrupt_accepted_by_another_instance_stops_the_running_turn(
    pg_url: str, tmp_path: Path
) -> None:
    async with two_instances(pg_url, tmp_path, BusyMode.INTERRUPT) as (a, b):
        await a.manager.accept(inbound("long question"))
        await a.llm.wait_started("long question")
        a.llm.release("new question")

        await b.manager.accept(inbound("new question"))
        rows = by_text(await a.settled(KEY, 2))
        assert rows["long question"].outcome is Outcome.DROPPED
        assert rows["new question"].outcome is Outcome.ANSWERED
        assert await wait_replies(a, 1) == ["answer to new question"]
        a.llm.release("long question")  # the stale answer, if it ever came, is never sent
        await quiet(a)
        await quiet(b)
        assert replies(a) == ["answer to new question"]


async def test_stop_sent_to_another_instance_cancels_the_turn_and_clears_the_queue(
    pg_url: str, tmp_path: Path
) -> None:
    async with two_instances(pg_url, tmp_path, BusyMode.QUEUE) as (a, b):
        await a.manager.accept(inbound("first"))
        await a.llm.wait_started("first")
        await b.manager.accept(inbound("second"))
        await b.manager.accept(inbound("/stop"))
        rows = by_text(await a.settled(KEY, 3))
        assert rows["first"].outcome is Outcome.DROPPED
        assert rows["second"].outcome is Outcome.DROPPED
        stop = await a.adapter.wait_for(lambda d: any(x.key.startswith("cmd:") for x in d))
        assert "Stopped." in next(x.text for x in stop if x.key.startswith("cmd:"))
        await quiet(a)
        assert replies(a) == []


async def test_stop_whose_signal_was_lost_still_cancels_once_the_owner_listens_again(
    pg_url: str, tmp_path: Path
) -> None:
    async with two_instances(pg_url, tmp_path, BusyMode.QUEUE) as (a, b):
        await a.manager.accept(inbound("first"))
        await a.llm.wait_started("first")
        # a's signal connection drops (a PostgreSQL restart, a proxy's idle kill) ...
        async with a.store.write() as conn:
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'herald signals a'"
                )
            )
        # ... and /stop reaches b meanwhile: its NOTIFY is not heard by a.
        await b.manager.accept(inbound("/stop"))
        rows = by_text(await a.settled(KEY, 2))
        assert rows["first"].outcome is Outcome.DROPPED
        a.llm.release("first")
        await quiet(a)
        assert replies(a) == [], "the stopped turn's answer is never sent"


async def test_messages_queued_through_another_instance_are_answered_in_order(
    pg_url: str, tmp_path: Path
) -> None:
    async with two_instances(pg_url, tmp_path, BusyMode.QUEUE) as (a, b):
        await a.manager.accept(inbound("one"))
        await a.llm.wait_started("one")
        for text in ("two", "three"):
            await b.manager.accept(inbound(text))
        a.llm.release("one", "two", "three")
        rows = by_text(await a.settled(KEY, 3))
        assert all(r.outcome is Outcome.ANSWERED for r in rows.values())
        assert await wait_replies(a, 3) == ["answer to one", "answer to two", "answer to three"]
        turn_of = {t: rows[t].turn_id for t in ("one", "two", "three")}
        assert len(set(turn_of.values())) == 3


async def test_an_idle_session_runs_where_its_message_arrived_and_then_is_free(
    pg_url: str, tmp_path: Path
) -> None:
    async with two_instances(pg_url, tmp_path, BusyMode.QUEUE) as (a, b):
        b.llm.release("hello", "again")
        await b.manager.accept(inbound("hello"))
        assert await wait_replies(b, 1) == ["answer to hello"]
        await b.idle()
        await a.manager.accept(inbound("again"))
        assert await wait_replies(a, 2) == ["answer to hello", "answer to again"]
        rows = by_text(await a.settled(KEY, 2))
        assert rows["again"].outcome is Outcome.ANSWERED


async def test_a_forged_cancel_from_a_role_without_grants_changes_nothing(
    pg_url: str, tmp_path: Path
) -> None:
    """Any role that may connect can NOTIFY on Herald's channel: a running turn is cancelled
    only when its lane row asks for it, and the forged signals are counted."""
    role = f"forger_{secrets.token_hex(4)}"
    url = make_url(pg_url)
    async with (
        Store.open(pg_url) as store,
        Node(store, "a", CLUSTER, pg_url) as node,
        running_rig(store, tmp_path, node=node, sessions=busy_config(BusyMode.QUEUE)) as a,
    ):
        async with asyncio.timeout(10):
            while not node.bus.connected:
                await asyncio.sleep(0.01)
        await a.manager.accept(inbound("long question"))
        await a.llm.wait_started("long question")
        async with store.write() as conn:
            await conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        try:
            forger = await asyncpg.connect(
                host=url.host, port=url.port, user=role, database=url.database, timeout=10
            )
            try:
                for action in ("cancel", "interrupt"):
                    payload = json.dumps({"a": action, "k": KEY, "r": "forged", "o": "evil"})
                    await forger.execute("SELECT pg_notify('herald', $1)", payload)
                await forger.execute("SELECT pg_notify('herald', 'not a signal')")
                resync = json.dumps({"a": "resync", "k": "", "r": "", "o": "evil"})
                await forger.execute("SELECT pg_notify('herald', $1)", resync)
            finally:
                await forger.close()

            def ignored(reason: str) -> float:
                sample = a.manager.ctx.metrics.registry.get_sample_value(
                    "herald_signals_ignored_total", {"reason": reason}
                )
                return sample or 0.0

            async with asyncio.timeout(10):
                while ignored("unconfirmed") < 2 or ignored("malformed") < 2:
                    assert a.manager.running(SessionKey(KEY)), "a forged signal ended the turn"
                    await asyncio.sleep(0.01)
            assert a.manager.running(SessionKey(KEY)), "the turn still runs"
            a.llm.release("long question")
            rows = by_text(await a.settled(KEY, 1))
            assert rows["long question"].outcome is Outcome.ANSWERED
            assert await wait_replies(a, 1) == ["answer to long question"]
        finally:
            async with store.write() as conn:
                await conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
