"""The fake Telegram Bot API, driven by python-telegram-bot's own `Bot` (in-process and as a
subprocess): the fake must behave like Telegram as far as python-telegram-bot can tell."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dtm
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from telegram import Bot, LinkPreviewOptions, ReplyParameters
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TimedOut,
)

import adapters.telegram  # noqa: F401  (sets PTB_TIMEDELTA before python-telegram-bot is used)
from tests.fakes.telegram import (
    NOT_MODIFIED,
    FakeTelegramServer,
    TelegramServerClient,
    auto_entities,
    parse_html,
    parse_markdown_v2,
)

TOKEN = "123:abc"
WAIT = 10.0
"""Upper bound of every wait for a condition."""
REPO = Path(__file__).resolve().parents[2]
USER = 42
"""A private chat, and the user in it."""
CALLBACK_QUERY = {
    "id": "9",
    "from": {"id": 1, "is_bot": False, "first_name": "A"},
    "chat_instance": "c",
}


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, webhook_retry_delay=0.05) as server:
        yield server


def make_bot(server: FakeTelegramServer | TelegramServerClient, token: str = TOKEN) -> Bot:
    return Bot(token, base_url=server.base_url, base_file_url=server.base_file_url)


@pytest.fixture
async def bot(tg: FakeTelegramServer) -> AsyncIterator[Bot]:
    async with make_bot(tg) as opened:
        yield opened


# -- getMe, tokens, the wire ----------------------------------------------------------------------


async def test_get_me_describes_the_bot(bot: Bot) -> None:
    me = await bot.get_me()
    assert (me.id, me.is_bot, me.username, me.first_name) == (123, True, "herald_bot", "Herald")
    assert bot.username == "herald_bot"  # Bot.initialize cached getMe


async def test_wrong_token_is_invalid_token(tg: FakeTelegramServer) -> None:
    with pytest.raises(InvalidToken, match="was rejected by the server"):
        async with make_bot(tg, "123:wrong"):  # Bot.initialize calls getMe
            pass
    assert tg.calls == []  # requests with a wrong token are not logged


async def test_wire_format_of_answers(tg: FakeTelegramServer) -> None:
    async with httpx.AsyncClient(base_url=tg.url) as client:
        response = await client.get("/botnope/getMe")
        assert (response.status_code, response.json()) == (
            401,
            {"ok": False, "error_code": 401, "description": "Unauthorized"},
        )
        response = await client.post(f"/bot{TOKEN}/noSuchMethod")
        assert (response.status_code, response.json()) == (
            404,
            {"ok": False, "error_code": 404, "description": "Not Found"},
        )
        # Method names are case-insensitive; JSON bodies and query strings work too.
        response = await client.post(f"/bot{TOKEN}/SENDMESSAGE", json={"chat_id": 7, "text": "a"})
        assert response.json()["result"]["text"] == "a"
        response = await client.get(f"/bot{TOKEN}/sendMessage?chat_id=7&text=123")
        assert response.json()["result"]["text"] == "123"  # a text stays a string
        tg.rate_limit(7, retry_after=2)
        response = await client.post(f"/bot{TOKEN}/sendMessage", data={"chat_id": "7", "text": "x"})
        assert (response.status_code, response.json()) == (
            429,
            {
                "ok": False,
                "error_code": 429,
                "description": "Too Many Requests: retry after 2",
                "parameters": {"retry_after": 2},
            },
        )
        response = await client.get(f"/file/bot{TOKEN}/nothing/here.jpg")
        assert response.status_code == 404
    assert [c.method for c in tg.calls] == [
        "noSuchMethod",
        "sendMessage",
        "sendMessage",
        "sendMessage",
    ]
    assert tg.calls[2].params == {"chat_id": 7, "text": "123"}  # a text stays a string
    assert [r.status for r in tg.rejected] == [404, 429]


async def test_parameters_are_decoded_as_python_telegram_bot_sends_them(
    tg: FakeTelegramServer, bot: Bot
) -> None:
    first = tg.inject_message(USER, "hi", sender_id=USER)
    await bot.send_message(
        USER,
        "reply",
        reply_parameters=ReplyParameters(message_id=first.message_id),
        link_preview_options=LinkPreviewOptions(is_disabled=True),
        disable_notification=True,
    )
    params = tg.calls[-1].params
    assert params["chat_id"] == USER
    assert params["reply_parameters"] == {"message_id": first.message_id}
    assert params["link_preview_options"] == {"is_disabled": True}
    assert params["disable_notification"] is True
    assert tg.sent[-1].disable_notification
    assert tg.sent[-1].reply_to_message_id == first.message_id


# -- getUpdates ---------------------------------------------------------------------------------


async def test_updates_stay_until_a_later_offset_confirms_them(
    tg: FakeTelegramServer, bot: Bot
) -> None:
    first = tg.inject_message(USER, "one", sender_id=USER, sender_name="Ann")
    second = tg.inject_message(USER, "two", sender_id=USER)

    updates = await bot.get_updates()
    assert [u.update_id for u in updates] == [first.update_id, second.update_id]
    message = updates[0].message
    assert message is not None
    assert (message.text, message.chat.id, message.chat.type) == ("one", USER, "private")
    assert message.from_user is not None
    assert (message.from_user.id, message.from_user.first_name) == (USER, "Ann")
    assert message.message_id == first.message_id

    again = await bot.get_updates()  # nothing confirmed yet
    assert [u.update_id for u in again] == [first.update_id, second.update_id]
    assert tg.confirmed == []

    rest = await bot.get_updates(offset=first.update_id + 1)
    assert [u.update_id for u in rest] == [second.update_id]
    assert tg.confirmed == [first.update_id]

    assert await bot.get_updates(offset=second.update_id + 1, timeout=0) == ()
    await tg.wait_until_confirmed(first.update_id, second.update_id, timeout=WAIT)
    assert tg.pending == []
    assert tg.polls == 4


async def test_long_poll_answers_as_soon_as_an_update_arrives(
    tg: FakeTelegramServer, bot: Bot
) -> None:
    poll = asyncio.create_task(bot.get_updates(timeout=30))
    try:
        await tg.wait_for(lambda: tg.polls_waiting == 1, WAIT)
        injected = tg.inject_message(USER, "wake up", sender_id=USER)
        async with asyncio.timeout(WAIT):  # far below the poll's 30 s
            updates = await poll
    finally:
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
    assert [u.update_id for u in updates] == [injected.update_id]


async def test_long_poll_without_updates_answers_empty_at_its_timeout(bot: Bot) -> None:
    assert await bot.get_updates(timeout=dtm.timedelta(seconds=0.1)) == ()


async def test_negative_offset_keeps_only_the_last_updates(
    tg: FakeTelegramServer, bot: Bot
) -> None:
    ids = [tg.inject_message(USER, f"m{n}", sender_id=USER).update_id for n in range(3)]
    updates = await bot.get_updates(offset=-1)
    assert [u.update_id for u in updates] == ids[-1:]
    assert tg.discarded == ids[:2]
    assert [u.update_id for u in tg.pending] == ids[-1:]


async def test_limit_and_allowed_updates(tg: FakeTelegramServer, bot: Bot) -> None:
    first = tg.inject_message(USER, "one", sender_id=USER)
    tg.inject_message(USER, "two", sender_id=USER)
    assert [u.update_id for u in await bot.get_updates(limit=1)] == [first.update_id]

    # allowed_updates applies to updates created after the call, as on Telegram.
    await bot.get_updates(offset=-1, allowed_updates=["edited_message"], timeout=0)
    unwanted = tg.inject_message(USER, "three", sender_id=USER)
    edit = tg.inject_message(USER, "one, edited", sender_id=USER, edit_of=first.message_id)
    assert unwanted.update_id in tg.discarded
    updates = await bot.get_updates(offset=edit.update_id)
    assert [u.update_id for u in updates] == [edit.update_id]
    edited = updates[0].edited_message
    assert edited is not None
    assert (edited.message_id, edited.text) == (first.message_id, "one, edited")
    assert edited.edit_date is not None


async def test_a_newer_poll_ends_a_waiting_one_with_conflict(tg: FakeTelegramServer) -> None:
    async with make_bot(tg) as first, make_bot(tg) as second:
        waiting = asyncio.create_task(first.get_updates(timeout=30))
        try:
            await tg.wait_for(lambda: tg.polls_waiting == 1, WAIT)
            assert await second.get_updates(timeout=0) == ()
            with pytest.raises(Conflict, match="terminated by other getUpdates request"):
                async with asyncio.timeout(WAIT):
                    await waiting
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)


async def test_duplicate_redelivers_a_confirmed_update(tg: FakeTelegramServer, bot: Bot) -> None:
    injected = tg.inject_message(USER, "once", sender_id=USER)
    [update] = await bot.get_updates()
    assert await bot.get_updates(offset=update.update_id + 1, timeout=0) == ()
    assert tg.confirmed == [injected.update_id]

    tg.duplicate(injected.update_id)
    [again] = await bot.get_updates(offset=update.update_id + 1)
    assert again.update_id == update.update_id
    assert again.to_dict() == update.to_dict()
    assert await bot.get_updates(offset=update.update_id + 1, timeout=0) == ()
    assert tg.confirmed == [injected.update_id, injected.update_id]


async def test_stalled_poll_times_out_on_the_client(tg: FakeTelegramServer, bot: Bot) -> None:
    injected = tg.inject_message(USER, "held", sender_id=USER)
    tg.stall_polls()
    with pytest.raises(TimedOut):
        await bot.get_updates(timeout=0, read_timeout=0.3)
    await tg.wait_for(lambda: tg.polls_waiting == 0, WAIT)  # the server saw the client leave
    updates = await bot.get_updates(timeout=0)
    assert [u.update_id for u in updates] == [injected.update_id]


async def test_a_long_poll_ends_when_its_client_leaves(tg: FakeTelegramServer) -> None:
    async with httpx.AsyncClient(base_url=tg.base_url + TOKEN, timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/getUpdates", data={"timeout": "30"})
    await tg.wait_for(lambda: tg.polls_waiting == 0, WAIT)  # not after 30 s
    assert tg.polls == 1


async def test_dropped_poll_is_a_network_error_and_confirms_nothing(
    tg: FakeTelegramServer, bot: Bot
) -> None:
    injected = tg.inject_message(USER, "x", sender_id=USER)
    tg.drop("getUpdates")
    with pytest.raises(NetworkError, match="RemoteProtocolError"):
        await bot.get_updates(offset=injected.update_id + 1)
    assert [u.update_id for u in tg.pending] == [injected.update_id]
    assert tg.polls == 1


# -- injected messages --------------------------------------------------------------------------


async def test_injected_messages_carry_telegram_shapes(tg: FakeTelegramServer, bot: Bot) -> None:
    own = await bot.send_message(-100500, "from the bot")
    command = tg.inject_message(
        -100500,
        "/ask@herald_bot 😀 hi @herald_bot",
        sender_id=7,
        sender_name="Bob",
        sender_username="bob",
        chat_type="supergroup",
        chat_title="Team",
        reply_to=own.message_id,
    )
    topic = tg.inject_message(
        -100600, "in a topic", sender_id=7, chat_type="supergroup", is_forum=True, thread_id=55
    )
    updates = await bot.get_updates()
    by_id = {u.update_id: u.message for u in updates}

    asked = by_id[command.update_id]
    assert asked is not None
    assert asked.message_id == own.message_id + 1  # ids are shared per chat
    assert (asked.chat.type, asked.chat.title) == ("supergroup", "Team")
    assert asked.from_user is not None
    assert asked.from_user.username == "bob"
    entities = asked.parse_entities()
    assert sorted(entities.values()) == ["/ask@herald_bot", "@herald_bot"]
    assert asked.reply_to_message is not None
    assert asked.reply_to_message.from_user is not None
    assert asked.reply_to_message.from_user.is_bot
    assert asked.reply_to_message.text == "from the bot"

    in_topic = by_id[topic.update_id]
    assert in_topic is not None
    assert (in_topic.message_thread_id, in_topic.is_topic_message) == (55, True)
    assert in_topic.chat.is_forum
    # As on Telegram, a topic message replies to the topic's creation message.
    assert in_topic.reply_to_message is not None
    assert in_topic.reply_to_message.forum_topic_created is not None


def test_auto_entities_use_utf16_offsets() -> None:
    assert auto_entities("😀 @someone") == [{"type": "mention", "offset": 3, "length": 8}]
    assert auto_entities("/start@herald_bot go") == [
        {"type": "bot_command", "offset": 0, "length": 17}
    ]
    assert auto_entities("mail a@b.example /notacommand") == []


async def test_inject_update_passes_raw_payloads(tg: FakeTelegramServer, bot: Bot) -> None:
    update_id = tg.inject_update({"callback_query": CALLBACK_QUERY})
    [update] = await bot.get_updates()
    assert update.update_id == update_id
    assert update.callback_query is not None
    assert update.callback_query.id == "9"


# -- sendMessage and its validation -------------------------------------------------------------


async def test_send_message_parses_html(tg: FakeTelegramServer, bot: Bot) -> None:
    text = (
        '<b>bold</b> &amp; <a href="https://example.com">link</a> &#128512; '
        '<pre><code class="language-python">x = 1</code></pre> '
        '<blockquote expandable>quote</blockquote> <span class="tg-spoiler">s</span>'
    )
    message = await bot.send_message(USER, text, parse_mode="HTML")
    assert message.text == "bold & link 😀 x = 1 quote s"
    kinds = {e.type: e for e in message.entities}
    assert kinds["text_link"].url == "https://example.com"
    assert kinds["pre"].language == "python"
    assert "expandable_blockquote" in kinds
    assert "spoiler" in kinds
    sent = tg.sent[-1]
    assert (sent.text, sent.parse_mode, sent.plain_text) == (text, "HTML", message.text)
    assert tg.texts_in(USER) == [message.text]


@pytest.mark.parametrize(
    ("markup", "reason"),
    [
        ("<b>unclosed", 'can\'t find end tag corresponding to start tag "b"'),
        ("a < b", 'unsupported start tag "" at byte offset 2'),
        ("line<br>break", 'unsupported start tag "br" at byte offset 4'),
        ("<b><i>x</b></i>", 'unmatched end tag at byte offset 7, expected "</i>", found "</b>"'),
        ("x</b>", "unexpected end tag at byte offset 1"),
        ("AT&T", 'character "&" must be escaped'),
        ("a&nbsp;b", 'unsupported html entity "&nbsp;"'),
        ('<span class="x">s</span>', 'tag "span" must have class "tg-spoiler"'),
        ("😀<p>", 'unsupported start tag "p" at byte offset 4'),  # byte offsets count UTF-8
    ],
)
async def test_bad_html_is_refused(bot: Bot, markup: str, reason: str) -> None:
    # python-telegram-bot strips "Bad Request: " and lowercases the rest (str.capitalize).
    with pytest.raises(BadRequest, match=r"^Can't parse entities: ") as caught:
        await bot.send_message(USER, markup, parse_mode="HTML")
    assert reason in caught.value.message


@pytest.mark.parametrize(
    ("markup", "plain", "kinds"),
    [
        (
            "*bold* _it_ __under__ ~del~ ||spoil||",
            "bold it under del spoil",
            ["bold", "italic", "underline", "strikethrough", "spoiler"],
        ),
        (
            "Total: 5\\.00\\! `a.b` [link](https://x.y/a\\)b)",
            "Total: 5.00! a.b link",
            ["code", "text_link"],
        ),
        ("```python\nprint(1)\n```", "print(1)", ["pre"]),
        (">quoted\n>more\nafter", "quoted\nmore\nafter", ["blockquote"]),
        ("*bold _italic inside_*", "bold italic inside", ["bold", "italic"]),
    ],
)
async def test_markdown_v2_is_parsed(bot: Bot, markup: str, plain: str, kinds: list[str]) -> None:
    message = await bot.send_message(USER, markup, parse_mode="MarkdownV2")
    assert message.text == plain
    assert sorted(e.type for e in message.entities) == sorted(kinds)


@pytest.mark.parametrize(
    ("markup", "reason"),
    [
        ("Hello.", "character '.' is reserved and must be escaped with the preceding '\\'"),
        ("a-b", "character '-' is reserved"),
        ("*unclosed", "can't find end of bold entity at byte offset 0"),
        ("ok _x", "can't find end of italic entity at byte offset 3"),
        ("[t](http://x", "can't find end of a url at byte offset 4"),
        ("`a`b`", "can't find end of code entity at byte offset 4"),
    ],
)
async def test_bad_markdown_v2_is_refused(bot: Bot, markup: str, reason: str) -> None:
    with pytest.raises(BadRequest, match=r"^Can't parse entities: ") as caught:
        await bot.send_message(USER, markup, parse_mode="MarkdownV2")
    assert reason in caught.value.message


async def test_legacy_markdown_is_parsed(bot: Bot) -> None:
    message = await bot.send_message(
        USER, "*b* _i_ `c` [l](http://x) a.b-c!", parse_mode="Markdown"
    )
    assert message.text == "b i c l a.b-c!"
    assert [e.type for e in message.entities] == ["bold", "italic", "code", "text_link"]
    with pytest.raises(BadRequest, match="can't find end of the entity starting at byte offset 2"):
        await bot.send_message(USER, "a *b", parse_mode="Markdown")


def test_parsers_report_utf16_entities() -> None:
    parsed = parse_html("😀 <b>x</b>")
    assert (parsed.text, parsed.entities) == ("😀 x", ({"type": "bold", "offset": 3, "length": 1},))
    parsed = parse_markdown_v2("`code with \\` and \\\\`")
    assert parsed.text == "code with ` and \\"
    assert parsed.entities == ({"type": "code", "offset": 0, "length": 17},)


async def test_text_length_counts_utf16_after_parsing(tg: FakeTelegramServer, bot: Bot) -> None:
    await bot.send_message(USER, "😀" * 2048)  # 4096 UTF-16 code units
    await bot.send_message(USER, f"<b>{'x' * 4096}</b>", parse_mode="HTML")
    with pytest.raises(BadRequest, match=r"^Message is too long$"):
        await bot.send_message(USER, "😀" * 2048 + "x")
    with pytest.raises(BadRequest, match=r"^Message text is empty$"):
        await bot.send_message(USER, " \n ")
    with pytest.raises(BadRequest, match=r"^Message text is empty$"):
        await bot.send_message(USER, "<b> </b>", parse_mode="HTML")
    message = await bot.send_message(USER, "  <b>padded</b>  ", parse_mode="HTML")
    assert message.text == "padded"
    assert message.entities[0].offset == 0
    assert len(tg.sent) == 3


async def test_replies_need_an_existing_message(tg: FakeTelegramServer, bot: Bot) -> None:
    with pytest.raises(BadRequest, match=r"^Message to be replied not found$"):
        await bot.send_message(USER, "x", reply_parameters=ReplyParameters(message_id=999))
    message = await bot.send_message(
        USER,
        "x",
        reply_parameters=ReplyParameters(message_id=999, allow_sending_without_reply=True),
    )
    assert message.reply_to_message is None
    assert tg.sent[-1].reply_to_message_id is None


async def test_forum_topics(tg: FakeTelegramServer, bot: Bot) -> None:
    tg.inject_message(-1007, "hi", sender_id=1, chat_type="supergroup", is_forum=True, thread_id=3)
    message = await bot.send_message(-1007, "answer", message_thread_id=3)
    assert (message.message_thread_id, message.is_topic_message) == (3, True)
    assert tg.sent[-1].message_thread_id == 3
    with pytest.raises(BadRequest, match=r"^Message thread not found$"):
        await bot.send_message(-1007, "lost", message_thread_id=4)
    tg.delete_topic(-1007, 3)
    with pytest.raises(BadRequest, match=r"^Message thread not found$"):
        await bot.send_chat_action(-1007, "typing", message_thread_id=3)


# -- faults -------------------------------------------------------------------------------------


async def test_rate_limit_hits_one_chat_only(tg: FakeTelegramServer, bot: Bot) -> None:
    tg.rate_limit(USER, count=2, retry_after=3)
    with pytest.raises(RetryAfter) as caught:
        await bot.send_message(USER, "x")
    assert caught.value.retry_after == dtm.timedelta(seconds=3)
    await bot.send_message(USER + 1, "other chat")
    with pytest.raises(RetryAfter):
        await bot.send_chat_action(USER, "typing")
    await bot.send_message(USER, "after the limit")
    assert [s.chat_id for s in tg.sent] == [USER + 1, USER]
    assert [r.description for r in tg.rejected] == ["Too Many Requests: retry after 3"] * 2


async def test_server_errors_are_network_errors(tg: FakeTelegramServer, bot: Bot) -> None:
    tg.fail("sendMessage", count=2, status=502)
    for _ in range(2):
        with pytest.raises(NetworkError) as caught:
            await bot.send_message(USER, "x")
        assert type(caught.value) is NetworkError
    tg.fail("*", status=500)
    with pytest.raises(NetworkError, match="Internal Server Error"):
        await bot.get_me()
    await bot.send_message(USER, "x")
    assert len(tg.sent) == 1


async def test_dropped_connection_is_a_network_error(tg: FakeTelegramServer, bot: Bot) -> None:
    tg.drop("sendMessage")
    with pytest.raises(NetworkError, match="RemoteProtocolError"):
        await bot.send_message(USER, "lost")
    await bot.send_message(USER, "kept")
    assert [s.text for s in tg.sent] == ["kept"]


async def test_reject_markup_refuses_the_next_formatted_send(
    tg: FakeTelegramServer, bot: Bot
) -> None:
    tg.reject_markup()
    await bot.send_message(USER, "plain passes")
    with pytest.raises(BadRequest, match=r"^Can't parse entities"):
        await bot.send_message(USER, "*fine*", parse_mode="MarkdownV2")
    await bot.send_message(USER, "*fine*", parse_mode="MarkdownV2")
    assert [s.plain_text for s in tg.sent] == ["plain passes", "fine"]


async def test_migrated_chat(tg: FakeTelegramServer, bot: Bot) -> None:
    tg.migrate_chat(-5, -1005)
    with pytest.raises(ChatMigrated) as caught:
        await bot.send_message(-5, "x")
    assert caught.value.new_chat_id == -1005
    message = await bot.send_message(-1005, "x")
    assert message.chat.type == "supergroup"


async def test_blocked_chat_is_forbidden(tg: FakeTelegramServer, bot: Bot) -> None:
    tg.block_chat(USER)
    with pytest.raises(Forbidden, match=r"^Forbidden: bot was blocked by the user$"):
        await bot.send_message(USER, "x")
    tg.block_chat(-5)
    with pytest.raises(Forbidden, match="kicked from the group chat"):
        await bot.send_chat_action(-5, "typing")
    tg.clear_faults()
    await bot.send_message(USER, "x")


# -- edits, actions, files ----------------------------------------------------------------------


async def test_edit_message_text(tg: FakeTelegramServer, bot: Bot) -> None:
    sent = await bot.send_message(USER, "draft")
    edited = await bot.edit_message_text("<b>final</b>", USER, sent.message_id, parse_mode="HTML")
    assert not isinstance(edited, bool)
    assert (edited.text, edited.message_id) == ("final", sent.message_id)
    assert edited.edit_date is not None
    assert [(e.message_id, e.plain_text) for e in tg.edits] == [(sent.message_id, "final")]
    assert tg.texts_in(USER) == ["final"]

    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_text("<b>final</b>", USER, sent.message_id, parse_mode="HTML")
    assert caught.value.message.lower() == NOT_MODIFIED.removeprefix("Bad Request: ").lower()
    # Same text, other entities: modified.
    await bot.edit_message_text("final", USER, sent.message_id)
    with pytest.raises(BadRequest, match=r"^Message to edit not found$"):
        await bot.edit_message_text("x", USER, 999)
    theirs = tg.inject_message(USER, "mine", sender_id=USER)
    with pytest.raises(BadRequest, match=r"^Message can't be edited$"):
        await bot.edit_message_text("x", USER, theirs.message_id)
    assert len(tg.edits) == 2


async def test_chat_actions(tg: FakeTelegramServer, bot: Bot) -> None:
    assert await bot.send_chat_action(USER, "typing") is True
    assert [(a.chat_id, a.action) for a in tg.actions] == [(USER, "typing")]
    with pytest.raises(BadRequest, match=r"^Wrong parameter action in request$"):
        await bot.send_chat_action(USER, "dancing")


async def test_get_file_and_download(tg: FakeTelegramServer, bot: Bot) -> None:
    file_id = tg.add_file(b"\xff\xd8jpeg bytes", file_path="photos/file_1.jpg")
    injected = tg.inject_message(USER, "look", sender_id=USER, photo=file_id)
    [update] = await bot.get_updates()
    assert update.message is not None
    assert update.message.caption == "look"
    assert update.message.photo[-1].file_id == file_id  # the largest size comes last
    assert injected.message_id == update.message.message_id

    file = await bot.get_file(update.message.photo[-1].file_id)
    assert file.file_size == len(b"\xff\xd8jpeg bytes")
    assert file.file_path == f"{tg.base_file_url}{TOKEN}/photos/file_1.jpg"
    assert await file.download_as_bytearray() == bytearray(b"\xff\xd8jpeg bytes")
    with pytest.raises(BadRequest, match=r"^Invalid file_id$"):
        await bot.get_file("nope")


async def test_uploads_are_recorded(tg: FakeTelegramServer, bot: Bot) -> None:
    photo = await bot.send_photo(USER, b"\x89PNG fake", caption="<i>chart</i>", parse_mode="HTML")
    assert photo.caption == "chart"
    assert len(photo.photo) == 2
    sent = tg.sent[-1]
    assert (sent.method, sent.text, sent.plain_text) == ("sendPhoto", "<i>chart</i>", "chart")
    assert sent.upload is not None
    assert (sent.upload.field, sent.upload.source, sent.upload.content) == (
        "photo",
        "upload",
        b"\x89PNG fake",
    )

    document = await bot.send_document(USER, b"a,b\n1,2\n", filename="report.csv")
    assert document.document is not None
    assert document.document.file_name == "report.csv"
    upload = tg.sent[-1].upload
    assert upload is not None
    assert (upload.filename, upload.content_type, upload.content) == (
        "report.csv",
        "text/csv",
        b"a,b\n1,2\n",
    )
    file = await bot.get_file(document.document.file_id)
    assert await file.download_as_bytearray() == bytearray(b"a,b\n1,2\n")

    again = await bot.send_photo(USER, photo.photo[-1].file_id)  # by file id
    assert again.photo[-1].file_size == len(b"\x89PNG fake")
    assert tg.sent[-1].upload is not None
    assert tg.sent[-1].upload.source == "file_id"
    with pytest.raises(BadRequest, match=r"^Wrong file identifier/http url specified$"):
        await bot.send_document(USER, "not-a-file-id")
    with pytest.raises(BadRequest, match=r"^Message caption is too long$"):
        await bot.send_photo(USER, b"x", caption="c" * 1025)


# -- webhooks -----------------------------------------------------------------------------------


class WebhookReceiver:
    """A tiny HTTP server that records webhook requests and answers scripted statuses."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        """Status of each request in turn; 200 once exhausted."""
        self.requests: list[tuple[dict[str, str], dict[str, object]]] = []
        self.changed = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/hook"

    async def __aenter__(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(WAIT):
            while len(self.requests) < count:
                self.changed.clear()
                await self.changed.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in head[1:] if line)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append((headers, json.loads(body)))
            status = self.statuses.pop(0) if self.statuses else 200
            head_out = f"HTTP/1.1 {status} Status\r\ncontent-length: 0\r\nconnection: close\r\n"
            writer.write(f"{head_out}\r\n".encode())
            await writer.drain()
        finally:
            self.changed.set()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def test_webhook_receives_updates_in_order_with_retries(
    tg: FakeTelegramServer, bot: Bot
) -> None:
    async with WebhookReceiver([500]) as receiver:
        first = tg.inject_message(USER, "one", sender_id=USER)
        assert await bot.set_webhook(receiver.url, secret_token="s3cr3t-Token_1")
        second = tg.inject_message(USER, "two", sender_id=USER)
        await tg.wait_until_confirmed(first.update_id, second.update_id, timeout=WAIT)

        assert [body["update_id"] for _, body in receiver.requests] == [
            first.update_id,  # answered 500
            first.update_id,  # retried
            second.update_id,
        ]
        assert all(
            h["x-telegram-bot-api-secret-token"] == "s3cr3t-Token_1" for h, _ in receiver.requests
        )
        assert all(h["content-type"] == "application/json" for h, _ in receiver.requests)
        assert [d.status for d in tg.webhook_deliveries] == [500, 200, 200]

        info = await bot.get_webhook_info()
        assert (info.url, info.pending_update_count) == (receiver.url, 0)
        assert info.last_error_message == "Wrong response from the webhook: 500 Status"
        assert info.last_error_date is not None

        with pytest.raises(Conflict, match="can't use getUpdates method while webhook is active"):
            await bot.get_updates(timeout=0)

        assert await bot.delete_webhook()
        assert (await bot.get_webhook_info()).url == ""
        third = tg.inject_message(USER, "three", sender_id=USER)
        assert [u.update_id for u in await bot.get_updates(timeout=0)] == [third.update_id]
        assert len(receiver.requests) == 3


async def test_webhook_survives_an_unreachable_url(tg: FakeTelegramServer, bot: Bot) -> None:
    async with WebhookReceiver([]) as receiver:
        url = receiver.url
    await bot.set_webhook(url)  # nobody listens there any more
    injected = tg.inject_message(USER, "x", sender_id=USER)
    await tg.wait_for(lambda: len(tg.webhook_deliveries) >= 2, WAIT)
    assert tg.webhook is not None
    assert tg.webhook.last_error_message == "Connection refused"
    assert await bot.delete_webhook(drop_pending_updates=True)
    assert tg.discarded == [injected.update_id]
    assert tg.pending == []


async def test_set_webhook_validates_its_arguments(tg: FakeTelegramServer, bot: Bot) -> None:
    with pytest.raises(BadRequest, match=r"^Bad webhook: https url must be provided"):
        await bot.set_webhook("ftp://127.0.0.1/hook")
    with pytest.raises(BadRequest, match=r"^Secret token contains unallowed characters$"):
        await bot.set_webhook("http://127.0.0.1:9/hook", secret_token="no spaces")
    assert tg.webhook is None
    assert await bot.delete_webhook()  # "Webhook is already deleted"


async def test_control_routes_refuse_bad_requests(tg: FakeTelegramServer) -> None:
    async with TelegramServerClient(tg.url) as control:
        for fault, params in [
            ("no_such_fault", {}),
            ("rate_limit", {}),
            ("duplicate", {"update_id": 404}),
        ]:
            with pytest.raises(httpx.HTTPStatusError):
                await control.fault(fault, **params)
        with pytest.raises(httpx.HTTPStatusError):
            await control.inject(USER, "x", sender_id=USER, colour="blue")
        with pytest.raises(httpx.HTTPStatusError):
            await control.inject(USER, "x", sender_id=USER, reply_to=999)
        injected = await control.inject(USER, "fine", sender_id=USER, sender_name="Ann")
        assert [u.payload["message"]["text"] for u in tg.pending] == ["fine"]
        assert injected.update_id == tg.pending[0].update_id


async def test_wait_for_sent(tg: FakeTelegramServer, bot: Bot) -> None:
    await bot.send_message(USER, "a")
    await bot.send_message(USER + 1, "b")
    assert len(await tg.wait_for_sent(2, timeout=WAIT)) == 2
    matches = await tg.wait_for_sent(lambda s: s.chat_id == USER + 1, timeout=WAIT)
    assert [s.text for s in matches] == ["b"]
    with pytest.raises(TimeoutError):
        await tg.wait_for_sent(3, timeout=0.05)


# -- standalone ---------------------------------------------------------------------------------


async def test_standalone_server_is_usable_from_another_process() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.telegram",
        "--port",
        "0",
        "--token",
        TOKEN,
        "--bot-username",
        "crash_bot",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(WAIT):
            banner = (await process.stdout.readline()).decode()
        url = banner.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), banner
        async with TelegramServerClient(url) as control:
            await control.wait_up(WAIT)
            file_id = await control.add_file(b"doc", file_name="a.txt", mime_type="text/plain")
            first, second = await control.inject_many(
                [
                    {"chat_id": USER, "text": "from afar", "sender_id": USER},
                    {"chat_id": USER, "sender_id": USER, "document": file_id},
                ]
            )
            raw_id = await control.inject_update({"callback_query": CALLBACK_QUERY})
            async with make_bot(control) as remote:
                assert remote.username == "crash_bot"
                updates = await remote.get_updates()
                assert [u.update_id for u in updates] == [
                    first.update_id,
                    second.update_id,
                    raw_id,
                ]
                assert updates[1].message is not None
                assert updates[1].message.document is not None
                document = await updates[1].message.document.get_file()
                assert await document.download_as_bytearray() == bytearray(b"doc")
                await remote.get_updates(offset=raw_id + 1, timeout=0)
                await remote.send_message(USER, "reply")
                await control.fault("rate_limit", chat_id=USER, retry_after=1)
                with pytest.raises(RetryAfter):
                    await remote.send_message(USER, "too fast")
                await control.duplicate(first.update_id)
                [again] = await remote.get_updates(offset=raw_id + 1)
                assert again.update_id == first.update_id
            # The duplicate of `first` waits for a later poll to confirm it.
            state = await control.wait(WAIT, min_sent=1, confirmed=[second.update_id, raw_id])
            assert [s["plain_text"] for s in state["sent"]] == ["reply"]
            assert state["texts"] == {str(USER): ["reply"]}
            assert state["pending"] == [first.update_id]
            with pytest.raises(TimeoutError):
                await control.wait(0.05, min_sent=2)
            with pytest.raises(httpx.HTTPStatusError):
                await control.fault("no_such_fault")

        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
