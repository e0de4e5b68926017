"""The real SlackAdapter (slack-sdk and slack-bolt unmodified) against the fake Slack.

Adapter level: no daemon, no store. What the daemon makes of it is in `test_slack.py`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from adapters.slack import PLATFORM as SLACK
from adapters.slack.adapter import SlackAdapter
from adapters.slack.config import SlackConfig, SlackMode
from gateway.contracts.adapter import (
    Adapter,
    AdapterState,
    MessageEditor,
    SelfCheck,
    TypingIndicator,
    WebhookAdapter,
    WorkingIndicator,
)
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId, ChatId, PlatformMessageId, ThreadId
from gateway.contracts.messages import (
    Attachment,
    OutboundMessage,
    SendLimits,
    TextFormat,
)
from tests.fakes.sink import ListSink, receiving, refusing_socket, run_until_error, until_or_ended
from tests.fakes.slack import (
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    DEFAULT_SIGNING_SECRET,
    FakeSlackServer,
)

WAIT = 10.0
"""Upper bound of every wait for a condition."""
ANN = "U0ANN"
BOB = "U0BOB"
DM = "D0ANN"
"""Ann's DM with the bot."""
GENERAL = "C0GENERAL"
BOT_USER = "UBOT"


def slack_config(slack: FakeSlackServer, **changes: Any) -> SlackConfig:
    settings: dict[str, Any] = {
        "bot_token": SecretStr(DEFAULT_BOT_TOKEN),
        "app_token": SecretStr(DEFAULT_APP_TOKEN),
        "base_url": slack.base_url,
        "min_send_interval": 0,
        "min_edit_interval": 0.2,
        "ping_interval": 5,
    }
    settings.update(changes)
    return SlackConfig(**settings)


def events_config(slack: FakeSlackServer, **changes: Any) -> SlackConfig:
    return slack_config(
        slack,
        mode=SlackMode.EVENTS,
        app_token=None,
        signing_secret=SecretStr(DEFAULT_SIGNING_SECRET),
        **changes,
    )


def outbound(chat_id: str = DM, text: str = "Hello **there**", **changes: Any) -> OutboundMessage:
    fields: dict[str, Any] = {
        "platform": SLACK,
        "account": AccountId("default"),
        "chat_id": ChatId(chat_id),
        "text": text,
        "idempotency_key": "s1:t1:0",
    }
    fields.update(changes)
    return OutboundMessage(**fields)


def key(channel: str, ts: str) -> PlatformMessageId:
    return PlatformMessageId(f"{channel}:{ts}")


def calls(slack: FakeSlackServer, method: str) -> list[dict[str, Any]]:
    """The decoded parameters of every `method` request the fake received, in order."""
    return [c.params for c in slack.calls if c.method == method]


def rejected(slack: FakeSlackServer) -> list[tuple[str, str]]:
    return [(r.method, r.error) for r in slack.rejected]


def dm_event(text: str = "hi", *, ts: str | None = None) -> dict[str, Any]:
    """A DM from Ann as Slack posts it in an event_callback."""
    return {
        "type": "message",
        "channel": DM,
        "channel_type": "im",
        "user": ANN,
        "text": text,
        "ts": ts or f"{time.time():.6f}",
    }


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    # Envelopes are not sent again while a test holds one, unless it asks for that.
    async with FakeSlackServer(ack_timeout=WAIT * 3) as server:
        yield server


@pytest.fixture
async def adapter(slack: FakeSlackServer, tmp_path: Path) -> AsyncIterator[SlackAdapter]:
    async with SlackAdapter(slack_config(slack), tmp_path / "files") as connected:
        yield connected


# -- shape ------------------------------------------------------------------------------------


