"""The adapter contract, on every platform through its fake (see tests/contract/harness.py).

Every adapter: acknowledges a message to its platform only after the inbox committed it; a
message the platform delivers twice is answered once; credentials the platform refuses are an
`AuthError`; the platform's 429 is `RateLimited` carrying its `retry_after`, and through the
daemon a chat that met it (on any request) waits while another chat's answer goes; a
stranger's file is never downloaded; a send the platform refuses for good is a
`PermanentSendError`; a streamed answer is one message edited until it reads
whole; a failing platform server (5xx) is `NotReady` within a
bound; a long answer reaches the person in chunks each within the adapter's
`SendLimits.max_chunk`. A case a platform cannot express is skipped with the reason its
harness gives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.contracts.adapter import Adapter, AdapterState
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.messages import utcnow
from gateway.store.outbox import Outbox, OutboxStatus
from tests.contract.harness import HARNESSES, WAIT, PlatformHarness, started
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.sink import ListSink, receiving, run_until_error
from tests.fakes.telegram import utf16_len
from tests.integration.inproc import Herald, running_daemon

pytestmark = pytest.mark.timeout(60)

RETRY_AFTER = 3
"""Seconds a rate-limited platform asks for (whole: Slack sends whole seconds)."""
HOLD = 1.0
"""Seconds the inbox holds a message while the test watches that no acknowledgement comes (a
correct adapter passes however long; the hold gives a wrong one time to show itself)."""


def cases(case: str) -> list[pytest.ParameterSet]:
    """Every platform's name as a parameter, skipped where its harness cannot express `case`."""
    return [
        pytest.param(
            name,
            id=name,
            marks=[pytest.mark.skip(reason=f"{name}: {harness.cannot[case]}")]
            if case in harness.cannot
            else [],
        )
        for name, harness in sorted(HARNESSES.items())
    ]


async def until_receiving(adapter: Adapter, task: asyncio.Task[None]) -> None:
    """Wait until `adapter` reports RECEIVING; its receive loop's error if it ends first."""
    async with asyncio.timeout(WAIT):
        while adapter.liveness() is not AdapterState.RECEIVING:
            if task.done():
                await task
                raise AssertionError("the receive loop ended without an error")
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def daemon(
    tmp_path: Path,
    platform: PlatformHarness,
    llm: FakeLLM,
    extra: dict[str, Any] | None = None,
    **changes: Any,
) -> AsyncIterator[Herald]:
    """The daemon in-process, talking to `platform`'s fake (its section with `changes`) and
    answering by `llm`; `extra`: other top-level sections."""
    port = free_port()
    section = {**platform.section(port), **changes}
    async with running_daemon(
        tmp_path, llm, platform.platform, section, port=port, extra=extra
    ) as herald:
        yield herald


HOLDING = {"delivery": {"backoff_initial": 0.2, "backoff_max": 1, "flush_timeout": 0.1}}
"""For a test that ends with a chunk held by the platform: the stop does not wait for it."""


@pytest.mark.parametrize("name", cases("acknowledged_after_commit"))
async def test_a_message_is_acknowledged_only_after_the_inbox_committed(
    name: str, tmp_path: Path
) -> None:
    sink = ListSink()
    sink.gate.clear()  # the inbox holds the message: it is not committed yet
    async with started(name) as platform:
        person = platform.people[0]
        adapter = platform.adapter(tmp_path / "files")
        async with adapter, receiving(adapter, sink) as task:
            await until_receiving(adapter, task)
            ref = await platform.inject(adapter, sink, person, "hold this")
            await sink.until(lambda: len(sink.accepting) >= 1)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HOLD):
                    while not await platform.acknowledged(ref):
                        await asyncio.sleep(0.05)
            assert not await platform.acknowledged(ref), "acknowledged before the commit"
            assert sink.messages == []
            sink.gate.set()  # committed: now, and only now, the platform may hear of it
            await platform.wait_acknowledged(ref)
            assert [m.text for m in sink.messages][:1] == ["hold this"]
    [accepted, *_] = sink.messages
    assert accepted.chat_id == platform.chat_of(person)
    assert accepted.platform == adapter.platform


