"""Matrix events → InboundMessage, Markdown → Matrix HTML, errors → Herald errors, against
recorded client-server API events (tests/data/matrix)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from adapters.inbound import Incoming, Skipped
from adapters.matrix import SPEC
from adapters.matrix.config import MatrixConfig
from adapters.matrix.convert import (
    NOT_ADDRESSED,
    VOICE_BODY,
    Me,
    MediaRef,
    RoomView,
    button_reactions,
    edit_content,
    error_from,
    inviter_of,
    ogg_duration_ms,
    reaction_from,
    reaction_of,
    split_event_key,
    text_content,
    to_html,
    to_inbound,
    voice_content,
    with_buttons,
    within_event_limit,
)
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import Button, Reaction
from gateway.contracts.platform import ChatAddress
from tests.fakes.speech import ogg_opus

DATA = Path(__file__).parents[1] / "data" / "matrix"
NOW = datetime(2025, 11, 29, 5, 0, 1, tzinfo=UTC)
ME = Me("@herald:herald.test", "Herald")
DM = RoomView("!dm:herald.test", members=2)
GROUP = RoomView("!group:herald.test", members=3)


def event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return loaded


def config(**changes: Any) -> MatrixConfig:
    return MatrixConfig.model_validate(
        {
            "homeserver": "https://matrix.example.org",
            "user_id": ME.user_id,
            "access_token": "syt_secret",
            **changes,
        }
    )


def convert(name: str, room: RoomView = DM, **changes: Any) -> Incoming[MediaRef] | Skipped:
    return to_inbound(
        event(name),
        room=room,
        me=ME,
        account=AccountId("default"),
        config=config(**changes),
        now=NOW,
    )


def test_a_direct_message() -> None:
    incoming = convert("dm_text")
    assert isinstance(incoming, Incoming)
    message = incoming.message
    assert message.text == "hello **there**"
    assert message.is_direct
    assert message.chat_id == DM.room_id
    assert message.sender.id == "@ann:herald.test"
    assert split_event_key(message.platform_message_id) == (
        DM.room_id,
        event("dm_text")["event_id"],
    )


def test_in_a_group_only_a_mention_reaches_the_agent() -> None:
    mentioned = convert("group_mention", GROUP)
    assert isinstance(mentioned, Incoming)
    assert mentioned.message.mentions_bot
    assert not mentioned.message.is_direct
    assert convert("group_chatter", GROUP) == Skipped(NOT_ADDRESSED)
    # A room listed in `rooms` is answered without a mention.
    assert isinstance(convert("group_chatter", GROUP, rooms=[GROUP.room_id]), Incoming)


def test_the_display_name_in_the_text_is_a_mention() -> None:
    chatter = event("group_chatter")
    chatter["content"] = {"msgtype": "m.text", "body": "herald can you help"}
    incoming = to_inbound(
        chatter, room=GROUP, me=ME, account=AccountId("a"), config=config(), now=NOW
    )
    assert isinstance(incoming, Incoming)
    assert incoming.message.mentions_bot


def test_a_thread_is_its_own_session() -> None:
    incoming = convert("thread")
    assert isinstance(incoming, Incoming)
    assert incoming.message.thread_id == "$root1"
    assert incoming.message.reply_to is None  # the fallback reply is not a reply
    assert incoming.message.session_key.endswith(":$root1")


def test_a_reply_quotes_the_replied_text() -> None:
    incoming = convert("reply")
    assert isinstance(incoming, Incoming)
    assert incoming.message.text == (
        "[replying to: the earlier words\nover two lines]\nand my answer"
    )
    assert incoming.message.reply_to == f"{DM.room_id}:$earlier"


def test_a_picture_is_a_file_to_download_unless_too_large() -> None:
    incoming = convert("image")
    assert isinstance(incoming, Incoming)
    assert incoming.files == (MediaRef("mxc://herald.test/AbCdEf", "image/png", 2048, "cat.png"),)
    refused = convert("image", attachment_max_bytes=1000)
    assert isinstance(refused, Incoming)
    assert refused.files == ()
    assert "not downloaded: larger than 1000 bytes" in refused.message.text


def test_edits_old_messages_and_our_own_are_skipped() -> None:
    assert isinstance(convert("edit"), Skipped)  # an edit without the event it replaces
    old = event("dm_text")
    stamp = NOW - timedelta(hours=2)
    old["origin_server_ts"] = int(stamp.timestamp() * 1000)
    assert isinstance(
        to_inbound(old, room=DM, me=ME, account=AccountId("a"), config=config(), now=NOW),
        Skipped,
    )
    own = {**event("dm_text"), "sender": ME.user_id}
    assert to_inbound(
        own, room=DM, me=ME, account=AccountId("a"), config=config(), now=NOW
    ) == Skipped("our own event")


def test_markdown_becomes_sanitised_html_with_a_plain_body() -> None:
    content = text_content(
        "**bold** <script>alert(1)</script> [x](javascript:alert(1))", markdown=True
    )
    assert content["body"].startswith("**bold**")
    assert content["format"] == "org.matrix.custom.html"
    html = content["formatted_body"]
    assert "<strong>bold</strong>" in html
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    assert 'href="javascript' not in html
    assert "format" not in text_content("just words", markdown=True)
    assert to_html("a\nb") == "<p>a<br />\nb</p>"


def test_an_edit_replaces_the_target_and_keeps_a_fallback() -> None:
    new = text_content("**done**", markdown=True)
    edit = edit_content("$target", new)
    assert edit["m.relates_to"] == {"rel_type": "m.replace", "event_id": "$target"}
    assert edit["m.new_content"]["body"] == "**done**"
    assert edit["body"] == "* **done**"


def test_a_reply_and_a_thread_relation() -> None:
    threaded = text_content("x", markdown=False, thread="$root", reply_to="$msg")
    assert threaded["m.relates_to"] == {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": False,
        "m.in_reply_to": {"event_id": "$msg"},
    }
    reply = text_content("x", markdown=False, reply_to="$msg")
    assert reply["m.relates_to"] == {"m.in_reply_to": {"event_id": "$msg"}}


def test_an_event_too_large_for_html_goes_plain() -> None:
    content = text_content("**x** " * 10, markdown=True)
    plain = within_event_limit(content, 70_000)  # as if it measured that much
    assert "formatted_body" not in plain
    assert plain["body"] == content["body"]
    assert within_event_limit(content, 1_000) is content


@pytest.mark.parametrize(
    ("errcode", "status", "kind"),
    [
        ("M_LIMIT_EXCEEDED", 429, RateLimited),
        ("M_UNKNOWN_TOKEN", 401, AuthError),
        ("M_FORBIDDEN", 403, PermanentSendError),
        ("M_NOT_FOUND", 404, PermanentSendError),
        ("M_UNKNOWN", 502, NotReady),
        (None, None, NotReady),
    ],
)
def test_errors(errcode: str | None, status: int | None, kind: type[Exception]) -> None:
    error = error_from(errcode, "why", status=status, retry_after_ms=2500, doing="send")
    assert type(error) is kind
    if isinstance(error, RateLimited):
        assert error.retry_after == 2.5


def test_targets_name_a_room_and_maybe_a_thread() -> None:
    assert SPEC.parse_target is not None
    assert SPEC.parse_target("matrix", "!abc:example.org") == ChatAddress("!abc:example.org")
    assert SPEC.parse_target("matrix", "!abc:example.org:$root") == ChatAddress(
        "!abc:example.org", "$root"
    )
    # Room version 12 ids (Synapse's default now) name no server.
    hydra = "!S5MF42fUEqcVJhmL8UCPFC6o5vbll4dxz8xbDVv4BnA"
    assert SPEC.parse_target("matrix", hydra) == ChatAddress(hydra)
    assert SPEC.parse_target("matrix", f"{hydra}:$root") == ChatAddress(hydra, "$root")
    for bad in ("abc", "!", "!a$b"):
        with pytest.raises(ValueError, match="matrix:!room:server"):
            SPEC.parse_target("matrix", bad)


def test_buttons_are_offered_as_reactions() -> None:
    buttons = (
        Button("✅ Approve", "/approve 3"),
        Button("❌ Deny", "/deny 3"),
        Button("Other", "/stop"),
    )
    assert button_reactions(buttons) == {"✅": "/approve 3", "❌": "/deny 3"}
    # Whatever the label, the reactions are those the gateway reads as approve and deny.
    assert button_reactions((Button("Approve", "/approve 3"),)) == {"✅": "/approve 3"}
    content = with_buttons(text_content("**Run it?**", markdown=True), buttons)
    assert content["body"].endswith("React ✅ Approve, ❌ Deny (or send the command).")
    assert content["formatted_body"].endswith("</p>")
    assert with_buttons({"body": "x"}, (Button("Other", "/stop"),)) == {"body": "x"}


def reaction_event(key: str, sender: str = "@ann:herald.test", rel: str = "m.annotation") -> Any:
    relation = {"rel_type": rel, "event_id": "$q", "key": key}
    return {
        "type": "m.reaction",
        "sender": sender,
        "event_id": "$r",
        "origin_server_ts": 1764392400000,
        "content": {"m.relates_to": relation},
    }


def test_a_reaction_is_a_reaction_to_the_event_it_annotates() -> None:
    def react(event: Any, room: RoomView = DM) -> Reaction | Skipped:
        return reaction_from(event, room=room, me=ME, account=AccountId("a"), now=NOW)

    reaction = react(reaction_event("👍"))
    assert isinstance(reaction, Reaction)
    assert (reaction.message, reaction.emoji, reaction.event_id) == (f"{DM.room_id}:$q", "👍", "$r")
    assert (reaction.chat_id, reaction.sender.id, reaction.is_direct) == (
        DM.room_id,
        "@ann:herald.test",
        True,
    )
    assert reaction.received_at == datetime(2025, 11, 29, 5, 0, tzinfo=UTC)
    grouped = react(reaction_event("👍"), GROUP)
    assert isinstance(grouped, Reaction)
    assert not grouped.is_direct
    assert react(reaction_event("👀", ME.user_id)) == Skipped("our own event")
    assert isinstance(react(reaction_event("👍", rel="m.reference")), Skipped)
    assert isinstance(react(reaction_event("")), Skipped)


def edit_of(original: dict[str, Any], body: str, **changes: Any) -> dict[str, Any]:
    new = {"msgtype": "m.text", "body": body}
    return {
        "type": "m.room.message",
        "sender": original["sender"],
        "event_id": "$edit1",
        "origin_server_ts": 1764392401000,
        "content": {
            "msgtype": "m.text",
            "body": f"* {body}",
            "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": original["event_id"]},
        },
        **changes,
    }


def convert_edit(
    edit: dict[str, Any], original: dict[str, Any] | None, room: RoomView = DM
) -> Incoming[MediaRef] | Skipped:
    return to_inbound(
        edit, room=room, me=ME, account=AccountId("a"), config=config(), now=NOW, original=original
    )


def test_an_edit_is_its_new_content_naming_the_original() -> None:
    original = event("dm_text")
    incoming = convert_edit(edit_of(original, "hello again"), original)
    assert isinstance(incoming, Incoming)
    message = incoming.message
    key = f"{DM.room_id}:{original['event_id']}"
    assert message.text == "hello again"
    assert message.edit_of == key
    assert message.platform_message_id == f"{key}:e1764392401000"
    # The edit's key names the original event (the working reaction goes on it).
    assert split_event_key(message.platform_message_id) == (DM.room_id, original["event_id"])
    # The recorded edit, read with the event it replaces.
    recorded = convert_edit(event("edit"), original)
    assert isinstance(recorded, Incoming)
    assert recorded.message.text == "fixed"
    assert recorded.message.edit_of == key


def test_an_edit_in_a_thread_stays_in_the_thread() -> None:
    original = event("thread")
    incoming = convert_edit(edit_of(original, "in the thread, fixed"), original)
    assert isinstance(incoming, Incoming)
    assert incoming.message.thread_id == "$root1"
    assert incoming.message.edit_of == f"{DM.room_id}:$thread1"


def test_edits_that_are_not_the_writers_own_are_skipped() -> None:
    original = event("dm_text")
    forged = edit_of(original, "bob's words", sender="@bob:herald.test")
    assert convert_edit(forged, original) == Skipped(
        "an edit by someone other than the message's sender"
    )
    # Herald's own edits (its streamed previews) never come back as messages.
    own = {**original, "sender": ME.user_id}
    assert convert_edit(edit_of(own, "streamed"), own) == Skipped("our own event")
    # Not a message, an edit of an edit, another event than the one named, none at all.
    state = {**original, "type": "m.room.topic"}
    assert isinstance(convert_edit(edit_of(original, "x"), state), Skipped)
    twice = edit_of(original, "x")
    assert isinstance(convert_edit(edit_of({**twice, "event_id": "$e2"}, "y"), twice), Skipped)
    other = {**original, "event_id": "$other"}
    assert isinstance(convert_edit(edit_of(original, "x"), other), Skipped)
    no_new = edit_of(original, "x")
    del no_new["content"]["m.new_content"]
    assert isinstance(convert_edit(no_new, original), Skipped)


def test_keys_with_suffixes_split_to_the_event_they_name() -> None:
    room = "!abc:example.org:8448"
    assert split_event_key(f"{room}:$ev") == (room, "$ev")
    assert split_event_key(f"{room}:$ev:e17") == (room, "$ev")
    assert split_event_key(f"{room}:$ev:r$reaction") == (room, "$ev")
    assert split_event_key("!hydra:$ev:e17") == ("!hydra", "$ev")  # room version 12: no server
    assert split_event_key("!abc:example.org") is None
    assert split_event_key("abc:$ev") is None


def test_a_voice_reply_is_an_audio_event_clients_play_as_a_voice_message() -> None:
    audio = ogg_opus("spoken")
    content = voice_content(
        "mxc://hs/abc",
        size=len(audio),
        mime_type="audio/ogg",
        filename="voice.ogg",
        duration_ms=1500,
    )
    assert content["msgtype"] == "m.audio"
    assert content["org.matrix.msc3245.voice"] == {}
    assert content["org.matrix.msc1767.audio"] == {"duration": 1500}
    assert content["info"] == {"mimetype": "audio/ogg", "size": len(audio), "duration": 1500}
    assert (content["body"], content["url"]) == (VOICE_BODY, "mxc://hs/abc")
    unknown = voice_content(
        "mxc://hs/abc", size=1, mime_type="audio/ogg", filename="v", duration_ms=None
    )
    assert unknown["org.matrix.msc1767.audio"] == {}
    assert "duration" not in unknown["info"]


def test_the_length_of_an_ogg_opus_stream() -> None:
    audio = bytearray(ogg_opus("spoken"))
    assert ogg_duration_ms(bytes(audio)) is None  # the fake's pages say no position
    last = audio.rfind(b"OggS")
    head = audio.find(b"OpusHead")
    pre_skip = int.from_bytes(audio[head + 10 : head + 12], "little")
    audio[last + 6 : last + 14] = (pre_skip + 96_000).to_bytes(8, "little")
    assert ogg_duration_ms(bytes(audio)) == 2000
    assert ogg_duration_ms(b"not audio") is None


def test_a_voice_message_gets_a_name_with_its_extension() -> None:
    voice = {
        "type": "m.room.message",
        "sender": "@ann:herald.test",
        "event_id": "$v",
        "origin_server_ts": 1764392400000,
        "content": {
            "msgtype": "m.audio",
            "body": "Voice message",
            "url": "mxc://herald.test/v",
            "info": {"mimetype": "audio/ogg", "size": 2000},
            "org.matrix.msc3245.voice": {},
        },
    }
    incoming = to_inbound(voice, room=DM, me=ME, account=AccountId("a"), config=config(), now=NOW)
    assert isinstance(incoming, Incoming)
    assert incoming.files == (
        MediaRef("mxc://herald.test/v", "audio/ogg", 2000, "Voice message.ogg"),
    )
    assert incoming.message.text == ""


@pytest.mark.parametrize("stamp", [2**53 - 1, -(2**53) + 1, 1e300])
def test_a_timestamp_out_of_range_is_read_as_now(stamp: float) -> None:
    # A remote server sets origin_server_ts; one absurd value must not stop the /sync loop
    # (the batch would be read again and fail again, for ever).
    crafted = {**event("dm_text"), "origin_server_ts": stamp}
    got = to_inbound(crafted, room=DM, me=ME, account=AccountId("a"), config=config(), now=NOW)
    assert isinstance(got, Incoming | Skipped)


def test_answers_mention_nobody() -> None:
    # An empty m.mentions turns off the body-based push rules: an answer quoting "@room" or a
    # member's name pings no one.
    for content in (
        text_content("@room look", markdown=True),
        text_content("**@room**", markdown=True),
        text_content("Ann said so", markdown=False),
    ):
        assert content["m.mentions"] == {}
    edit = edit_content("$t", text_content("@room", markdown=True))
    assert edit["m.mentions"] == {}
    assert edit["m.new_content"]["m.mentions"] == {}


def test_images_in_markdown_are_links_not_fetched_pictures() -> None:
    # The spec's <img> takes mxc:// only; an http(s) or data: picture would be fetched by
    # some clients (a tracker an answer could carry).
    html = to_html("![pixel](https://evil.example/p.png) ![d](data:image/png;base64,AAAA)")
    assert "<img" not in html
    assert '<a href="https://evil.example/p.png">pixel</a>' in html
    assert "src=" not in html
    assert 'href="data:' not in html
    assert to_html("[![i](https://e/i.png)](https://e/l)") == '<p><a href="https://e/l">i</a></p>'


@pytest.mark.parametrize(
    "url",
    ["mxc://../..", "mxc://herald.test/..", "mxc://herald.test/a/../../x", "mxc://h/a?b", "mxc://"],
)
def test_a_malformed_media_uri_is_not_downloaded(url: str) -> None:
    crafted = event("image")
    crafted["content"] = {**crafted["content"], "url": url}
    got = to_inbound(crafted, room=DM, me=ME, account=AccountId("a"), config=config(), now=NOW)
    assert isinstance(got, Incoming)
    assert got.files == ()


def test_only_the_specs_link_schemes_become_links() -> None:
    html = to_html("[a](data:image/png;base64,AA) [b](ms-msdt:/id) [c](/rel) [d](HTTPS://x)")
    assert html.count("<a ") == 1
    assert '<a href="HTTPS://x">d</a>' in html
    assert "mailto:a@b.c" in to_html("<mailto:a@b.c>")


def test_a_relation_to_no_valid_event_id_is_left_out() -> None:
    # Relation ids are the sender's to write: a 6 KB "thread root" became the session key,
    # which PostgreSQL cannot index, so the inbox commit failed on every read of the batch.
    huge = "$" + "x9" * 3000
    thread = event("thread")
    thread["content"]["m.relates_to"]["event_id"] = huge
    got = to_inbound(thread, room=DM, me=ME, account=AccountId("a"), config=config(), now=NOW)
    assert isinstance(got, Incoming)
    assert got.message.thread_id is None
    reply = event("reply")
    reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] = huge
    got = to_inbound(reply, room=DM, me=ME, account=AccountId("a"), config=config(), now=NOW)
    assert isinstance(got, Incoming)
    assert got.message.reply_to is None
    # A reaction to such an id is not looked up (a 6 KB URL the homeserver would refuse).
    relation = {"rel_type": "m.annotation", "event_id": huge, "key": "✅"}
    assert reaction_of({"type": "m.reaction", "content": {"m.relates_to": relation}}) is None
    for bad in (huge, "not-an-event", "$with space"):
        thread["content"]["m.relates_to"]["event_id"] = bad
        got = to_inbound(thread, room=DM, me=ME, account=AccountId("a"), config=config(), now=NOW)
        assert isinstance(got, Incoming)
        assert got.message.thread_id is None


def test_the_inviter_is_the_sender_of_the_invite_itself() -> None:
    # The stripped state before the invite is what the inviting server claims: a forged
    # member event there must not make an allowed person the inviter.
    def member(sender: str) -> dict[str, Any]:
        return {
            "type": "m.room.member",
            "state_key": ME.user_id,
            "sender": sender,
            "content": {"membership": "invite"},
        }

    name = {"type": "m.room.name", "state_key": "", "sender": "@x:evil.test", "content": {}}
    forged = [member("@ann:herald.test"), name, member("@eve:evil.test")]
    assert inviter_of(forged, ME) == "@eve:evil.test"
    assert inviter_of([name], ME) is None


def test_a_plain_message_in_an_encrypted_room_is_not_answered_in_the_clear() -> None:
    encrypted = RoomView("!secret:herald.test", members=2, encrypted=True)
    got = convert("dm_text", encrypted)
    assert isinstance(got, Skipped)


def test_a_homeserver_with_an_api_path_is_refused_with_the_base_to_write() -> None:
    with pytest.raises(ValueError, match=r"'https://matrix\.example\.org'"):
        config(homeserver="https://matrix.example.org/_matrix/client/v3")
    assert config(homeserver="https://example.org/matrix/").homeserver