async def test_adapter_shape(slack: FakeSlackServer, tmp_path: Path) -> None:
    config = slack_config(slack, account="work", min_send_interval=0.5, min_edit_interval=2)
    adapter = SlackAdapter(config, tmp_path)
    for protocol in (Adapter, MessageEditor, WorkingIndicator, WebhookAdapter, SelfCheck):
        assert isinstance(adapter, protocol), protocol.__name__
    assert not isinstance(adapter, TypingIndicator)  # Slack bots have no typing indicator
    assert adapter.platform is SLACK
    assert adapter.account == AccountId("work")
    assert adapter.limits == SendLimits(
        max_chunk=3900,
        count_utf16=False,
        min_edit_interval=2.0,
        min_send_interval=0.5,
        max_file_bytes=1024 * 1024 * 1024,
        voice=True,
        voice_caption=3900,
    )
    with pytest.raises(NotReady, match="not connected"):  # before entering
        await adapter.send(outbound())
    with pytest.raises(NotReady, match="not connected"):
        await adapter.run(ListSink())
    assert slack.calls == []


# -- entering ---------------------------------------------------------------------------------


async def test_a_wrong_bot_token_is_an_auth_error_on_enter(
    slack: FakeSlackServer, tmp_path: Path
) -> None:
    wrong = "xoxb-1-not-the-bot-token"
    adapter = SlackAdapter(slack_config(slack, bot_token=SecretStr(wrong)), tmp_path)
    with pytest.raises(AuthError, match=r"auth\.test: invalid_auth") as caught:
        async with adapter:
            pass
    assert wrong not in str(caught.value)
    assert adapter.liveness() is AdapterState.STARTING
    assert [c.method for c in slack.calls] == ["auth.test"]  # no socket asked for
    assert slack.sockets_opened == 0


@pytest.mark.parametrize(
    ("app_token", "error"),
    [
        pytest.param("xapp-1-A1-not-the-app-token", "invalid_auth", id="wrong"),
        pytest.param(DEFAULT_BOT_TOKEN, "not_allowed_token_type", id="bot-token-as-app-token"),
    ],
)
async def test_a_wrong_app_token_is_an_auth_error_on_enter(
    slack: FakeSlackServer, tmp_path: Path, app_token: str, error: str
) -> None:
    adapter = SlackAdapter(slack_config(slack, app_token=SecretStr(app_token)), tmp_path)
    with pytest.raises(AuthError, match=rf"apps\.connections\.open: {error}") as caught:
        async with adapter:
            pass
    assert app_token not in str(caught.value)
    assert [c.method for c in slack.calls] == ["auth.test", "apps.connections.open"]
    assert slack.sockets_opened == 0


async def test_an_unreachable_slack_is_not_ready_on_enter(tmp_path: Path) -> None:
    with refusing_socket() as url:
        config = SlackConfig(
            bot_token=SecretStr(DEFAULT_BOT_TOKEN),
            app_token=SecretStr(DEFAULT_APP_TOKEN),
            base_url=f"{url}/api/",
        )
        with pytest.raises(NotReady, match=r"auth\.test"):
            async with SlackAdapter(config, tmp_path):
                pass


async def test_slack_failing_on_enter_is_not_ready(slack: FakeSlackServer, tmp_path: Path) -> None:
    slack.refuse_connections(1, stage="open")  # apps.connections.open: internal_error
    with pytest.raises(NotReady, match="internal_error"):
        async with SlackAdapter(slack_config(slack), tmp_path):
            pass
    async with SlackAdapter(slack_config(slack), tmp_path):  # and the next attempt works
        pass


async def test_liveness_from_start_to_stop(slack: FakeSlackServer, tmp_path: Path) -> None:
    adapter = SlackAdapter(slack_config(slack), tmp_path)
    assert adapter.liveness() is AdapterState.STARTING
    async with adapter:
        assert adapter.liveness() is AdapterState.RECONNECTING  # no socket yet
        async with receiving(adapter, ListSink()) as task:
            # Acknowledged: the adapter read the socket's `hello` (sent first) by then.
            asked = slack.inject_message(DM, "are you there?", user=ANN)
            await until_or_ended(slack, task, lambda: asked.event_id in slack.acked)
            assert adapter.liveness() is AdapterState.RECEIVING
            assert slack.open_sockets == 1
    assert adapter.liveness() is AdapterState.STOPPED
    await slack.wait_for(lambda: slack.open_sockets == 0, WAIT)
    assert [s.close_reason for s in slack.sockets] == ["client_close"]


# -- receiving over Socket Mode ---------------------------------------------------------------


