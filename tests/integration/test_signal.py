"""Signal through the fake signal-cli daemon (tests/fakes/signal_cli.py), its real HTTP
interface: the adapter alone on a single-account daemon (direct chats, groups, files both
ways, quotes, edits, reactions, receipts, typing, the working reaction, a voice reply, a
dropped event stream resumed, a rate-limited chat beside another, a stranger's file never
fetched), and the whole daemon answering a direct chat and a group."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.signal.adapter import SignalAdapter
from adapters.signal.config import SignalConfig
from gateway.contracts.adapter import AdapterState
from gateway.contracts.errors import RateLimited
from gateway.contracts.ids import AccountId, ChatId, PlatformMessageId
from gateway.contracts.messages import Attachment, InboundMessage, OutboundMessage
from tests.contract.harness import SignalHarness, started
from tests.contract.test_adapters import daemon
from tests.fakes.llm import FakeLLM
from tests.fakes.signal_cli import FakeSignalCli
from tests.fakes.sink import ListSink, receiving, until_or_ended

pytestmark = pytest.mark.timeout(90)
WAIT = 30.0
ANN = "+15551230001"
BOB = "+15551230002"
EVE = "+15551230666"
GROUP = "Pmpi+EfPWmsxiomLe9Nx2XF9HOE483p6iKiFj65iMwI="


class ScreeningSink(ListSink):
    """A sink that allows Ann and Bob only (asked before any file is fetched)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def may_fetch(self, message: InboundMessage) -> bool:
        self.asked.append(str(message.sender.id))
        return message.sender.id in (ANN, BOB)


def adapter_of(signal: FakeSignalCli, tmp_path: Path, **changes: object) -> SignalAdapter:
    section = {"number": signal.number, "url": signal.url, "allowed_users": [ANN, BOB]}
    config = SignalConfig.model_validate({**section, **changes})
    return SignalAdapter(config, tmp_path / "files")


def outbound(chat: str, text: str, **extra: object) -> OutboundMessage:
    return OutboundMessage(
        platform=SignalAdapter.platform,
        account=AccountId("default"),
        chat_id=ChatId(chat),
        text=text,
        idempotency_key=f"test:{chat}:{text}",
        **extra,  # type: ignore[arg-type]
    )


async def test_direct_and_group_messages_quotes_edits_reactions_and_receipts(
    tmp_path: Path,
) -> None:
    sink = ScreeningSink()
    async with FakeSignalCli() as signal, adapter_of(signal, tmp_path) as adapter:
        async with receiving(adapter, sink):
            first = signal.say(ANN, "hello")
            signal.say(BOB, "chatter among ourselves", group=GROUP)
            signal.say(BOB, "what is on today?", group=GROUP, mention_me=True)
            signal.say(ANN, "about that", quote=(signal.number, 1764392400000))
            signal.push(signal.edit(ANN, first, "hello again"))
            signal.push(signal.reaction(ANN, "👍", (signal.number, 1764392400000)))
            await sink.until(lambda: len(sink.messages) == 4)
            await sink.until(lambda: len(sink.reactions) == 1)
            await signal.wait_for(lambda: signal.read(ANN, first), WAIT)
        dm, group, quoted, edit = sink.messages
        assert (dm.chat_id, dm.text, dm.is_direct) == (ANN, "hello", True)
        assert dm.platform_message_id == f"{ANN}:{ANN}:{first}"
        assert (group.chat_id, group.is_direct, group.mentions_bot) == (GROUP, False, True)
        assert group.text == f"@{signal.number} what is on today?"
        assert quoted.reply_to == f"{ANN}:{signal.number}:1764392400000"
        assert edit.edit_of == dm.platform_message_id
        assert edit.text == "hello again"
        [reaction] = sink.reactions
        assert (reaction.emoji, reaction.message) == ("👍", f"{ANN}:{signal.number}:1764392400000")
        # A read receipt for each message once stored (not for the edit: its message has one).
        receipts = signal.called("sendReceipt")
        assert [r["type"] for r in receipts] == ["read"] * 3
        assert signal.pending == 0


