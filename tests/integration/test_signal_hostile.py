"""Signal under attack and misuse, through the fake signal-cli daemon: a stranger's huge
message on the event stream, a daemon that serves other accounts besides Herald's, a file
the daemon answers larger than it was announced."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.signal.adapter import SignalAdapter
from gateway.contracts.adapter import AdapterState
from gateway.contracts.errors import AuthError, NotReady
from gateway.contracts.messages import InboundMessage
from tests.fakes.signal_cli import FakeSignalCli
from tests.fakes.sink import ListSink, receiving, until_or_ended
from tests.integration.test_signal import adapter_of as signal_adapter
from tests.integration.test_signal import outbound

pytestmark = pytest.mark.timeout(60)
WAIT = 30.0
ANN = "+15551230001"
EVE = "+15551230666"
OTHER = "+15550008888"


def adapter_of(signal: FakeSignalCli, tmp_path: Path, **changes: object) -> SignalAdapter:
    """The adapter of tests/integration/test_signal.py, with Ann the only one allowed."""
    return signal_adapter(signal, tmp_path, **{"allowed_users": [ANN], **changes})


async def test_a_strangers_huge_message_is_skipped_and_the_stream_goes_on(
    tmp_path: Path,
) -> None:
    # signal-cli writes each event as one `data:` line. A line past aiohttp's line limit
    # must not end the stream (and what is read behind it) or the adapter.
    sink = ListSink()
    async with FakeSignalCli() as signal, adapter_of(signal, tmp_path) as adapter:
        async with receiving(adapter, sink) as task:
            await until_or_ended(signal, task, lambda: signal.open_streams == 1)
            # 100,000 control characters: 600 KB of `\u0001` escapes in the event's JSON,
            # past aiohttp's 512 KiB line limit, from a message Signal carries.
            signal.say(EVE, "\x01" * 100_000)
            signal.say(EVE, "y" * 5_000_000)  # past any event Signal carries: skipped
            signal.say(ANN, "still there?")
            await until_or_ended(signal, task, lambda: len(signal.written) == 3)
            await sink.until(lambda: any(m.text == "still there?" for m in sink.messages))
            assert not task.done()
            assert signal.streams_opened == 1  # the same stream: nothing lost with it
            assert adapter.liveness() is AdapterState.RECEIVING
        assert [len(m.text) for m in sink.messages] == [100_000, len("still there?")]


async def test_a_daemon_with_another_account_is_named_the_account_in_every_request(
    tmp_path: Path,
) -> None:
    # The operator left multi_account false; the daemon (started without -a) also holds
    # another account. Its messages are never Herald's, and Herald's requests still work.
    sink = ListSink()
    async with (
        FakeSignalCli(multi_account=True, others=(OTHER,)) as signal,
        adapter_of(signal, tmp_path) as adapter,
    ):
        async with receiving(adapter, sink) as task:
            await until_or_ended(signal, task, lambda: signal.open_streams == 1)
            theirs = signal.message(EVE, "for the other account")
            signal.push({**theirs, "account": OTHER})
            signal.say(ANN, "for Herald")
            await sink.until(lambda: len(sink.messages) == 1)
            await signal.wait_for(lambda: signal.read(ANN, sink.messages[0].raw["timestamp"]))
            assert not task.done()
        await adapter.send(outbound(ANN, "answer"))
    assert [m.text for m in sink.messages] == ["for Herald"]
    assert signal.texts_to(ANN) == ["answer"]


class AllowAll(ListSink):
    async def may_fetch(self, message: InboundMessage) -> bool:
        return True


async def test_a_file_larger_than_announced_is_not_read_whole(tmp_path: Path) -> None:
    # The envelope's `size` is what the sender's client claimed; what the daemon answers
    # to getAttachment is the real file. Past attachment_max_bytes it is not kept.
    sink = AllowAll()
    async with (
        FakeSignalCli() as signal,
        adapter_of(signal, tmp_path, attachment_max_bytes=1000) as adapter,
    ):
        event = signal.message(ANN, "a small file", files=[(b"x" * 50_000, "text/plain", "a.txt")])
        event["envelope"]["dataMessage"]["attachments"][0]["size"] = 10
        async with receiving(adapter, sink):
            signal.push(event)
            await sink.until(lambda: len(sink.messages) == 1)
        assert sink.messages[0].attachments == ()
        assert "a.txt" in sink.messages[0].text
        assert not list((tmp_path / "files").rglob("*.txt"))


async def test_a_file_the_daemon_never_finishes_is_given_up_at_the_cap(tmp_path: Path) -> None:
    # Whatever the envelope claimed, reading stops once past attachment_max_bytes: memory
    # holds no more than that, and the message goes on without the file.
    sink = AllowAll()
    async with (
        FakeSignalCli() as signal,
        adapter_of(signal, tmp_path, attachment_max_bytes=100_000) as adapter,
    ):
        event = signal.message(ANN, "look", files=[(b"x", "image/png", "a.png")])
        attachment = event["envelope"]["dataMessage"]["attachments"][0]
        attachment["id"] = signal.add_endless_file()
        async with receiving(adapter, sink):
            signal.push(event)
            await sink.until(lambda: len(sink.messages) == 1)
        assert sink.messages[0].attachments == ()
        assert "a.png unavailable" in sink.messages[0].text
        assert "100000 bytes" in sink.messages[0].text


async def test_a_password_in_the_daemons_url_is_not_echoed_by_the_check(tmp_path: Path) -> None:
    # A careless operator writes a proxy's basic-auth password into `url`; the check's
    # answer (printed by `herald doctor` and logged at start) names the host alone.
    async with FakeSignalCli() as signal:
        url = signal.url.replace("http://", "http://herald:hunter2secret@")
        adapter = adapter_of(signal, tmp_path, url=url)
        said = await adapter.check()
        host = f"127.0.0.1:{signal.port}"
    assert "hunter2secret" not in said
    assert host in said


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (-5, "Rate limit exceeded: 60"),
        (-3, "Unable to check if users are registered: timeout (SocketTimeoutException)"),
    ],
)
async def test_a_lookup_that_fails_for_now_is_retried_not_taken_for_refused_credentials(
    tmp_path: Path, code: int, message: str
) -> None:
    # getUserStatus asks Signal's servers (contact discovery, strictly rate-limited). Its
    # failing now is NotReady (the supervisor retries), not AuthError (stopped for good).
    async with FakeSignalCli() as signal:
        signal.fail_lookups(code, message)
        with pytest.raises(NotReady) as caught:
            async with adapter_of(signal, tmp_path):
                pass
        assert not isinstance(caught.value, AuthError)
        async with adapter_of(signal, tmp_path) as adapter:  # the next try gets through
            assert adapter.liveness() is AdapterState.RECONNECTING
