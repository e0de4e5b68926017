"""Access control, session separation and identity linking, through the real session manager
and store (on SQLite and PostgreSQL).

Absence of a reply is checked in the outbox: a pairing reply is enqueued in the same
transaction that records the rejection, so once `accept` returns, the outbox holds every
notice the message will ever cause. Absence of a turn is checked after a later "barrier"
message has been answered: lanes run in order, so a turn that would exist has run by then.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from agent_core.memory import FolderDocs, MemoryFiles, MemoryScope, person
from gateway.access import CODE_ALPHABET, CODE_LENGTH, Access, Pairings
from gateway.config import AccessConfig
from gateway.contracts.config import GroupSessions, PlatformSection
from gateway.contracts.history import Role
from gateway.contracts.ids import SessionKey, UserId
from gateway.contracts.messages import utcnow
from gateway.cron.service import JobService, JobSpec
from gateway.store import Store
from gateway.store.inbox import Outcome
from gateway.store.jobs import JobStore
from gateway.store.outbox import OutboxRow
from gateway.store.tables import pairings, users
from tests.fakes.platform import inbound
from tests.integration.rig import Rig, outcomes, running_rig

pytestmark = pytest.mark.timeout(60)

CODE = re.compile(rf"pairing code is ([{CODE_ALPHABET}]{{{CODE_LENGTH}}})\b")
ALLOW_ALICE = PlatformSection(account="acct", allowed_users=("alice",))
"""Only `alice` is on the allowlist; everyone else is a stranger."""
EVERYONE = AccessConfig(pairing_reply_interval=0)
"""Pairing replies on every message, so each test sees each reply."""


def code_in(text: str) -> str:
    """The pairing code a reply carries."""
    match = CODE.search(text)
    assert match is not None, text
    return match[1]


async def notices(rig: Rig, chat: str) -> list[OutboxRow]:
    """Everything queued for a chat, oldest first."""
    rows = await rig.outbox.list(limit=1000)
    return [r for r in reversed(rows) if r.target.chat_id == chat]


async def answered(rig: Rig, chat: str, text: str, *, group_sender: str | None = None) -> None:
    """Send an allowed message (in a DM, or in a group from `group_sender`) and wait for its
    answer: a barrier for everything before."""
    if group_sender is None:
        await rig.manager.accept(inbound(text, chat=chat))
        expected = f"answer to {text}"
    else:
        await rig.manager.accept(inbound(text, chat=chat, sender=group_sender, direct=False))
        expected = f"answer to [{group_sender}] {text}"
    await rig.adapter.wait_for(lambda d: any(x.text == expected for x in d))


def llm_texts(rig: Rig) -> list[str]:
    """Every message content any LLM call has seen."""
    return [m.content for call in rig.llm.calls for m in call]


async def pending_count(store: Store) -> int:
    async with store.read() as conn:
        value = await conn.scalar(select(func.count()).select_from(pairings))
    return int(value or 0)


# allowlists -------------------------------------------------------------------------------------


async def test_a_listed_sender_is_answered(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, gated=False) as rig:
        await rig.manager.accept(inbound("hello", chat="alice"))

        delivered = await rig.adapter.wait_for(lambda d: len(d) >= 1)
        assert [(d.chat_id, d.text) for d in delivered] == [("alice", "answer to hello")]
        rows = await rig.settled("test:acct:alice", 1)
        assert outcomes(rows) == [("hello", Outcome.ANSWERED)]
        assert await Pairings(store).list(all_=True) == []


async def test_a_star_allows_everyone(store: Store, tmp_path: Path) -> None:
    section = PlatformSection(account="acct", allowed_users=("*",))
    async with running_rig(store, tmp_path, section=section, gated=False) as rig:
        await rig.manager.accept(inbound("from a stranger", chat="zed"))
        await rig.manager.accept(inbound("in a group", chat="g1", sender="yan", direct=False))

        await rig.adapter.wait_for(lambda d: len(d) >= 2)
        assert outcomes(await rig.settled("test:acct:zed", 1)) == [
            ("from a stranger", Outcome.ANSWERED)
        ]
        assert outcomes(await rig.settled("test:acct:g1", 1)) == [("in a group", Outcome.ANSWERED)]


async def test_an_unlisted_sender_in_a_dm_is_rejected_with_a_pairing_code(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, gated=False) as rig:
        await rig.manager.accept(inbound("let me in", chat="mallory", name="Mallory"))

        rows = await rig.rows("test:acct:mallory")
        assert outcomes(rows) == [("let me in", Outcome.REJECTED)]
        assert "not allowed" in (rows[0].outcome_detail or "")
        assert rows[0].turn_id is None
        delivered = await rig.adapter.wait_for(lambda d: len(d) >= 1)
        assert [d.chat_id for d in delivered] == ["mallory"]
        assert delivered[0].key == f"pair:{rows[0].id}"
        code = code_in(delivered[0].text)
        assert len(code) == CODE_LENGTH
        assert set(code) <= set(CODE_ALPHABET)
        assert f"herald pairing approve {code}" in delivered[0].text
        (pairing,) = await Pairings(store).list()
        assert (pairing.code, pairing.platform, pairing.account) == (code, "test", "acct")
        assert (pairing.external_id, pairing.chat_id) == ("mallory", "mallory")
        assert pairing.display_name == "Mallory"
        assert pairing.status == "pending"
        ttl = (pairing.expires_at - pairing.created_at).total_seconds()
        assert ttl == pytest.approx(AccessConfig().pairing_ttl)

        await answered(rig, "alice", "barrier")
        assert "let me in" not in " ".join(llm_texts(rig))
        assert await store.get_session(SessionKey("test:acct:mallory")) is None


async def test_a_strangers_command_is_rejected_too(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, gated=False) as rig:
        await rig.manager.accept(inbound("/status", chat="mallory"))

        rows = await rig.rows("test:acct:mallory")
        assert outcomes(rows) == [("/status", Outcome.REJECTED)]
        (notice,) = await notices(rig, "mallory")
        code_in(notice.text)  # a pairing reply, not the status
        assert "Session" not in notice.text


async def test_a_second_message_within_the_reply_interval_gets_no_second_reply(
    store: Store, tmp_path: Path
) -> None:
    access = AccessConfig(pairing_reply_interval=600)
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, access=access, gated=False) as rig:
        await rig.manager.accept(inbound("one", chat="mallory"))
        await rig.manager.accept(inbound("two", chat="mallory"))

        rows = await rig.rows("test:acct:mallory")
        assert outcomes(rows) == [("one", Outcome.REJECTED), ("two", Outcome.REJECTED)]
        assert "recently" in (rows[1].outcome_detail or "")
        assert [n.idempotency_key for n in await notices(rig, "mallory")] == [f"pair:{rows[0].id}"]
        assert await pending_count(store) == 1


async def test_with_no_reply_interval_the_same_code_is_resent(store: Store, tmp_path: Path) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        await rig.manager.accept(inbound("one", chat="mallory"))
        await rig.manager.accept(inbound("two", chat="mallory"))

        delivered = await rig.adapter.wait_for(lambda d: len(d) >= 2)
        first, second = (code_in(d.text) for d in delivered)
        assert first == second
        assert [p.code for p in await Pairings(store).list(all_=True)] == [first]
        rows = await rig.rows("test:acct:mallory")
        assert outcomes(rows) == [("one", Outcome.REJECTED), ("two", Outcome.REJECTED)]


async def test_at_most_max_pending_codes_per_platform(store: Store, tmp_path: Path) -> None:
    access = AccessConfig(max_pending_pairings=3, pairing_reply_interval=0)
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, access=access, gated=False) as rig:
        for stranger in ("s1", "s2", "s3"):
            await rig.manager.accept(inbound("hi", chat=stranger))
        await rig.manager.accept(inbound("hi", chat="s4"))

        (late,) = await notices(rig, "s4")
        assert "try again later" in late.text
        assert CODE.search(late.text) is None
        rows = await rig.rows("test:acct:s4")
        assert outcomes(rows) == [("hi", Outcome.REJECTED)]
        assert "too many" in (rows[0].outcome_detail or "")
        listed = await Pairings(store).list(all_=True)
        assert sorted(p.external_id for p in listed) == ["s1", "s2", "s3"]
        # The strangers who hold codes keep getting theirs.
        await rig.manager.accept(inbound("again", chat="s1"))
        resent = (await notices(rig, "s1"))[-1]
        assert code_in(resent.text) == next(p.code for p in listed if p.external_id == "s1")

        # A decision frees a place.
        await Pairings(store).approve(next(p.code for p in listed if p.external_id == "s2"))
        await rig.manager.accept(inbound("hi again", chat="s4"))
        code_in((await notices(rig, "s4"))[-1].text)
        assert len(await Pairings(store).list()) == 3


async def test_the_pending_limit_is_per_platform_not_per_chat_or_sender(
    store: Store, tmp_path: Path
) -> None:
    access = AccessConfig(max_pending_pairings=1, pairing_reply_interval=0)
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, access=access, gated=False) as rig:
        await rig.manager.accept(inbound("hi", chat="s1"))
        await rig.manager.accept(inbound("hi", chat="D9", sender="s2"))

        (late,) = await notices(rig, "D9")
        assert "try again later" in late.text
        assert await pending_count(store) == 1


async def expire_all(store: Store) -> None:
    async with store.write() as conn:
        await conn.execute(update(pairings).values(expires_at=utcnow() - timedelta(seconds=1)))


async def test_expired_codes_do_not_count_and_cannot_be_approved(
    store: Store, tmp_path: Path
) -> None:
    access = AccessConfig(max_pending_pairings=1, pairing_reply_interval=0)
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, access=access, gated=False) as rig:
        await rig.manager.accept(inbound("hi", chat="s1"))
        (old,) = await Pairings(store).list()
        await expire_all(store)
        assert await Pairings(store).list() == []

        await rig.manager.accept(inbound("hi", chat="s2"))
        (issued,) = await notices(rig, "s2")
        new = code_in(issued.text)
        with pytest.raises(LookupError, match=r"expired|no pending"):
            await Pairings(store).approve(old.code)

        # The expired code's sender asks again: a fresh code, once a place is free.
        await Pairings(store).approve(new)
        await rig.manager.accept(inbound("hi again", chat="s1"))
        fresh = code_in((await notices(rig, "s1"))[-1].text)
        assert fresh != old.code
        statuses = {p.code: p.status for p in await Pairings(store).list(all_=True)}
        assert statuses == {old.code: "expired", new: "approved", fresh: "pending"}
        rows = await rig.rows("test:acct:s1")
        assert [r.outcome for r in rows] == [Outcome.REJECTED, Outcome.REJECTED]


async def test_a_tiny_ttl_code_cannot_be_approved(store: Store, tmp_path: Path) -> None:
    # Expired the moment it is written: no sleeping needed to see it expire.
    access = AccessConfig(pairing_ttl=1e-6, pairing_reply_interval=0)
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, access=access, gated=False) as rig:
        await rig.manager.accept(inbound("hi", chat="s1"))
        (notice,) = await notices(rig, "s1")
        code = code_in(notice.text)

        assert await Pairings(store).list() == []
        with pytest.raises(LookupError):
            await Pairings(store).approve(code)
        await rig.manager.accept(inbound("still me", chat="s1"))
        assert outcomes(await rig.rows("test:acct:s1"))[-1] == ("still me", Outcome.REJECTED)


async def test_an_unknown_sender_in_a_group_is_ignored_silently(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        await rig.manager.accept(inbound("hey bot", chat="g1", sender="mallory", direct=False))

        rows = await rig.rows("test:acct:g1")
        assert outcomes(rows) == [("hey bot", Outcome.REJECTED)]
        assert await notices(rig, "g1") == []
        assert await Pairings(store).list(all_=True) == []

        # A listed member of the same group is answered, and the stranger's text never
        # reaches the model.
        await answered(rig, "g1", "hello", group_sender="alice")
        assert not any("hey bot" in t for t in llm_texts(rig))
        assert [d.text for d in rig.adapter.delivered] == ["answer to [alice] hello"]


async def test_an_unknown_bot_is_ignored(store: Store, tmp_path: Path) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        await rig.manager.accept(inbound("beep", chat="robo", is_bot=True))
        await rig.manager.accept(
            inbound("beep", chat="g1", sender="robo", is_bot=True, direct=False)
        )

        assert outcomes(await rig.rows("test:acct:robo")) == [("beep", Outcome.REJECTED)]
        assert outcomes(await rig.rows("test:acct:g1")) == [("beep", Outcome.REJECTED)]
        assert await notices(rig, "robo") == []
        assert await Pairings(store).list(all_=True) == []


async def test_bots_are_ignored_even_when_everyone_is_allowed(store: Store, tmp_path: Path) -> None:
    """`*` admits every person, not every bot: a bot in a group with `*` must not be
    answered, or two assistants in one group answer each other forever. (An operator who
    wants a particular bot can still list its id.)"""
    section = PlatformSection(account="acct", allowed_users=("*",))
    async with running_rig(store, tmp_path, section=section, gated=False) as rig:
        await rig.manager.accept(
            inbound("beep", chat="g1", sender="robo", is_bot=True, direct=False)
        )
        await answered(rig, "g2", "barrier", group_sender="alice")
        await rig.idle()

        rows = await rig.rows("test:acct:g1")
        assert outcomes(rows) == [("beep", Outcome.REJECTED)]
        assert rig.llm.started == ["[alice] barrier"]


async def test_without_pairing_a_stranger_gets_no_code(store: Store, tmp_path: Path) -> None:
    section = PlatformSection(account="acct", allowed_users=("alice",), pairing=False)
    async with running_rig(store, tmp_path, section=section, access=EVERYONE, gated=False) as rig:
        await rig.manager.accept(inbound("let me in", chat="mallory"))

        assert outcomes(await rig.rows("test:acct:mallory")) == [("let me in", Outcome.REJECTED)]
        assert await notices(rig, "mallory") == []
        assert await Pairings(store).list(all_=True) == []


# approve and revoke -----------------------------------------------------------------------------


async def pair(rig: Rig, chat: str) -> str:
    """Have stranger `chat` ask for access; the code they were sent."""
    await rig.manager.accept(inbound("let me in", chat=chat))
    return code_in((await notices(rig, chat))[-1].text)


async def test_an_approved_sender_is_answered(store: Store, tmp_path: Path) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        code = await pair(rig, "mallory")

        approved = await Pairings(store).approve(code.lower())  # typed by hand

        assert (approved.code, approved.status, approved.external_id) == (
            code,
            "approved",
            "mallory",
        )
        assert await Pairings(store).list() == []
        await answered(rig, "mallory", "now?")
        rows = await rig.settled("test:acct:mallory", 2)
        assert outcomes(rows) == [("let me in", Outcome.REJECTED), ("now?", Outcome.ANSWERED)]
        # Only the message sent after the approval reached the model.
        assert "let me in" not in llm_texts(rig)
        with pytest.raises(LookupError):
            await Pairings(store).approve(code)  # not pending any more


async def test_an_approved_sender_is_allowed_in_groups_too(store: Store, tmp_path: Path) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        await Pairings(store).approve(await pair(rig, "mallory"))

        await answered(rig, "g1", "hi all", group_sender="mallory")


async def test_may_fetch_answers_like_accept_decides_and_writes_nothing(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        manager = rig.manager
        assert await manager.may_fetch(inbound("file", chat="alice"))
        assert not await manager.may_fetch(inbound("file", chat="mallory"))
        in_group = inbound("file", chat="g1", sender="mallory", direct=False)
        assert not await manager.may_fetch(in_group)
        assert not await manager.may_fetch(inbound("file", chat="bot", sender="robot", is_bot=True))
        assert await pending_count(store) == 0  # asking wrote no pairing row
        assert await rig.rows("test:acct:mallory") == []

        await Pairings(store).approve(await pair(rig, "mallory"))
        assert await manager.may_fetch(inbound("file", chat="mallory"))
        await Pairings(store).revoke("test:mallory")
        assert not await manager.may_fetch(inbound("file", chat="mallory"))


@pytest.mark.parametrize("by", ["code", "platform:user_id"])
async def test_a_revoked_sender_is_rejected_again(store: Store, tmp_path: Path, by: str) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        code = await pair(rig, "mallory")
        await Pairings(store).approve(code)
        await answered(rig, "mallory", "in")

        revoked = await Pairings(store).revoke(code if by == "code" else "test:mallory")

        assert revoked >= 1
        await rig.manager.accept(inbound("still in?", chat="mallory"))
        rows = await rig.rows("test:acct:mallory")
        assert outcomes(rows)[-1] == ("still in?", Outcome.REJECTED)
        assert "still in?" not in llm_texts(rig)
        fresh = code_in((await notices(rig, "mallory"))[-1].text)
        assert fresh != code
        statuses = {p.code: p.status for p in await Pairings(store).list(all_=True)}
        assert statuses == {code: "revoked", fresh: "pending"}


async def test_revoking_a_pending_code_withdraws_it(store: Store, tmp_path: Path) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        code = await pair(rig, "mallory")

        await Pairings(store).revoke(code)

        assert await Pairings(store).list() == []
        with pytest.raises(LookupError):
            await Pairings(store).approve(code)


async def test_unknown_codes_and_identities_raise_lookup_error(store: Store) -> None:
    with pytest.raises(LookupError):
        await Pairings(store).approve("ABCDEFGH")
    with pytest.raises(LookupError):
        await Pairings(store).revoke("ABCDEFGH")
    with pytest.raises(LookupError):
        await Pairings(store).revoke("test:nobody")


# sessions ---------------------------------------------------------------------------------------


async def test_a_group_shares_one_session_per_chat_by_default(store: Store, tmp_path: Path) -> None:
    section = PlatformSection(account="acct", allowed_users=("alice", "bob"))
    async with running_rig(store, tmp_path, section=section, gated=False) as rig:
        await rig.manager.accept(
            inbound("I like tea", chat="g1", sender="alice", name="Alice", direct=False)
        )
        await rig.settled("test:acct:g1", 1)
        await rig.manager.accept(
            inbound("what does Alice like?", chat="g1", sender="bob", name="Bob", direct=False)
        )
        await rig.settled("test:acct:g1", 2)

        last = rig.llm.calls[-1]
        users_said = [m.content for m in last if m.role is Role.USER]
        assert users_said == ["[Alice] I like tea", "[Bob] what does Alice like?"]
        assert "answer to [Alice] I like tea" in [m.content for m in last]
        session = await store.get_session(SessionKey("test:acct:g1"))
        assert session is not None
        assert session.user_id is None  # a shared session is nobody's in particular


async def test_a_group_configured_per_user_keeps_people_apart(store: Store, tmp_path: Path) -> None:
    section = PlatformSection(
        account="acct", allowed_users=("alice", "bob"), group_sessions=GroupSessions.USER
    )
    async with running_rig(store, tmp_path, section=section, gated=False) as rig:
        await rig.manager.accept(
            inbound("my secret is 42", chat="g1", sender="alice", name="Alice", direct=False)
        )
        await rig.settled("test:acct:g1:u=alice", 1)
        await rig.manager.accept(
            inbound("what is the secret?", chat="g1", sender="bob", name="Bob", direct=False)
        )
        await rig.settled("test:acct:g1:u=bob", 1)

        bobs_call = rig.llm.calls[-1]
        assert not any("42" in m.content for m in bobs_call)
        assert [m.content for m in bobs_call if m.role is Role.USER] == [
            "[Bob] what is the secret?"
        ]
        alice = await store.get_session(SessionKey("test:acct:g1:u=alice"))
        bob = await store.get_session(SessionKey("test:acct:g1:u=bob"))
        assert alice is not None
        assert bob is not None
        assert alice.user_id == await store.resolve_user("test", "alice")
        assert bob.user_id == await store.resolve_user("test", "bob")
        assert alice.user_id != bob.user_id
        # Replies go to the shared chat.
        delivered = await rig.adapter.wait_for(lambda d: len(d) >= 2)
        assert sorted(d.text for d in delivered) == [
            "answer to [Alice] my secret is 42",
            "answer to [Bob] what is the secret?",
        ]
        assert {d.chat_id for d in delivered} == {"g1"}


@pytest.mark.parametrize(
    ("chat_a", "chat_b"),
    [
        pytest.param("alice", "bob", id="own-chats"),
        pytest.param("D1", "D1", id="same-dm-chat-id"),
    ],
)
async def test_dms_of_two_people_never_share_history(
    store: Store, tmp_path: Path, chat_a: str, chat_b: str
) -> None:
    section = PlatformSection(account="acct", allowed_users=("alice", "bob"))
    async with running_rig(store, tmp_path, section=section, gated=False) as rig:
        await rig.manager.accept(inbound("my password is hunter2", chat=chat_a, sender="alice"))
        await rig.llm.wait_started("my password is hunter2")
        await rig.adapter.wait_for(lambda d: len(d) >= 1)
        await rig.manager.accept(inbound("what did alice say?", chat=chat_b, sender="bob"))
        await rig.adapter.wait_for(lambda d: len(d) >= 2)

        (bobs_call,) = [c for c in rig.llm.calls if c[-1].content == "what did alice say?"]
        assert not any("hunter2" in m.content for m in bobs_call)
        assert [m.content for m in bobs_call if m.role is Role.USER] == ["what did alice say?"]
        sessions = await store.list_sessions()
        assert len(sessions) == 2
        assert len({s.user_id for s in sessions}) == 2


# identity linking -------------------------------------------------------------------------------


async def test_linking_a_new_identity_makes_it_the_same_user(store: Store) -> None:
    kept, merged = await store.link_identities(("test", "1"), ("email", "a@x"))

    assert merged is None
    assert await store.resolve_user("test", "1") == kept
    assert await store.resolve_user("email", "a@x") == kept
    assert await store.identities_of(kept) == [("test", "1"), ("email", "a@x")]
    # Linking again changes nothing.
    assert await store.link_identities(("email", "a@x"), ("test", "1")) == (kept, None)


async def no_snapshot(*_: object) -> tuple[str, str]:
    return "", ""


async def test_linking_two_existing_users_merges_them(store: Store) -> None:
    first = await store.resolve_user("test", "1", "Alice")
    second = await store.resolve_user("email", "a@x", "alice")
    await store.link_identities(("email", "a@x"), ("slack", "U7"))
    session = await store.open_session(
        SessionKey("email:default:a@x"), platform="email", user_id=second, snapshot=no_snapshot
    )

    kept, merged = await store.link_identities(("test", "1"), ("email", "a@x"))

    assert (kept, merged) == (first, second)
    assert await store.identities_of(first) == [("test", "1"), ("email", "a@x"), ("slack", "U7")]
    assert await store.identities_of(second) == []
    for platform, external in (("test", "1"), ("email", "a@x"), ("slack", "U7")):
        assert await store.resolve_user(platform, external) == first
    moved = await store.get_session_by_id(session.id)
    assert moved is not None
    assert moved.user_id == first
    assert [s.id for s in await store.list_sessions(user_id=first)] == [session.id]
    async with store.read() as conn:
        ids = set((await conn.execute(select(users.c.id))).scalars())
    assert ids == {first}


async def test_jobs_follow_a_link_and_an_unlinked_identity_takes_back_its_own(
    store: Store,
) -> None:
    """Linking moves the merged user's jobs to the kept one (its row is deleted); unlinking
    gives the identity back the jobs it made, and their rights are its own."""
    service = JobService(store, configured=(("test", "acct"),))
    bob = await store.resolve_user("test", "bob")
    spec = JobSpec(prompt="report", schedule="every 1h", targets=("test:bob",))
    made = await service.create(spec, created_by="test:bob", user_id=bob)
    kept, merged = await store.link_identities(("test", "alice"), ("test", "bob"))
    assert merged == bob
    linked = await JobStore(store).get(made.id)
    assert linked is not None
    assert linked.user_id == kept

    await store.unlink_identity(("test", "bob"))
    own = await store.user_of("test", "bob")
    assert own not in (None, kept, bob)
    unlinked = await JobStore(store).get(made.id)
    assert unlinked is not None
    assert unlinked.user_id == own
    access = Access(store, {}, AccessConfig(operators=("test:alice",)))
    assert not await access.job_operator(unlinked.user_id, unlinked.created_by)
    assert await access.job_operator(kept, "test:alice"), "an operator's own job"


async def test_a_linked_identity_talks_as_the_kept_user(store: Store, tmp_path: Path) -> None:
    kept, _ = await store.link_identities(("email", "bob@x"), ("test", "bob"))
    section = PlatformSection(account="acct", allowed_users=("bob",))
    async with running_rig(store, tmp_path, section=section, gated=False) as rig:
        await answered(rig, "bob", "hello")

        session = await store.get_session(SessionKey("test:acct:bob"))
        assert session is not None
        assert session.user_id == kept


async def test_memory_merge_moves_entries_without_duplicates(tmp_path: Path) -> None:
    memory = MemoryFiles(tmp_path)
    source, into = UserId("u_source"), UserId("u_into")
    await memory.add(MemoryScope.USER, person(into), "Name: Alice")
    await memory.add(MemoryScope.USER, person(into), "Prefers tea")
    await memory.add(MemoryScope.USER, person(source), "Prefers tea")
    await memory.add(MemoryScope.USER, person(source), "Lives in Lisbon")
    await memory.add(MemoryScope.MEMORY, person(source), "Working on the budget")
    folder = FolderDocs(tmp_path).path(person(source), "user").parent
    assert folder.is_dir()

    await memory.merge(source, into)

    assert await memory.read(MemoryScope.USER, person(into)) == (
        "- Name: Alice\n- Prefers tea\n- Lives in Lisbon\n"
    )
    assert await memory.read(MemoryScope.MEMORY, person(into)) == "- Working on the budget\n"
    assert await memory.read(MemoryScope.USER, person(source)) == ""
    assert await memory.read(MemoryScope.MEMORY, person(source)) == ""
    assert not folder.exists()
    # The kept user's snapshot is what a new session of any linked identity starts with.
    user_md, memory_md = await memory.snapshot(SessionKey("telegram:default:1"), into)
    assert "Lives in Lisbon" in user_md
    assert "budget" in memory_md


async def test_memory_merge_of_a_user_without_files_changes_nothing(tmp_path: Path) -> None:
    memory = MemoryFiles(tmp_path)
    into = UserId("u_into")
    await memory.add(MemoryScope.USER, person(into), "Name: Alice")

    await memory.merge(UserId("u_nobody"), into)

    assert await memory.read(MemoryScope.USER, person(into)) == "- Name: Alice\n"


async def test_the_pending_limit_holds_when_strangers_write_at_once(
    store: Store, tmp_path: Path
) -> None:
    """A flood is when the limit matters: strangers arriving concurrently (several adapter
    accounts, webhook requests) must not each see a free place and all get a code."""
    access = AccessConfig(max_pending_pairings=2, pairing_reply_interval=0)
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, access=access, gated=False) as rig:
        strangers = [f"s{i}" for i in range(12)]

        await asyncio.gather(*(rig.manager.accept(inbound("hi", chat=s)) for s in strangers))

        assert await pending_count(store) <= 2
        for s in strangers:
            assert outcomes(await rig.rows(f"test:acct:{s}")) == [("hi", Outcome.REJECTED)]


async def test_one_stranger_writing_twice_at_once_gets_one_code(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(
        store, tmp_path, section=ALLOW_ALICE, access=EVERYONE, gated=False
    ) as rig:
        await asyncio.gather(
            *(rig.manager.accept(inbound(f"hi {i}", chat="mallory")) for i in range(6))
        )

        assert await pending_count(store) == 1
        codes = {code_in(n.text) for n in await notices(rig, "mallory")}
        assert len(codes) == 1


async def test_a_pairing_request_is_logged_with_its_platform_and_expiry(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    async with running_rig(store, tmp_path, section=ALLOW_ALICE, gated=False) as rig:
        await rig.manager.accept(inbound("let me in", chat="mallory", name="Mallory"))
        delivered = await rig.adapter.wait_for(lambda d: len(d) >= 1)
        code = code_in(delivered[0].text)
        (pairing,) = await Pairings(store).list()

    (record,) = [r for r in caplog.records if r.name == "gateway.access"]
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert message.startswith("test sender mallory asked to pair (account acct): code ")
    assert code in message
    assert f"expires {pairing.expires_at:%Y-%m-%d %H:%M} UTC" in message