async def test_files_both_ways_and_a_strangers_file_is_never_fetched(tmp_path: Path) -> None:
    sink = ScreeningSink()
    content = b"%PDF-1.4 " + bytes(range(256))
    async with FakeSignalCli() as signal, adapter_of(signal, tmp_path) as adapter:
        async with receiving(adapter, sink):
            signal.say(EVE, "open this", files=[(content, "application/pdf", "x.pdf")])
            signal.say(ANN, "the report", files=[(content, "application/pdf", "r.pdf")])
            await sink.until(lambda: len(sink.messages) == 2)
        stranger, ann = sink.messages
        assert stranger.attachments == ()
        assert "not downloaded: the sender is not allowed" in stranger.text
        assert len(signal.downloads) == 1
        [kept] = ann.attachments
        assert (kept.filename, kept.mime_type) == ("r.pdf", "application/pdf")
        assert kept.path.read_bytes() == content

        picture = tmp_path / "chart.png"
        picture.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
        files = (Attachment(picture, "image/png", 72, "chart.png"),)
        await adapter.send(outbound(ANN, "**the chart**", attachments=files))
        voice = tmp_path / "answer.ogg"
        voice.write_bytes(b"OggS" + b"\0" * 60)
        spoken = (Attachment(voice, "audio/ogg", 64, "answer.ogg", voice=True),)
        await adapter.send(outbound(GROUP, "the answer, spoken", attachments=spoken))
    chart, answer = signal.sent
    assert (chart.chat, chart.text, chart.styles) == (ANN, "the chart", ("0:9:BOLD",))
    assert [(f.filename, f.mime_type, f.data) for f in chart.files] == [
        ("chart.png", "image/png", picture.read_bytes())
    ]
    # A voice reply is one request: the audio with its text as the body.
    assert (answer.chat, answer.text) == (GROUP, "the answer, spoken")
    assert [f.mime_type for f in answer.files] == ["audio/ogg"]


async def test_a_dropped_stream_is_resumed_with_nothing_lost_or_twice(tmp_path: Path) -> None:
    sink = ListSink()
    async with FakeSignalCli() as signal, adapter_of(signal, tmp_path) as adapter:
        async with receiving(adapter, sink) as task:
            await until_or_ended(signal, task, lambda: signal.open_streams == 1)
            signal.say(ANN, "one")
            await sink.until(lambda: len(sink.messages) == 1)
            signal.drop_streams()
            # Sent while the stream is down: kept on Signal's servers, read after.
            signal.deliver_twice()  # the next message written to a stream goes twice
            signal.say(ANN, "two")
            signal.say(BOB, "three")
            await sink.until(lambda: len(sink.messages) >= 3)
            await until_or_ended(signal, task, lambda: len(signal.written) == 4)
            await signal.wait_for(lambda: len(sink.accepting) == 4, WAIT)
            assert adapter.liveness() is AdapterState.RECEIVING
        assert signal.pending == 0
        assert signal.streams_opened >= 2
        # The stream wrote "two" twice; the inbox's key (author, timestamp) is the same.
        texts = [m.text for m in sink.accepting]
        assert texts == ["one", "two", "two", "three"]
        keys = {m.platform_message_id for m in sink.accepting}
        assert len(keys) == 3


async def test_a_rate_limited_chat_beside_another_and_the_turn_feedback(tmp_path: Path) -> None:
    async with FakeSignalCli() as signal, adapter_of(signal, tmp_path) as adapter:
        signal.rate_limit(ANN, 120)
        with pytest.raises(RateLimited) as caught:
            await adapter.send(outbound(ANN, "too soon"))
        assert caught.value.retry_after == 120
        receipt = await adapter.send(
            outbound(BOB, "not held", reply_to=PlatformMessageId(f"{BOB}:{BOB}:42"))
        )
        assert signal.texts_to(BOB) == ["not held"]
        assert signal.sent[-1].quote == (BOB, 42)
        assert receipt.platform_message_id == f"{BOB}:{signal.number}:{signal.sent[-1].timestamp}"
        await adapter.typing(ChatId(GROUP), None)
        message = PlatformMessageId(f"{ANN}:{ANN}:77")
        await adapter.working(ChatId(ANN), message)
        await adapter.done(ChatId(ANN), message)
    assert signal.called("sendTyping") == [{"groupId": GROUP}]
    put, taken = signal.called("sendReaction")
    assert put == {"recipient": [ANN], "emoji": "👀", "targetAuthor": ANN, "targetTimestamp": 77}
    assert taken == {**put, "remove": True}


async def test_the_daemon_answers_a_direct_chat_and_a_group_mention(tmp_path: Path) -> None:
    async with started("signal") as harness, FakeLLM() as llm:
        assert isinstance(harness, SignalHarness)
        signal = harness.signal
        async with daemon(tmp_path, harness, llm) as h:
            signal.say(ANN, "hi there")
            signal.say(BOB, "not for the bot", group=GROUP)
            signal.say(BOB, "what time is it?", group=GROUP, mention_me=True)
            assert await harness.wait_texts(ANN, 1) == ["You said: hi there"]
            await signal.wait_for(lambda: len(signal.texts_to(GROUP)) == 1, WAIT)
            assert signal.texts_to(GROUP)[0].endswith("what time is it?")
            rows = await h.answered(2)
            assert [r["outcome"] for r in rows] == ["answered", "answered"]
            # The working reaction went on the message being answered, and came off again.
            await signal.wait_for(lambda: len(signal.called("sendReaction")) >= 4, WAIT)
            reactions = signal.called("sendReaction")
            assert {r["emoji"] for r in reactions} == {"👀"}
            assert sum(1 for r in reactions if r.get("remove")) == 2
            assert h.adapter_state() is AdapterState.RECEIVING
