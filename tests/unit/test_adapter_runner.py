"""`AdapterRunner` keeps one adapter connected; `Backoff` spaces its reconnects."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

import pytest

from adapters.loopback import PLATFORM as TEST
from gateway.backoff import Backoff
from gateway.contracts.adapter import AdapterState, InboundSink
from gateway.contracts.errors import AuthError, NotReady
from gateway.contracts.ids import AccountId, PlatformMessageId
from gateway.contracts.messages import (
    DeliveryReceipt,
    InboundMessage,
    OutboundMessage,
    SendLimits,
)
from gateway.metrics import Metrics
from gateway.supervisor import AdapterRunner

WAIT = 5.0
"""Upper bound of every wait for the runner to reach a state."""

BACKOFF = Backoff(initial=1.0, factor=2.0, maximum=5.0)
"""Bases 1, 2, 4, 5, 5, … seconds: never slept for real, the tests inject `sleep`."""


class Probe:
    """Lets a test wait, with a timeout, until a condition about the runner holds."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()

    async def poke(self) -> None:
        """Something happened: re-check the waiting conditions."""
        async with self._changed:
            self._changed.notify_all()

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` is true; TimeoutError after `WAIT` seconds."""
        async with asyncio.timeout(WAIT), self._changed:
            await self._changed.wait_for(predicate)


class Sleeper:
    """The injected `sleep`: records each delay and returns at once unless `gate` is cleared."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.delays: list[float] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await self.probe.poke()
        await self.gate.wait()
        await asyncio.sleep(0)  # a retry loop must never starve the event loop


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one connection of the fake adapter does; with neither error, run until cancelled."""

    on_enter: Exception | None = None
    """Raised by `__aenter__`."""
    on_run: Exception | None = None
    """Raised by `run` once the receive loop has started."""
    returns: bool = False
    """`run` returns (the receive loop ended) instead of raising or holding."""


class FakeAdapter:
    """An adapter that follows one `Attempt` and records what happened to it."""

    platform = TEST
    account = AccountId("fake")
    limits = SendLimits()

    def __init__(self, attempt: Attempt, probe: Probe) -> None:
        self.attempt = attempt
        self.probe = probe
        self.live = AdapterState.RECEIVING
        self.entered = False
        self.running = False
        self.exited = False
        self.exit_exception: type[BaseException] | None = None
        self.sink: InboundSink | None = None

    async def __aenter__(self) -> Self:
        await asyncio.sleep(0)
        if self.attempt.on_enter is not None:
            raise self.attempt.on_enter
        self.entered = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        exc_type = exc[0] if exc else None
        self.exit_exception = exc_type if isinstance(exc_type, type) else None
        self.exited = True
        self.running = False
        await self.probe.poke()

    async def run(self, sink: InboundSink) -> None:
        self.sink = sink
        self.running = True
        await self.probe.poke()
        if self.attempt.on_run is not None:
            raise self.attempt.on_run
        if self.attempt.returns:
            return
        await asyncio.Future()  # receive until cancelled

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        return DeliveryReceipt(PlatformMessageId(message.idempotency_key))

    def liveness(self) -> AdapterState:
        return self.live


class Adapters:
    """The factory the runner calls: one `FakeAdapter` per scripted attempt, then hold."""

    def __init__(self, probe: Probe, *attempts: Attempt) -> None:
        self.probe = probe
        self.script = deque(attempts)
        self.made: list[FakeAdapter] = []

    def __call__(self) -> FakeAdapter:
        attempt = self.script.popleft() if self.script else Attempt()
        adapter = FakeAdapter(attempt, self.probe)
        self.made.append(adapter)
        return adapter

    @property
    def last(self) -> FakeAdapter:
        """The adapter of the latest attempt."""
        return self.made[-1]

    def receiving(self, attempts: int = 1) -> bool:
        """True once exactly `attempts` adapters were made and the latest one is receiving."""
        return len(self.made) == attempts and self.made[-1].running


class Sink:
    """An inbound sink nobody calls in these tests."""

    def __init__(self) -> None:
        self.accepted: list[InboundMessage] = []

    async def accept(self, message: InboundMessage) -> None:
        self.accepted.append(message)


@dataclass(frozen=True, slots=True)
class Rig:
    """A runner wired to a scripted factory, a recording sleep and its own metrics."""

    runner: AdapterRunner
    adapters: Adapters
    sleeper: Sleeper
    probe: Probe
    metrics: Metrics


class Clock:
    """The runner's monotonic clock: each reading is `step` seconds after the previous one."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def rig(
    *attempts: Attempt, name: str = "fake", backoff: Backoff = BACKOFF, clock: Clock | None = None
) -> Rig:
    """A runner named `name` whose adapter connections follow `attempts`, then hold."""
    probe = Probe()
    adapters = Adapters(probe, *attempts)
    sleeper = Sleeper(probe)
    metrics = Metrics()
    runner = AdapterRunner(
        name, adapters, Sink(), metrics, backoff=backoff, sleep=sleeper, clock=clock or Clock()
    )
    return Rig(runner, adapters, sleeper, probe, metrics)


def restarts_metric(metrics: Metrics, name: str) -> float:
    """The `herald_adapter_restarts_total` sample of adapter `name`."""
    value = metrics.registry.get_sample_value("herald_adapter_restarts_total", {"adapter": name})
    return 0.0 if value is None else float(value)


def assert_jittered(delay: float, base: float) -> None:
    """`delay` is `base` times a factor in [0.5, 1.0] (give or take float rounding)."""
    slack = 1e-9 * base
    assert 0.5 * base - slack <= delay <= base + slack, f"{delay} not in [0.5, 1.0] x {base}"


async def stop(task: asyncio.Task[None]) -> None:
    """Cancel a runner task and check that the cancellation came out of it."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(WAIT):
            await task


# Backoff -----------------------------------------------------------------------------------------


def test_backoff_grows_by_its_factor_with_jitter_and_is_capped() -> None:
    backoff = Backoff(initial=0.1, factor=3.0, maximum=2.0)
    bases = [0.1, 0.3, 0.9, 2.0, 2.0]

    for attempt, base in enumerate(bases):
        for _ in range(50):
            assert_jittered(backoff.delay(attempt), base)


def test_backoff_is_jittered() -> None:
    delays = {Backoff().delay(3) for _ in range(50)}

    assert len(delays) > 1


def test_backoff_of_a_huge_attempt_number_is_the_maximum() -> None:
    backoff = Backoff(initial=1.0, factor=10.0, maximum=300.0)

    assert_jittered(backoff.delay(10_000), 300.0)


# retries -----------------------------------------------------------------------------------------


async def test_not_ready_is_retried_with_growing_jittered_capped_delays() -> None:
    r = rig(*[Attempt(on_enter=NotReady("network down")) for _ in range(6)])
    task = asyncio.create_task(r.runner.run())

    await r.probe.until(lambda: r.adapters.receiving(7))

    assert len(r.sleeper.delays) == 6
    for delay, base in zip(r.sleeper.delays, [1.0, 2.0, 4.0, 5.0, 5.0, 5.0], strict=True):
        assert_jittered(delay, base)
    assert r.runner.restarts == 6
    assert restarts_metric(r.metrics, "fake") == 6
    assert r.runner.last_error == "network down"
    assert r.runner.liveness() is AdapterState.RECEIVING
    await stop(task)


async def test_a_generic_error_is_retried_like_not_ready() -> None:
    r = rig(Attempt(on_run=RuntimeError("socket exploded")), Attempt(on_enter=ValueError("bad")))
    task = asyncio.create_task(r.runner.run())

    await r.probe.until(lambda: r.adapters.receiving(3))

    assert r.runner.last_error == "ValueError: bad"
    assert r.runner.restarts == 2
    assert r.adapters.made[0].exited
    assert r.adapters.made[0].exit_exception is RuntimeError
    await stop(task)


async def test_a_receive_loop_that_returns_is_reconnected() -> None:
    r = rig(Attempt(returns=True))
    task = asyncio.create_task(r.runner.run())

    await r.probe.until(lambda: r.adapters.receiving(2))

    assert r.runner.last_error == "the receive loop ended"
    assert r.adapters.made[0].exited
    assert r.runner.restarts == 1
    assert_jittered(r.sleeper.delays[0], 1.0)
    await stop(task)


async def test_the_attempt_counter_resets_after_a_connection_that_lasted() -> None:
    r = rig(
        Attempt(on_enter=NotReady("down")),
        Attempt(on_enter=NotReady("down")),
        Attempt(on_enter=NotReady("down")),
        Attempt(on_run=NotReady("dropped")),
        Attempt(on_enter=NotReady("down")),
        clock=Clock(step=60.0),  # every connection lasts longer than `stable`
    )
    task = asyncio.create_task(r.runner.run())

    await r.probe.until(lambda: r.adapters.receiving(6))

    bases = [1.0, 2.0, 4.0, 1.0, 2.0]
    for delay, base in zip(r.sleeper.delays, bases, strict=True):
        assert_jittered(delay, base)
    assert r.runner.restarts == 5
    await stop(task)


async def test_a_connection_that_fails_at_once_keeps_backing_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Say the database is full: each connection works, and the first message it hands the
    # sink fails. Reconnecting at the first delay every time would spin and flood the log.
    r = rig(*[Attempt(on_run=RuntimeError("database or disk is full")) for _ in range(6)])
    with caplog.at_level(logging.INFO, logger="gateway.supervisor"):
        task = asyncio.create_task(r.runner.run())
        await r.probe.until(lambda: r.adapters.receiving(7))

    for delay, base in zip(r.sleeper.delays, [1.0, 2.0, 4.0, 5.0, 5.0, 5.0], strict=True):
        assert_jittered(delay, base)
    [logged] = caplog.records  # the first failure, with its traceback; the repeats counted
    assert logged.exc_info is not None
    assert "adapter fake failed: database or disk is full" in logged.getMessage()
    assert r.runner.failures.failures == 6
    await stop(task)


# credentials refused -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attempt",
    [
        pytest.param(Attempt(on_enter=AuthError("token revoked")), id="on-enter"),
        pytest.param(Attempt(on_run=AuthError("token revoked")), id="while-receiving"),
    ],
)
async def test_auth_error_stops_the_runner_for_good(attempt: Attempt) -> None:
    r = rig(Attempt(on_enter=NotReady("down")), attempt)

    async with asyncio.timeout(WAIT):
        await r.runner.run()

    assert r.runner.state is AdapterState.FAILED
    assert r.runner.liveness() is AdapterState.FAILED
    assert r.runner.last_error == "token revoked"
    assert len(r.adapters.made) == 2
    assert r.runner.restarts == 1
    assert restarts_metric(r.metrics, "fake") == 1
    assert r.runner.adapter is None
    if attempt.on_run is not None:
        assert r.adapters.last.exited


# liveness ----------------------------------------------------------------------------------------


async def test_liveness_is_the_adapters_own_while_receiving() -> None:
    r = rig()
    assert r.runner.liveness() is AdapterState.STARTING
    task = asyncio.create_task(r.runner.run())

    await r.probe.until(r.adapters.receiving)
    assert r.runner.liveness() is AdapterState.RECEIVING

    r.adapters.last.live = AdapterState.RECONNECTING  # connected, but no traffic is flowing
    assert r.runner.liveness() is AdapterState.RECONNECTING
    assert r.runner.state is AdapterState.RECEIVING
    await stop(task)


async def test_liveness_is_reconnecting_between_attempts() -> None:
    r = rig(Attempt(on_run=NotReady("dropped")))
    r.sleeper.gate.clear()
    task = asyncio.create_task(r.runner.run())

    await r.probe.until(lambda: len(r.sleeper.delays) == 1)
    assert r.runner.liveness() is AdapterState.RECONNECTING
    assert r.runner.adapter is None
    assert r.adapters.last.exited

    r.sleeper.gate.set()
    await r.probe.until(lambda: r.adapters.receiving(2))
    assert r.runner.liveness() is AdapterState.RECEIVING
    await stop(task)


# isolation and cancellation ----------------------------------------------------------------------


async def test_one_runner_failing_does_not_stop_another_in_the_same_task_group() -> None:
    failing = rig(Attempt(on_enter=AuthError("bad token")), name="failing")
    healthy = rig(name="healthy")

    async with asyncio.timeout(WAIT), asyncio.TaskGroup() as tg:
        failed = tg.create_task(failing.runner.run())
        receiving = tg.create_task(healthy.runner.run())
        await failed
        await healthy.probe.until(healthy.adapters.receiving)

        assert failing.runner.liveness() is AdapterState.FAILED
        assert healthy.runner.liveness() is AdapterState.RECEIVING
        assert not receiving.done()
        receiving.cancel()

    assert receiving.cancelled()
    assert healthy.adapters.last.exited


async def test_cancellation_exits_the_adapter_and_propagates() -> None:
    r = rig()
    task = asyncio.create_task(r.runner.run())
    await r.probe.until(r.adapters.receiving)

    await stop(task)

    assert r.adapters.last.exited
    assert r.adapters.last.exit_exception is asyncio.CancelledError
    assert r.runner.adapter is None
    assert r.runner.restarts == 0


async def test_cancellation_during_the_backoff_propagates() -> None:
    r = rig(Attempt(on_enter=NotReady("down")))
    r.sleeper.gate.clear()
    task = asyncio.create_task(r.runner.run())
    await r.probe.until(lambda: len(r.sleeper.delays) == 1)

    await stop(task)

    assert len(r.adapters.made) == 1
    assert r.runner.adapter is None


async def test_a_cancelled_runner_reports_stopped() -> None:
    r = rig()
    task = asyncio.create_task(r.runner.run())
    await r.probe.until(r.adapters.receiving)

    await stop(task)

    assert r.runner.liveness() is AdapterState.STOPPED
