"""Lone surrogates (valid JSON escapes, refused by every UTF-8 encoder) become U+FFFD before
an inbound message is stored; a message without any is passed through untouched."""

from __future__ import annotations

import dataclasses

from gateway.contracts.ids import ChatId
from gateway.storable import clean, storable
from tests.fakes.platform import inbound


def test_clean_replaces_lone_surrogates_and_keeps_the_type() -> None:
    assert clean("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert clean("😀 fine") == "😀 fine"
    chat = ChatId("c\ud800")
    assert clean(chat) == "c\ufffd"


def test_storable_cleans_every_text_and_the_payload() -> None:
    message = inbound("hi \ud800", chat="c\udc00", name="Ann \ud83d")
    message = dataclasses.replace(message, raw={"text": ["hi \ud800", 1]})
    cleaned = storable(message)
    assert cleaned.text == "hi \ufffd"
    assert cleaned.chat_id == "c\ufffd"
    assert cleaned.sender.display_name == "Ann \ufffd"
    assert cleaned.raw == {"text": ["hi \ufffd", 1]}
    assert cleaned.platform_message_id == message.platform_message_id


def test_a_clean_message_is_the_same_object() -> None:
    message = inbound("hello")
    assert storable(message) is message