async def test_an_envelope_is_acknowledged_only_after_accept_returned(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    first = slack.inject_message(DM, "one", user=ANN)
    second = slack.inject_message(DM, "two", user=ANN)
    sink = ListSink()
    sink.gate.clear()
    async with receiving(adapter, sink) as task:
        await sink.until(lambda: len(sink.accepting) == 1)
        await slack.wait_for(lambda: len(slack.envelopes) == 2, WAIT)  # both on the socket
        # Held in `accept`: nothing is acknowledged, and the next envelope waits its turn.
        assert slack.acks == []
        assert slack.pending == [first.event_id, second.event_id]
        assert len(sink.accepting) == 1
        sink.gate.set()
        await until_or_ended(slack, task, lambda: not slack.pending)
    assert slack.acked == [first.event_id, second.event_id]
    assert [a.outcome for a in slack.acks] == ["accepted", "accepted"]
    assert sink.texts == ["one", "two"]
    one = sink.messages[0]
    assert one.platform_message_id == key(DM, first.ts)
    assert (one.platform, one.account, one.chat_id) == (SLACK, "default", DM)
    assert (one.sender.id, one.is_direct, one.thread_id) == (ANN, True, None)
    assert [e.retry_attempt for e in slack.envelopes] == [0, 0]


async def test_a_failing_sink_leaves_the_envelope_unacknowledged(tmp_path: Path) -> None:
    async with FakeSlackServer(ack_timeout=0.5) as slack:
        kept = slack.inject_message(DM, "kept", user=ANN)
        refused = slack.inject_message(DM, "refused", user=ANN)
        failing = ListSink(fail_on=lambda message: message.text == "refused")
        config = slack_config(slack)
        async with SlackAdapter(config, tmp_path) as adapter:
            with pytest.raises(NotReady, match="could not be stored"):
                await run_until_error(adapter, failing)
        assert failing.texts == ["kept"]
        assert [m.text for m in failing.accepting] == ["kept", "refused"]
        assert slack.acked == [kept.event_id]
        assert slack.pending == [refused.event_id]
        await slack.wait_for(lambda: slack.open_sockets == 0, WAIT)  # hung up, unacknowledged

        # What the supervisor's runner does next: a new connection, which gets it again.
        sink = ListSink()
        async with SlackAdapter(config, tmp_path) as adapter, receiving(adapter, sink) as task:
            await until_or_ended(slack, task, lambda: not slack.pending)
        assert sink.texts == ["refused"]
        assert slack.acked == [kept.event_id, refused.event_id]
        redelivered = [e for e in slack.envelopes if e.event_id == refused.event_id]
        assert [e.retry_attempt for e in redelivered] == [0, 1]
        assert slack.max_open_sockets == 1


async def test_link_disabled_is_an_auth_error(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    task = asyncio.create_task(run_until_error(adapter, ListSink()))
    await until_or_ended(slack, task, lambda: slack.connected)
    assert slack.send_disconnect("link_disabled") == 1
    with pytest.raises(AuthError, match="Socket Mode is turned off"):
        await task
    assert slack.sockets_opened == 1  # no reconnection attempted


async def test_events_are_handed_over_in_order(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    injected = [
        slack.inject_message(DM, "first", user=ANN),
        slack.inject_message("D0BOB", "second", user=BOB),
        slack.inject_app_mention(GENERAL, "third", user=BOB),
        slack.inject_message(GENERAL, "not addressed", user=ANN),
        slack.inject_bot_message(GENERAL, "another bot"),
        slack.inject_message(DM, "fourth", user=ANN),
        slack.inject_message(DM, "fifth", user=ANN),
    ]
    event_ids = [e for made in injected for e in made.event_ids]
    sink = ListSink()
    async with receiving(adapter, sink) as task:
        await until_or_ended(slack, task, lambda: not slack.pending)
    assert slack.acked == event_ids  # skipped events are acknowledged too, in order
    # The mention comes twice (app_mention and message): one key, so one inbox row.
    assert sink.texts == ["first", "second", "third", "third", "fourth", "fifth"]
    keys = [m.platform_message_id for m in sink.messages]
    mention = injected[2]
    assert keys[2] == keys[3] == key(GENERAL, mention.ts)
    assert keys[:2] + keys[4:] == [
        key(made.channel, made.ts) for made in (injected[0], injected[1], *injected[5:])
    ]
    third = sink.messages[2]
    assert (third.is_direct, third.mentions_bot, third.thread_id) == (False, True, mention.ts)


async def test_events_the_agent_does_not_read_are_acknowledged(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    asked = slack.inject_message(DM, "question", user=ANN)
    skipped = [
        slack.inject_delete(DM, asked.ts),
        slack.inject_own_message(DM, "the bot's own answer"),
        slack.inject_event({"type": "reaction_added", "user": ANN, "reaction": "tada"}),
        slack.inject_event({"type": "message", "channel": DM, "user": ANN, "text": 5, "ts": "x"}),
    ]
    last = slack.inject_message(DM, "last", user=ANN)
    sink = ListSink()
    async with receiving(adapter, sink) as task:
        await until_or_ended(slack, task, lambda: not slack.pending)
    assert slack.acked == [asked.event_id, *(s.event_id for s in skipped), last.event_id]
    assert sink.texts == ["question", "last"]
    assert slack.sockets_opened == 1


def _malformed(**fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "message", "channel": DM, "user": ANN, "text": "junk"}
    event.update(fields)
    return {k: v for k, v in event.items() if v is not None}


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(_malformed(type=None), id="no-type"),
        pytest.param(_malformed(type=5), id="type-not-a-string"),
        pytest.param(_malformed(channel=5), id="channel-not-a-string"),
    ],
)
async def test_a_malformed_event_is_passed_over(
    slack: FakeSlackServer, adapter: SlackAdapter, event: dict[str, Any]
) -> None:
    before = slack.inject_message(DM, "before", user=ANN)
    junk = slack.inject_event({**event, "ts": f"{time.time():.6f}"})
    after = slack.inject_message(DM, "after", user=ANN)
    sink = ListSink()
    async with receiving(adapter, sink) as task:
        await until_or_ended(slack, task, lambda: not slack.pending)
    assert slack.acked == [before.event_id, junk.event_id, after.event_id]
    assert sink.texts == ["before", "after"]


# -- sending ----------------------------------------------------------------------------------


async def test_send_renders_markdown_as_mrkdwn(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    receipt = await adapter.send(outbound(DM, "Hello **there** & <you>"))
    (posted,) = slack.posted
    assert receipt.platform_message_id == key(DM, posted.ts)
    assert posted.text == "Hello *there* &amp; &lt;you&gt;"
    assert (posted.channel, posted.mrkdwn, posted.thread_ts) == (DM, True, None)
    assert calls(slack, "chat.postMessage")[0]["unfurl_links"] in (False, "false", "0", 0)


async def test_plain_format_escapes_only_what_slack_needs(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    await adapter.send(outbound(DM, "a **b** & <c> > d_e", format=TextFormat.PLAIN))
    (posted,) = slack.posted
    assert posted.text == "a **b** &amp; &lt;c&gt; &gt; d_e"
    assert posted.mrkdwn is False
    assert slack.texts_in(DM) == ["a **b** &amp; &lt;c&gt; &gt; d_e"]


async def test_send_in_a_thread(slack: FakeSlackServer, adapter: SlackAdapter) -> None:
    question = slack.inject_app_mention(GENERAL, "question", user=BOB)
    receipt = await adapter.send(outbound(GENERAL, "answer", thread_id=ThreadId(question.ts)))
    (posted,) = slack.posted
    assert (posted.channel, posted.thread_ts) == (GENERAL, question.ts)
    assert receipt.platform_message_id == key(GENERAL, posted.ts)
    assert slack.texts_in(GENERAL, thread_ts=question.ts) == ["answer"]


async def test_an_unknown_channel_is_a_permanent_error(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    slack.remove_channel("C0GONE")
    with pytest.raises(PermanentSendError, match="channel_not_found"):
        await adapter.send(outbound("C0GONE"))
    slack.add_channel("C0OUTSIDE", is_member=False)
    with pytest.raises(PermanentSendError, match="not_in_channel"):
        await adapter.send(outbound("C0OUTSIDE"))
    assert slack.posted == []


async def test_a_revoked_token_is_an_auth_error(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    slack.bot_token = "xoxb-1-rotated"  # the workspace revoked Herald's token meanwhile
    with pytest.raises(AuthError, match=r"chat\.postMessage: invalid_auth") as caught:
        await adapter.send(outbound())
    assert DEFAULT_BOT_TOKEN not in str(caught.value)
    assert slack.posted == []


@pytest.mark.parametrize(
    ("fault", "match"),
    [
        pytest.param(lambda s: s.fail("chat.postMessage", status=500), "HTTP 500", id="500"),
        pytest.param(lambda s: s.fail("chat.postMessage", status=503), "HTTP 503", id="503"),
        pytest.param(lambda s: s.drop("chat.postMessage"), "Disconnected", id="dropped"),
    ],
)
async def test_a_failed_send_is_not_ready(
    slack: FakeSlackServer,
    adapter: SlackAdapter,
    fault: Callable[[FakeSlackServer], None],
    match: str,
) -> None:
    fault(slack)
    with pytest.raises(NotReady, match=match):
        await adapter.send(outbound())
    await adapter.send(outbound())
    assert len(slack.posted) == 1


async def test_nothing_to_send_is_a_permanent_error(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    before = len(slack.calls)
    with pytest.raises(PermanentSendError, match="nothing to send"):
        await adapter.send(outbound(DM, "  \n"))
    assert len(slack.calls) == before


async def test_files_go_out_with_files_upload_v2(
    slack: FakeSlackServer, adapter: SlackAdapter, tmp_path: Path
) -> None:
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.7 the quarterly report " + bytes(range(256)))
    chart = tmp_path / "chart.png"
    chart.write_bytes(b"\x89PNG\r\n\x1a\n" + b"pixels" * 100)
    document = Attachment(pdf, "application/pdf", pdf.stat().st_size, "Q3 report.pdf")
    image = Attachment(chart, "image/png", chart.stat().st_size)  # no filename: the path's

    question = slack.inject_app_mention(GENERAL, "the report please", user=BOB)
    thread = ThreadId(question.ts)
    receipt = await adapter.send(
        outbound(GENERAL, "Here **it** is", thread_id=thread, attachments=(document, image))
    )
    only_files = await adapter.send(outbound(DM, "", attachments=(document,)))

    text, *_ = slack.posted
    assert [p.text for p in slack.posted] == ["Here *it* is"]  # text first, then the files
    assert receipt.platform_message_id == key(GENERAL, text.ts)
    assert text.thread_ts == question.ts
    assert only_files.platform_message_id is None
    got = [(u.filename, u.content, u.channel, u.thread_ts) for u in slack.uploads]
    assert got == [
        ("Q3 report.pdf", pdf.read_bytes(), GENERAL, question.ts),
        ("chart.png", chart.read_bytes(), GENERAL, question.ts),
        ("Q3 report.pdf", pdf.read_bytes(), DM, None),
    ]
    assert slack.rejected == []


async def test_a_rate_limited_upload_carries_retry_after(
    slack: FakeSlackServer, adapter: SlackAdapter, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("notes", encoding="utf-8")
    slack.rate_limit("files.getUploadURLExternal", count=1, retry_after=4)
    attachment = Attachment(notes, "text/plain", notes.stat().st_size, "notes.txt")
    with pytest.raises(RateLimited) as caught:
        await adapter.send(outbound(DM, "", attachments=(attachment,)))
    assert caught.value.retry_after == 4.0
    assert slack.uploads == []


# -- editing ----------------------------------------------------------------------------------


async def test_edit_updates_the_message(slack: FakeSlackServer, adapter: SlackAdapter) -> None:
    receipt = await adapter.send(outbound(DM, "Thinking…"))
    target = receipt.platform_message_id
    assert target is not None
    edited = await adapter.edit(target, outbound(DM, "The answer is **42** & more."))
    assert edited.platform_message_id == target
    (update,) = slack.updates
    assert (update.channel, key(DM, update.ts)) == (DM, target)
    assert update.text == "The answer is *42* &amp; more."
    assert slack.texts_in(DM) == ["The answer is *42* &amp; more."]
    assert len(slack.posted) == 1


async def test_editing_an_unknown_message_is_a_permanent_error(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    with pytest.raises(PermanentSendError, match="message_not_found"):
        await adapter.edit(key(DM, "1700000000.000100"), outbound(DM, "lost"))
    with pytest.raises(PermanentSendError, match="not a Slack message id"):
        await adapter.edit(PlatformMessageId("m-1"), outbound(DM, "lost"))
    assert rejected(slack) == [("chat.update", "message_not_found")]
    assert slack.updates == []


async def test_a_rate_limited_edit_carries_retry_after(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    receipt = await adapter.send(outbound(DM, "v1"))
    assert receipt.platform_message_id is not None
    slack.rate_limit("chat.update", count=1, retry_after=3)
    with pytest.raises(RateLimited) as caught:
        await adapter.edit(receipt.platform_message_id, outbound(DM, "v2"))
    assert caught.value.retry_after == 3.0
    await adapter.edit(receipt.platform_message_id, outbound(DM, "v2"))
    assert slack.texts_in(DM) == ["v2"]


# -- the working reaction ---------------------------------------------------------------------


async def test_working_and_done_add_and_remove_the_reaction(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    asked = slack.inject_message(DM, "question", user=ANN)
    target = key(DM, asked.ts)
    await adapter.working(ChatId(DM), target)
    assert slack.reactions_on(DM, asked.ts) == ["eyes"]
    await adapter.working(ChatId(DM), target)  # again (a resumed turn): already_reacted
    assert slack.reactions_on(DM, asked.ts) == ["eyes"]
    await adapter.done(ChatId(DM), target)
    assert slack.reactions_on(DM, asked.ts) == []
    await adapter.done(ChatId(DM), target)  # again: no_reaction
    assert [(c.action, c.channel, c.timestamp, c.name) for c in slack.reactions] == [
        ("add", DM, asked.ts, "eyes"),
        ("remove", DM, asked.ts, "eyes"),
    ]
    assert rejected(slack) == [
        ("reactions.add", "already_reacted"),
        ("reactions.remove", "no_reaction"),
    ]


async def test_the_working_reaction_of_an_edit_goes_on_the_message(
    slack: FakeSlackServer, tmp_path: Path
) -> None:
    asked = slack.inject_message(GENERAL, "question", user=ANN)
    config = slack_config(slack, working_reaction="hourglass_flowing_sand")
    async with SlackAdapter(config, tmp_path) as adapter:
        edit_key = PlatformMessageId(f"{key(GENERAL, asked.ts)}:e1700000000.000200")
        await adapter.working(ChatId(GENERAL), edit_key)
        assert slack.reactions_on(GENERAL, asked.ts) == ["hourglass_flowing_sand"]
        await adapter.done(ChatId(GENERAL), edit_key)
    assert [c.action for c in slack.reactions] == ["add", "remove"]


async def test_no_working_reaction_makes_no_call(slack: FakeSlackServer, tmp_path: Path) -> None:
    asked = slack.inject_message(DM, "question", user=ANN)
    async with SlackAdapter(slack_config(slack, working_reaction=""), tmp_path) as adapter:
        before = len(slack.calls)
        await adapter.working(ChatId(DM), key(DM, asked.ts))
        await adapter.done(ChatId(DM), key(DM, asked.ts))
        assert len(slack.calls) == before
    assert slack.reactions == []


async def test_a_rate_limited_reaction_raises_like_send(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    asked = slack.inject_message(DM, "question", user=ANN)
    slack.rate_limit("reactions.add", count=1, retry_after=2)
    with pytest.raises(RateLimited):
        await adapter.working(ChatId(DM), key(DM, asked.ts))
    assert slack.reactions == []


# -- Events API mode ---------------------------------------------------------------------------


async def test_url_verification_is_answered_with_the_challenge(
    slack: FakeSlackServer, tmp_path: Path
) -> None:
    sink = ListSink()
    request = slack.url_verification_request("the-challenge-42")
    async with SlackAdapter(events_config(slack), tmp_path) as adapter:
        assert adapter.liveness() is AdapterState.RECEIVING
        answer = await adapter.handle_webhook("events", request.headers, request.body, sink)
    assert answer.status == 200
    assert answer.content_type.startswith("application/json")
    assert json.loads(answer.body) == {"challenge": "the-challenge-42"}
    assert sink.accepting == []
    assert [c.method for c in slack.calls] == ["auth.test"]  # no app token, no socket
    assert slack.sockets_opened == 0


async def test_events_api_requests_are_verified(slack: FakeSlackServer, tmp_path: Path) -> None:
    sink = ListSink()
    body = slack.event_callback(dm_event("forged?"))
    async with SlackAdapter(events_config(slack), tmp_path) as adapter:
        for bad in (
            slack.signed_request(body, wrong_signature=True),
            slack.signed_request(body, stale=True),
            slack.signed_request(body, timestamp=int(time.time()) + 600),
        ):
            answer = await adapter.handle_webhook("events", bad.headers, bad.body, sink)
            assert answer.status == 401, bad.headers
        unsigned = {"Content-Type": "application/json"}
        good = slack.signed_request(body)
        assert (await adapter.handle_webhook("events", unsigned, good.body, sink)).status == 401
        tampered = good.body.replace(b"forged?", b"forged!")
        answer = await adapter.handle_webhook("events", good.headers, tampered, sink)
        assert answer.status == 401
        assert sink.accepting == []

        answer = await adapter.handle_webhook("/events/", good.headers, good.body, sink)
        assert answer.status == 200
    assert sink.texts == ["forged?"]


async def test_a_valid_event_is_answered_after_accept(
    slack: FakeSlackServer, tmp_path: Path
) -> None:
    sink = ListSink()
    sink.gate.clear()
    event = dm_event("hello over HTTP")
    request = slack.signed_request(slack.event_callback(event))
    async with SlackAdapter(events_config(slack), tmp_path) as adapter:
        handling = asyncio.create_task(
            adapter.handle_webhook("events", request.headers, request.body, sink)
        )
        await sink.until(lambda: len(sink.accepting) == 1)
        assert not handling.done()  # no answer while the inbox has not committed
        sink.gate.set()
        async with asyncio.timeout(WAIT):
            answer = await handling
        assert answer.status == 200
        # Slack's retry of the same event: stored again under the same key, answered 200.
        retry = slack.signed_request(slack.event_callback(event), retry_num=1)
        answer = await adapter.handle_webhook("events", retry.headers, retry.body, sink)
        assert answer.status == 200
    first, again = sink.messages
    assert first.text == "hello over HTTP"
    assert first.platform_message_id == again.platform_message_id == key(DM, event["ts"])
    assert (first.chat_id, first.sender.id, first.is_direct) == (DM, ANN, True)


async def test_a_failing_sink_is_not_answered_2xx(slack: FakeSlackServer, tmp_path: Path) -> None:
    failing = ListSink(fail_on=lambda message: True)
    request = slack.signed_request(slack.event_callback(dm_event()))
    async with SlackAdapter(events_config(slack), tmp_path) as adapter:
        answer = await adapter.handle_webhook("events", request.headers, request.body, failing)
    assert answer.status >= 500  # Slack delivers it again
    assert failing.messages == []


async def test_a_body_that_is_not_utf8_is_refused(slack: FakeSlackServer, tmp_path: Path) -> None:
    sink = ListSink()
    body = b'{"type": "event_callback", "text": "\xff\xfe"}'
    request = slack.signed_request(body)
    async with SlackAdapter(events_config(slack), tmp_path) as adapter:
        answer = await adapter.handle_webhook("events", request.headers, request.body, sink)
    assert answer.status == 400
    assert sink.accepting == []


async def test_another_path_is_not_found(slack: FakeSlackServer, tmp_path: Path) -> None:
    sink = ListSink()
    request = slack.signed_request(slack.event_callback(dm_event()))
    async with SlackAdapter(events_config(slack), tmp_path) as adapter:
        for path in ("", "interactive", "events/more"):
            answer = await adapter.handle_webhook(path, request.headers, request.body, sink)
            assert answer.status == 404, path
    assert sink.accepting == []


async def test_a_socket_mode_adapter_has_no_webhook(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    sink = ListSink()
    request = slack.signed_request(slack.event_callback(dm_event()))
    answer = await adapter.handle_webhook("events", request.headers, request.body, sink)
    assert answer.status == 404
    assert sink.accepting == []


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"not json {", id="not-json"),
        pytest.param(b"{", id="truncated"),
        pytest.param(b"[1, 2]", id="a-list"),
    ],
)
async def test_junk_is_refused_not_raised(
    slack: FakeSlackServer, tmp_path: Path, body: bytes
) -> None:
    sink = ListSink()
    async with SlackAdapter(events_config(slack), tmp_path) as adapter:
        for headers in ({"Content-Type": "application/json"}, slack.signed_request(body).headers):
            answer = await adapter.handle_webhook("events", headers, body, sink)
            assert answer.status in (400, 401), headers
    assert sink.accepting == []


# -- check (herald doctor) --------------------------------------------------------------------


async def test_check_describes_the_bot(slack: FakeSlackServer, tmp_path: Path) -> None:
    detail = await SlackAdapter(slack_config(slack), tmp_path).check()
    assert detail == "herald (UBOT) in herald-test, app token ok (Socket Mode)"
    detail = await SlackAdapter(events_config(slack), tmp_path).check()
    assert detail == "herald (UBOT) in herald-test, Events API"
    assert [c.method for c in slack.calls] == ["auth.test", "apps.connections.open", "auth.test"]
    assert slack.sockets_opened == 0  # checking connects nothing


async def test_check_with_a_wrong_bot_token_is_an_auth_error(
    slack: FakeSlackServer, tmp_path: Path
) -> None:
    wrong = "xoxb-1-not-the-bot-token"
    adapter = SlackAdapter(slack_config(slack, bot_token=SecretStr(wrong)), tmp_path)
    with pytest.raises(AuthError, match=r"auth\.test: invalid_auth") as caught:
        await adapter.check()
    assert wrong not in str(caught.value)


async def test_check_with_a_wrong_app_token_is_an_auth_error(
    slack: FakeSlackServer, tmp_path: Path
) -> None:
    config = slack_config(slack, app_token=SecretStr("xapp-1-A1-wrong"))
    with pytest.raises(AuthError, match=r"apps\.connections\.open: invalid_auth"):
        await SlackAdapter(config, tmp_path).check()


async def test_check_of_an_unreachable_slack_is_not_ready(tmp_path: Path) -> None:
    with refusing_socket() as url:
        config = SlackConfig(
            bot_token=SecretStr(DEFAULT_BOT_TOKEN),
            app_token=SecretStr(DEFAULT_APP_TOKEN),
            base_url=f"{url}/api/",
        )
        with pytest.raises(NotReady):
            await SlackAdapter(config, tmp_path).check()


# -- edits and reactions ------------------------------------------------------------------------


async def test_edits_and_reactions_reach_the_sink(
    slack: FakeSlackServer, adapter: SlackAdapter
) -> None:
    asked = slack.inject_message(DM, "queston", user=ANN)
    slack.inject_edit(DM, asked.ts, "question")
    slack.inject_event(
        {
            "type": "reaction_added",
            "user": ANN,
            "reaction": "+1::skin-tone-3",
            "item": {"type": "message", "channel": DM, "ts": "1795000000.000200"},
        }
    )
    sink = ListSink()
    async with receiving(adapter, sink) as task:
        await until_or_ended(slack, task, lambda: not slack.pending)
    assert sink.texts == ["queston", "question"]
    edit = sink.messages[1]
    assert edit.edit_of == key(DM, asked.ts)
    assert edit.platform_message_id.startswith(f"{key(DM, asked.ts)}:e")
    [reaction] = sink.reactions
    assert (reaction.message, reaction.emoji, reaction.sender.id) == (
        key(DM, "1795000000.000200"),
        "+1::skin-tone-3",
        ANN,
    )
