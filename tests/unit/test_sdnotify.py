"""SystemdNotifier against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.sdnotify import SystemdNotifier

RECV_TIMEOUT = 5.0


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket in tmp_path and the NOTIFY_SOCKET value naming it."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.setblocking(False)
        yield sock, str(path)


@pytest.fixture
def abstract_listener() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket in the abstract namespace and its `@name` NOTIFY_SOCKET value."""
    name = f"herald-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.setblocking(False)
        yield sock, "@" + name


async def receive(sock: socket.socket) -> bytes:
    """The next datagram, failing the test if none arrives within RECV_TIMEOUT."""
    async with asyncio.timeout(RECV_TIMEOUT):
        return await asyncio.get_running_loop().sock_recv(sock, 4096)


def drain(sock: socket.socket) -> list[bytes]:
    """Every datagram already queued on the (non-blocking) socket."""
    queued = []
    while True:
        try:
            queued.append(sock.recv(4096))
        except BlockingIOError:
            return queued


async def test_sends_each_state_as_one_datagram(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address})
    assert notifier.enabled

    notifier.ready()
    notifier.status("draining 2 turns")
    notifier.watchdog()
    notifier.stopping()

    assert [await receive(sock) for _ in range(4)] == [
        b"READY=1",
        b"STATUS=draining 2 turns",
        b"WATCHDOG=1",
        b"STOPPING=1",
    ]


async def test_abstract_namespace_socket(abstract_listener: tuple[socket.socket, str]) -> None:
    sock, address = abstract_listener
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address})

    notifier.ready()

    assert await receive(sock) == b"READY=1"


async def test_status_keeps_to_one_assignment(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener

    SystemdNotifier({"NOTIFY_SOCKET": address}).status("line one\nREADY=1")

    assert await receive(sock) == b"STATUS=line one READY=1"


def test_disabled_without_notify_socket() -> None:
    notifier = SystemdNotifier({"WATCHDOG_USEC": "30000000"})

    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    notifier.ready()
    notifier.status("ignored")
    notifier.watchdog()
    notifier.stopping()


def test_non_unix_notify_socket_is_disabled(caplog: pytest.LogCaptureFixture) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": "vsock:2:1234"})

    assert not notifier.enabled
    assert "not an AF_UNIX address" in caplog.text


def test_unreachable_socket_warns_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "absent.sock")})

    with caplog.at_level(logging.WARNING, logger="gateway.sdnotify"):
        notifier.ready()
        notifier.watchdog()
        notifier.stopping()

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot notify systemd" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "20000"}, 0.01),
        ({}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"}, None),
    ],
)
def test_watchdog_interval(
    listener: tuple[socket.socket, str], environ: dict[str, str], expected: float | None
) -> None:
    _, address = listener
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address, **environ})

    assert notifier.watchdog_interval == (None if expected is None else pytest.approx(expected))


def test_watchdog_pid_is_compared_with_the_given_pid(listener: tuple[socket.socket, str]) -> None:
    _, address = listener
    environ = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "4242"}

    assert SystemdNotifier(environ, pid=4242).watchdog_interval == pytest.approx(2.0)
    assert SystemdNotifier(environ, pid=4343).watchdog_interval is None


async def test_run_watchdog_returns_at_once_without_a_watchdog(
    listener: tuple[socket.socket, str],
) -> None:
    _, address = listener
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address})

    async with asyncio.timeout(RECV_TIMEOUT):
        await notifier.run_watchdog(lambda: True)


class HealthProbe:
    """A health check the test flips, counting the checks made while unhealthy."""

    def __init__(self) -> None:
        self.healthy = True
        self.unhealthy_checks = 0
        self.checked_unhealthy = asyncio.Event()

    def __call__(self) -> bool:
        if not self.healthy:
            self.unhealthy_checks += 1
            if self.unhealthy_checks >= 3:
                self.checked_unhealthy.set()
        return self.healthy


async def test_run_watchdog_pings_while_healthy_and_stops_when_not(
    listener: tuple[socket.socket, str],
) -> None:
    sock, address = listener
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "20000"})
    probe = HealthProbe()

    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(notifier.run_watchdog(probe))

        assert [await receive(sock) for _ in range(3)] == [b"WATCHDOG=1"] * 3

        probe.healthy = False
        # Pings sent before the flip are already queued; none may follow it.
        assert set(drain(sock)) <= {b"WATCHDOG=1"}
        async with asyncio.timeout(RECV_TIMEOUT):
            await probe.checked_unhealthy.wait()
        assert drain(sock) == []

        probe.healthy = True
        assert await receive(sock) == b"WATCHDOG=1"

        task.cancel()

    assert task.cancelled()


async def test_run_watchdog_treats_a_failing_check_as_unhealthy(
    listener: tuple[socket.socket, str], caplog: pytest.LogCaptureFixture
) -> None:
    sock, address = listener
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "20000"})
    checked = asyncio.Event()

    def broken() -> bool:
        checked.set()
        raise RuntimeError("probe exploded")

    task = asyncio.create_task(notifier.run_watchdog(broken))
    try:
        async with asyncio.timeout(RECV_TIMEOUT):
            await checked.wait()
        assert drain(sock) == []
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert "health check failed" in caplog.text