@pytest.mark.parametrize("name", cases("duplicate"))
async def test_a_duplicate_delivery_is_answered_once(name: str, tmp_path: Path) -> None:
    async with started(name) as platform, FakeLLM() as llm, daemon(tmp_path, platform, llm) as h:
        ann = platform.people[0]
        await platform.send(h, ann, "only once")
        assert await platform.wait_texts(ann, 1) == ["You said: only once"]
        await platform.duplicate(h, ann)
        # The next message comes after the duplicate: once it is answered, the duplicate was
        # delivered and, had it been taken for a new message, answered before it.
        await platform.send(h, ann, "and then this")
        assert await platform.wait_texts(ann, 2) == [
            "You said: only once",
            "You said: and then this",
        ]
        rows = await h.answered(2)
        assert [r["text"] for r in rows] == ["only once", "and then this"]
        assert [r["outcome"] for r in rows] == ["answered", "answered"]
        assert len(llm.requests) == 2
        assert len(platform.texts_to(ann)) == 2


@pytest.mark.parametrize("name", cases("auth"))
async def test_a_refused_token_is_an_auth_error(name: str, tmp_path: Path) -> None:
    async with started(name) as platform:
        adapter = platform.adapter(tmp_path / "files", bad_token=True)
        with pytest.raises(AuthError):
            async with adapter:  # refused on enter, or else by the receive loop
                await run_until_error(adapter, ListSink())
        assert adapter.liveness() is not AdapterState.RECEIVING


@pytest.mark.parametrize("name", cases("rate_limit"))
async def test_a_429_is_rate_limited_with_its_retry_after(name: str, tmp_path: Path) -> None:
    async with started(name) as platform:
        ann, bob = platform.people
        async with platform.adapter(tmp_path / "files") as adapter:
            platform.rate_limit(ann, RETRY_AFTER)
            with pytest.raises(RateLimited) as caught:
                await adapter.send(platform.outbound(adapter, ann, "too soon"))
            assert caught.value.retry_after == RETRY_AFTER
            await adapter.send(platform.outbound(adapter, bob, "another chat is not limited"))
            await adapter.send(platform.outbound(adapter, ann, "later it goes"))
            await platform.wait_texts(ann, 1)
        assert platform.texts_to(ann) == ["later it goes"]
        assert platform.texts_to(bob) == ["another chat is not limited"]


HELD = 600
"""Seconds a rate-limited chat is told to wait in the test below: far longer than the test, so
the other chat's answer can only have come while that chat was held."""


@pytest.mark.parametrize("name", cases("rate_limit"))
async def test_a_rate_limited_chat_does_not_hold_up_another(name: str, tmp_path: Path) -> None:
    """Through the whole daemon: Ann's chat gets the platform's 429 (on whichever request of
    her turn meets it first: typing, a preview or the answer), Bob's answer goes out while
    hers waits out the platform's time, and hers is kept for then, not dropped."""
    async with (
        started(name) as platform,
        FakeLLM() as llm,
        daemon(tmp_path, platform, llm, extra=HOLDING) as h,
    ):
        ann, bob = platform.people
        platform.rate_limit(ann, HELD)
        await platform.send(h, ann, "first")
        await h.answered(1)
        await platform.send(h, bob, "second")
        assert await platform.wait_texts(bob, 1) == ["You said: second"]
        assert platform.texts_to(ann) == []
        waiting = [
            r
            for r in await Outbox(h.store).list()
            if r.target.chat_id == platform.chat_of(ann) and r.status is not OutboxStatus.SENT
        ]
        assert [r.text for r in waiting] == ["You said: first"]
        assert waiting[0].next_attempt_at > utcnow() + timedelta(seconds=HELD / 2)


@pytest.mark.parametrize("name", cases("blocked"))
async def test_a_send_the_platform_refuses_for_good_is_a_permanent_error(
    name: str, tmp_path: Path
) -> None:
    """A chat the platform will never deliver to (blocked, gone, opted out, 550) is
    `PermanentSendError`, not retried; another person's chat is not affected."""
    async with started(name) as platform:
        ann, bob = platform.people
        async with platform.adapter(tmp_path / "files") as adapter:
            platform.block(ann)
            with pytest.raises(PermanentSendError):
                async with asyncio.timeout(WAIT):
                    await adapter.send(platform.outbound(adapter, ann, "never delivered"))
            await adapter.send(platform.outbound(adapter, bob, "still delivered"))
            await platform.wait_texts(bob, 1)
        assert platform.texts_to(ann) == []
        assert platform.texts_to(bob) == ["still delivered"]


