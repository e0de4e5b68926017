"""The signal bus contract (`gateway.store.abc.SignalBus`), run over the one-process bus and
PostgreSQL's LISTEN/NOTIFY bus; and the signals themselves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.cluster.bus import LocalBus, PgBus, Signal, SignalAction
from gateway.contracts.ids import SessionKey
from gateway.store import Store
from gateway.store.abc import SignalBus

pytestmark = pytest.mark.timeout(60)

KEY = SessionKey("test:default:chat-1")


@pytest.fixture(
    params=[
        pytest.param("local", id="local"),
        pytest.param("pg", id="pg", marks=pytest.mark.postgres),
    ]
)
async def bus_and_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[SignalBus, Store]]:
    """Each bus, with a store whose transactions it publishes in."""
    if request.param == "local":
        async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}") as store:
            yield LocalBus("sender"), store
        return
    url = request.getfixturevalue("pg_url")
    assert isinstance(url, str)
    async with Store.open(url) as store:
        yield PgBus(url, "sender"), store


# signals --------------------------------------------------------------------------------------


def test_every_action_survives_the_payload() -> None:
    for action in SignalAction:
        signal = Signal(action, str(KEY), "why", "origin")
        decoded = Signal.decode(signal.encode())
        assert decoded == signal
        assert decoded is not None
        assert decoded.action is action


def test_a_payload_that_is_not_ours_is_no_signal() -> None:
    assert Signal.decode("not json") is None
    assert Signal.decode('{"a": "dance", "k": "", "o": "x"}') is None, "unknown action"
    assert Signal.decode('{"k": "", "o": "x"}') is None


def test_an_action_is_a_signal_action() -> None:
    assert Signal("wake", str(KEY)).action is SignalAction.WAKE
    with pytest.raises(ValueError, match="dance"):
        Signal("dance")


# the contract ---------------------------------------------------------------------------------


async def test_clustered_is_a_property_of_the_bus(bus_and_store: tuple[SignalBus, Store]) -> None:
    bus, _ = bus_and_store
    assert bus.clustered is isinstance(bus, PgBus)
    assert bus.connected is not bus.clustered, "a listener connects only once it runs"


async def test_a_publisher_never_hears_its_own_signals(
    bus_and_store: tuple[SignalBus, Store],
) -> None:
    bus, store = bus_and_store
    got: list[Signal] = []
    bus.subscribe(got.append)
    async with store.write() as conn:
        await bus.publish(conn, Signal(SignalAction.WAKE, str(KEY)))
    assert got == []


# PostgreSQL: signals travel -------------------------------------------------------------------


@pytest.mark.postgres
async def test_signals_reach_the_other_instances_only_when_committed(pg_url: str) -> None:
    async with Store.open(pg_url) as store, asyncio.TaskGroup() as tg:
        sender = PgBus(pg_url, "sender")
        receiver = PgBus(pg_url, "receiver")
        got: list[Signal] = []
        arrived = asyncio.Event()

        def on_signal(signal: Signal) -> None:
            got.append(signal)
            arrived.set()

        receiver.subscribe(on_signal)
        sender.subscribe(on_signal)  # its own signals are not delivered to itself
        listening = [tg.create_task(receiver.run()), tg.create_task(sender.run())]
        async with asyncio.timeout(10):
            while not (receiver.connected and sender.connected and len(got) >= 2):
                await arrived.wait()
                arrived.clear()
        assert {s.action for s in got} == {SignalAction.RESYNC}
        got.clear()

        async def rolled_back() -> None:
            async with store.write() as conn:
                await sender.publish(conn, Signal("interrupt", "never"))
                raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            await rolled_back()
        async with store.write() as conn:
            await sender.publish(conn, Signal("steer", str(KEY), "why"))
        async with asyncio.timeout(10):
            await arrived.wait()
        assert got == [Signal("steer", str(KEY), "why", "sender")]
        for task in listening:
            task.cancel()
