"""Session keys: `platform:account:chat[:thread]`, plus `:u=<sender>` when a session is one
person's. Pure: `derive_session_key` on hand-built messages."""

from __future__ import annotations

import random
import string

import pytest

from gateway.contracts.config import GroupSessions
from gateway.contracts.messages import InboundMessage
from gateway.sessions import derive_session_key
from tests.fakes.platform import inbound

pytestmark = pytest.mark.timeout(60)

# Ids as platforms hand them out: digits (Telegram, Discord), letters (Slack), e-mail addresses
# and phone numbers. No colon: see the last test for ids that contain the key's separator.
ID_ALPHABET = string.ascii_letters + string.digits + "-_.@+="


@pytest.mark.parametrize("groups", list(GroupSessions))
def test_a_dm_in_the_senders_own_chat_is_keyed_by_the_chat(groups: GroupSessions) -> None:
    message = inbound("hi", chat="123", sender="123", direct=True)

    assert derive_session_key(message, groups) == "test:acct:123"


@pytest.mark.parametrize("groups", list(GroupSessions))
def test_a_dm_whose_chat_id_is_not_the_senders_gets_the_sender_suffix(
    groups: GroupSessions,
) -> None:
    message = inbound("hi", chat="D42", sender="alice", direct=True)

    assert derive_session_key(message, groups) == "test:acct:D42:u=alice"


def test_the_account_names_the_key() -> None:
    message = inbound("hi", chat="123", account="work")

    assert derive_session_key(message, GroupSessions.CHAT) == "test:work:123"


def test_a_group_has_one_session_per_chat_by_default() -> None:
    alice = inbound("hi", chat="g1", sender="alice", direct=False)
    bob = inbound("hi", chat="g1", sender="bob", direct=False)

    keys = {derive_session_key(m, GroupSessions.CHAT) for m in (alice, bob)}

    assert keys == {"test:acct:g1"}


def test_a_group_configured_per_user_has_one_session_per_sender() -> None:
    alice = inbound("hi", chat="g1", sender="alice", direct=False)
    bob = inbound("hi", chat="g1", sender="bob", direct=False)

    assert derive_session_key(alice, GroupSessions.USER) == "test:acct:g1:u=alice"
    assert derive_session_key(bob, GroupSessions.USER) == "test:acct:g1:u=bob"


def test_a_thread_is_its_own_session() -> None:
    in_thread = inbound("hi", chat="g1", sender="alice", direct=False, thread="t9")
    outside = inbound("hi", chat="g1", sender="alice", direct=False)

    assert derive_session_key(in_thread, GroupSessions.CHAT) == "test:acct:g1:t9"
    assert derive_session_key(in_thread, GroupSessions.USER) == "test:acct:g1:t9:u=alice"
    assert derive_session_key(outside, GroupSessions.CHAT) == "test:acct:g1"


def test_a_thread_in_a_dm() -> None:
    own = inbound("hi", chat="123", sender="123", thread="7")
    other = inbound("hi", chat="D42", sender="alice", thread="7")

    assert derive_session_key(own, GroupSessions.CHAT) == "test:acct:123:7"
    assert derive_session_key(other, GroupSessions.CHAT) == "test:acct:D42:7:u=alice"


def test_a_group_and_a_dm_with_the_same_id_are_different_sessions_per_user() -> None:
    # A DM whose chat id is not the sender's and a per-user group session are both suffixed;
    # they only coincide when chat and sender coincide, which is the same person in that chat.
    dm = inbound("hi", chat="c1", sender="alice", direct=True)
    group = inbound("hi", chat="c1", sender="bob", direct=False)

    assert derive_session_key(dm, GroupSessions.USER) != derive_session_key(
        group, GroupSessions.USER
    )


def _random_id(rng: random.Random) -> str:
    return "".join(rng.choice(ID_ALPHABET) for _ in range(rng.randint(1, 6)))


@pytest.mark.parametrize("groups", list(GroupSessions))
def test_dms_of_two_different_people_never_share_a_key(groups: GroupSessions) -> None:
    """Property over random ids (seeded, so a failure reproduces): short ids drawn from a
    small alphabet make equal chats, equal senders and prefixes of each other common."""
    rng = random.Random(20240611)
    for _ in range(20_000):
        sender_a, sender_b = _random_id(rng), _random_id(rng)
        if sender_a == sender_b:
            continue
        # Half the time a DM's chat is the sender's own id (Telegram); otherwise any id.
        chat_a = sender_a if rng.random() < 0.5 else _random_id(rng)
        chat_b = sender_b if rng.random() < 0.5 else rng.choice([chat_a, _random_id(rng)])
        thread_a = None if rng.random() < 0.7 else str(rng.randint(1, 3))
        thread_b = None if rng.random() < 0.7 else str(rng.randint(1, 3))
        a = inbound("hi", chat=chat_a, sender=sender_a, direct=True, thread=thread_a)
        b = inbound("hi", chat=chat_b, sender=sender_b, direct=True, thread=thread_b)

        key_a, key_b = derive_session_key(a, groups), derive_session_key(b, groups)

        assert key_a != key_b, (a, b)


def test_the_same_person_keeps_one_dm_session() -> None:
    first = inbound("hi", chat="D42", sender="alice")
    second = inbound("again", chat="D42", sender="alice")

    assert derive_session_key(first, GroupSessions.CHAT) == derive_session_key(
        second, GroupSessions.CHAT
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(
            # Alice in her own DM chat, in a thread whose id is `u=bob`; Bob in a DM chat that
            # is named `alice` (a platform where DM chats have ids of their own).
            inbound("hi", chat="alice", sender="alice", thread="u=bob"),
            inbound("hi", chat="alice", sender="bob"),
            id="thread-looks-like-suffix",
        ),
        pytest.param(
            # Twilio-style addresses contain a colon: `whatsapp:+1555` in its own chat, and
            # `whatsapp` in its own chat, in thread `+1555`.
            inbound("hi", chat="whatsapp:+1555", sender="whatsapp:+1555"),
            inbound("hi", chat="whatsapp", sender="whatsapp", thread="+1555"),
            id="colon-in-chat-id",
        ),
    ],
)
def test_ids_containing_the_key_separator_cannot_merge_two_peoples_dms(
    a: InboundMessage, b: InboundMessage
) -> None:
    """derive_session_key promises no shared DM session "whatever the platform's chat ids
    look like"; no component of the key is escaped, so ids containing `:` can collide."""
    assert a.sender.id != b.sender.id

    assert derive_session_key(a, GroupSessions.CHAT) != derive_session_key(b, GroupSessions.CHAT)