@pytest.mark.parametrize("name", cases("stream_edits"))
async def test_an_answer_streams_by_editing_one_message(name: str, tmp_path: Path) -> None:
    """With `stream_edits`, the answer appears in one message edited as the model writes,
    and ends as the whole answer: never a second message with the same text."""
    words = " ".join(f"word{i}" for i in range(40))
    async with started(name) as platform, FakeLLM() as llm:
        llm.responder = lambda body: Reply(text=words, chunk_delay=0.02)
        async with daemon(tmp_path, platform, llm, **platform.streaming) as h:
            ann = platform.people[0]
            await platform.send(h, ann, "stream please")
            await platform.fake.wait_for(lambda: platform.shown_to(ann) == [words], WAIT)
            await h.answered(1)
            assert platform.edits() > 0, "the preview was never edited"
            assert platform.shown_to(ann) == [words]


@pytest.mark.parametrize("name", cases("stranger_files"))
async def test_a_strangers_files_are_never_downloaded(name: str, tmp_path: Path) -> None:
    """A file from someone not allowed is refused with its message, never fetched from the
    platform nor written to disk; an allowed person's file is fetched once."""
    content = b"%PDF-1.4 " + bytes(range(256)) * 8
    async with started(name) as platform, FakeLLM() as llm, daemon(tmp_path, platform, llm) as h:
        for _ in range(3):
            await platform.send_file(h, platform.stranger, content)
        rows = await h.answered(3)
        assert [r["outcome"] for r in rows] == ["rejected"] * 3
        assert all("not downloaded: the sender is not allowed" in r["text"] for r in rows), rows
        assert platform.downloads() == 0
        assert not (tmp_path / "state" / "files").exists()
        ann = platform.people[0]
        await platform.send_file(h, ann, content)
        await platform.wait_texts(ann, 1)
        assert platform.downloads() == 1
        assert list((await h.kept_files()).values()) == [content]


@pytest.mark.parametrize("name", cases("server_error"))
async def test_a_failing_platform_server_is_not_ready_within_a_bound(
    name: str, tmp_path: Path
) -> None:
    """A 5xx (or the mail server's 451) is `NotReady`: the outbox retries it later. Raised
    within WAIT: an SDK's own retries may take a while, but never hang the chat."""
    async with started(name) as platform:
        ann = platform.people[0]
        async with platform.adapter(tmp_path / "files") as adapter:
            platform.server_error(count=10)
            with pytest.raises(NotReady):
                async with asyncio.timeout(WAIT):
                    await adapter.send(platform.outbound(adapter, ann, "server down"))
            assert platform.texts_to(ann) == []


@pytest.mark.parametrize("name", cases("chunks"))
async def test_every_chunk_is_within_the_platform_limit(name: str, tmp_path: Path) -> None:
    words = [f"word{i}" for i in range(2500)]  # about 20,000 characters
    async with started(name) as platform, FakeLLM() as llm:
        limits = platform.adapter(tmp_path / "files").limits
        llm.responder = lambda body: Reply(text=" ".join(words))
        async with daemon(tmp_path, platform, llm) as h:
            ann = platform.people[0]
            await platform.send(h, ann, "tell me everything")
            await platform.fake.wait_for(
                lambda: any(words[-1] in t for t in platform.texts_to(ann)), WAIT
            )
            [row] = await h.answered(1)
            assert row["outcome"] == "answered"
    texts = platform.texts_to(ann)
    measure = utf16_len if limits.count_utf16 else len
    assert max(measure(t) for t in texts) <= limits.max_chunk, [measure(t) for t in texts]
    assert len(texts) >= -(-len(" ".join(words)) // limits.max_chunk)  # none dropped or merged
    assert [w for t in texts for w in t.split() if w.startswith("word")] == words
