"""The store's contract: every test runs on SQLite and on PostgreSQL through `store`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from alembic import command
from sqlalchemy import Connection, func, select, text
from sqlalchemy.exc import IntegrityError, StatementError

from gateway.contracts.history import ChatMessage, Role, SessionInfo, ToolCall, TurnResult
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    MessageId,
    Platform,
    PlatformMessageId,
    SessionId,
    SessionKey,
    TurnId,
    UserId,
)
from gateway.contracts.messages import InboundMessage, Sender, utcnow
from gateway.profiles import Binding
from gateway.store import Store
from gateway.store import engine as engine_mod
from gateway.store.inbox import Inbox
from gateway.store.inbox import insert as insert_inbound
from gateway.store.profiles import StoredBindings
from gateway.store.store import busy_mode_of, owner_key, turns_in_session
from gateway.store.tables import inbox, messages, sessions, turns, users
from tests.turns import finish_turn, start_turn

KEY = SessionKey("test:acct:chat")


class Snapshots:
    """A snapshot factory that counts its calls and numbers what it returns."""

    def __init__(self) -> None:
        self.calls: list[UserId | None] = []

    async def __call__(self, _key: SessionKey, user_id: UserId | None) -> tuple[str, str]:
        self.calls.append(user_id)
        n = len(self.calls)
        return f"USER.md v{n}", f"MEMORY.md v{n}"


async def open_session(
    store: Store, key: SessionKey = KEY, user_id: UserId | None = None
) -> SessionInfo:
    return await store.open_session(key, platform="test", user_id=user_id, snapshot=Snapshots())


def user(text: str) -> ChatMessage:
    return ChatMessage(role=Role.USER, content=text)


def assistant(text: str) -> ChatMessage:
    return ChatMessage(role=Role.ASSISTANT, content=text)


async def add_turn(
    store: Store, session_id: SessionId, *replies: ChatMessage, prompt: str = "hello"
) -> TurnId:
    """One completed turn: `prompt` from the user, then `replies`."""
    turn_id, _ = await start_turn(store, session_id, user(prompt))
    await finish_turn(store, session_id, turn_id, TurnResult(status="completed", messages=replies))
    return turn_id


async def add_messages(store: Store, session_id: SessionId, texts: list[str]) -> list[MessageId]:
    """Store `texts` as assistant messages of one turn, in order; return their ids."""
    turn_id, _ = await start_turn(store, session_id, None)
    return await finish_turn(
        store,
        session_id,
        turn_id,
        TurnResult(status="completed", messages=tuple(assistant(t) for t in texts)),
    )


def bare(message: ChatMessage) -> ChatMessage:
    """`message` without what the store assigns (id, created_at)."""
    return dataclasses.replace(message, id=None, created_at=None)


def assert_utc(value: datetime) -> None:
    assert value.tzinfo is not None
    assert value.utcoffset() == timedelta(0)


# migrations --------------------------------------------------------------------------------------


def _downgrade(connection: Connection, revision: str) -> None:
    cfg = engine_mod.alembic_config()
    cfg.attributes["connection"] = connection
    command.downgrade(cfg, revision)


async def downgrade(store: Store, revision: str) -> None:
    async with store.engine.connect() as plain:
        conn = await plain.execution_options(herald_write=True)
        async with conn.begin():
            await conn.run_sync(_downgrade, revision)


async def test_migrated_to_head(store: Store) -> None:
    assert engine_mod.head_revision() is not None
    assert await engine_mod.current_revision(store.engine) == engine_mod.head_revision()


async def test_opening_twice_is_a_noop(store: Store, store_url: str) -> None:
    someone = await store.resolve_user("telegram", "42")
    async with Store.open(store_url) as again:
        assert await engine_mod.current_revision(again.engine) == engine_mod.head_revision()
        assert await again.resolve_user("telegram", "42") == someone
    await engine_mod.upgrade(store.engine)
    assert await store.resolve_user("telegram", "42") == someone


async def test_downgrade_to_base_and_upgrade_again(store: Store) -> None:
    session = await open_session(store)
    await add_messages(store, session.id, ["before the downgrade"])

    await downgrade(store, "base")
    assert await engine_mod.current_revision(store.engine) is None

    await engine_mod.upgrade(store.engine)
    assert await engine_mod.current_revision(store.engine) == engine_mod.head_revision()
    assert await store.get_session(KEY) is None
    session = await open_session(store)
    await add_messages(store, session.id, ["after the upgrade"])
    hits = await store.search_messages("upgrade", user_id=None)
    assert [h.session_id for h in hits] == [session.id]
    assert await store.search_messages("downgrade", user_id=None) == []


async def test_profiles_migration_keeps_existing_sessions_as_the_default_profiles(
    store: Store,
) -> None:
    """0017 on a database with data: every session made before it is the default
    profile's and stays searchable; going back to 0016 and up again keeps them."""
    work = await store.open_session(
        SessionKey("test:acct:w"),
        platform="test",
        user_id=None,
        snapshot=Snapshots(),
        profile="work",
    )
    await add_messages(store, work.id, ["a pelican before the migration"])
    await StoredBindings(store).bind(Binding("work", "test", None, "w", source="cli"))
    await downgrade(store, "0016")
    await engine_mod.upgrade(store.engine)
    again = await store.get_session(SessionKey("test:acct:w"))
    assert again is not None
    assert again.profile == "default"  # the column came back with its default
    hits = await store.search_messages("pelican", user_id=None, profile="default")
    assert [h.session_id for h in hits] == [work.id]
    assert await StoredBindings(store).list() == []


# users -------------------------------------------------------------------------------------------


async def test_resolve_user_is_stable_per_identity(store: Store) -> None:
    first = await store.resolve_user("telegram", "42", "Ada")
    assert await store.resolve_user("telegram", "42") == first
    assert await store.resolve_user("telegram", "43") != first
    assert await store.resolve_user("slack", "42") != first


async def test_concurrent_resolve_user_creates_one_user(store: Store) -> None:
    found = await asyncio.gather(*(store.resolve_user("discord", "7") for _ in range(10)))
    assert len(set(found)) == 1
    assert await store.resolve_user("discord", "7") == found[0]


# sessions ----------------------------------------------------------------------------------------


async def test_open_session_creates_once_with_snapshots(store: Store) -> None:
    uid = await store.resolve_user("telegram", "42")
    snapshots = Snapshots()
    created = await store.open_session(KEY, platform="telegram", user_id=uid, snapshot=snapshots)
    assert (created.key, created.epoch, created.platform) == (KEY, 0, "telegram")
    assert created.user_id == uid
    assert (created.user_snapshot, created.memory_snapshot) == ("USER.md v1", "MEMORY.md v1")
    assert created.message_count == 0

    again = await store.open_session(KEY, platform="telegram", user_id=uid, snapshot=snapshots)
    assert again == created
    assert snapshots.calls == [uid]
    assert await store.get_session(KEY) == created
    assert await store.get_session_by_id(created.id) == created


async def test_get_session_of_unknown_key_or_id_is_none(store: Store) -> None:
    assert await store.get_session(SessionKey("test:acct:nobody")) is None
    assert await store.get_session_by_id(SessionId(987654)) is None


async def test_new_epoch_starts_a_fresh_session(store: Store) -> None:
    snapshots = Snapshots()
    first = await store.open_session(KEY, platform="test", user_id=None, snapshot=snapshots)
    await add_turn(store, first.id, assistant("hi"))

    second = await store.open_session(
        KEY, platform="test", user_id=None, snapshot=snapshots, new_epoch=True
    )
    assert second.id != first.id
    assert second.epoch == first.epoch + 1
    assert second.message_count == 0
    assert second.user_snapshot == "USER.md v2"
    assert await store.get_session(KEY) == second
    assert await store.get_session_by_id(first.id) is not None
    assert (await store.load_history(second.id, 10)).messages == ()


async def test_a_keys_inbound_leaves_out_what_a_turn_of_another_profile_took(
    store: Store,
) -> None:
    """A chat answered by `work`, then bound to `family` (a new session of the key): with
    `profile`, `for_session` lists the rows no turn took and those of that profile's turns;
    `turns_in_session` tells the turns of one session apart."""
    work = await store.open_session(
        KEY, platform="test", user_id=None, snapshot=Snapshots(), profile="work"
    )
    family = await store.open_session(
        KEY, platform="test", user_id=None, snapshot=Snapshots(), new_epoch=True, profile="family"
    )
    work_turn, _ = await start_turn(store, work.id, user("to work"))
    family_turn, _ = await start_turn(store, family.id, user("to family"))
    ids = {}
    async with store.write() as conn:
        for n, (text, turn_id) in enumerate(
            [("to work", work_turn), ("to family", family_turn), ("waiting", None)]
        ):
            message = InboundMessage(
                platform=Platform("test"),
                account=AccountId("acct"),
                chat_id=ChatId("chat"),
                sender=Sender(ExternalUserId("ann"), "Ann"),
                text=text,
                platform_message_id=PlatformMessageId(f"m{n}"),
            )
            row_id = await insert_inbound(conn, message, key=KEY, user_id=None)
            assert row_id is not None
            ids[text] = row_id
            await conn.execute(inbox.update().where(inbox.c.id == row_id).values(turn_id=turn_id))
    rows = Inbox(store)
    assert [r.text for r in await rows.for_session(KEY)] == ["to work", "to family", "waiting"]
    assert [r.text for r in await rows.for_session(KEY, profile="family")] == [
        "to family",
        "waiting",
    ]
    assert [r.text for r in await rows.for_session(KEY, profile="work")] == ["to work", "waiting"]
    async with store.read() as conn:
        assert await turns_in_session(conn, family.id, [work_turn, family_turn]) == {family_turn}
        assert await turns_in_session(conn, work.id, []) == set()


async def test_concurrent_open_session_creates_one_session(store: Store) -> None:
    opened = await asyncio.gather(*(open_session(store) for _ in range(10)))
    assert len({s.id for s in opened}) == 1
    assert [s.id for s in await store.list_sessions()] == [opened[0].id]


async def test_the_busy_mode_follows_the_current_session_of_a_key(store: Store) -> None:
    key = SessionKey("test:default:busy")
    async with store.read() as conn:
        assert await busy_mode_of(conn, key) is None, "no session yet"
    with pytest.raises(LookupError):
        await store.set_busy_mode(key, "steer")
    await open_session(store, key)
    async with store.read() as conn:
        assert await busy_mode_of(conn, key) is None, "none set"
    await store.set_busy_mode(key, "steer")
    async with store.read() as conn:
        assert await busy_mode_of(conn, key) == "steer"
    await store.set_busy_mode(key, None)
    async with store.read() as conn:
        assert await busy_mode_of(conn, key) is None


# turns -------------------------------------------------------------------------------------------


async def test_turn_messages_round_trip_in_order(store: Store) -> None:
    session = await open_session(store)
    calls = (
        ToolCall(id="call_1", name="search", arguments='{"q": "héllo «world»", "n": [1, 2]}'),
        ToolCall(id="call_2", name="clock", arguments="{}"),
    )
    produced = (
        ChatMessage(role=Role.ASSISTANT, content="", tool_calls=calls),
        ChatMessage(role=Role.TOOL, content="found it", tool_call_id="call_1", name="search"),
        ChatMessage(role=Role.TOOL, content="12:00", tool_call_id="call_2", name="clock"),
        ChatMessage(role=Role.ASSISTANT, content="Here you go, half", interrupted=True),
    )
    turn_id, first_id = await start_turn(store, session.id, user("what's up?"))
    assert first_id is not None
    assert await store.turn_status(turn_id) == "running"

    ids = await finish_turn(
        store,
        session.id,
        turn_id,
        TurnResult(status="interrupted", messages=produced, prompt_tokens=12, completion_tokens=3),
    )
    assert await store.turn_status(turn_id) == "interrupted"
    assert len(ids) == len(produced)
    assert [first_id, *ids] == sorted([first_id, *ids])

    stored = await store.transcript(session.id)
    assert [m.id for m in stored] == [first_id, *ids]
    assert [bare(m) for m in stored] == [user("what's up?"), *produced]
    assert stored[1].tool_calls == calls
    assert json.loads(stored[1].tool_calls[0].arguments) == {"q": "héllo «world»", "n": [1, 2]}
    assert stored[-1].interrupted
    assert not stored[-2].interrupted

    async with store.read() as conn:
        turn_ids = (
            await conn.scalars(
                select(messages.c.turn_id)
                .where(messages.c.session_id == session.id)
                .order_by(messages.c.id)
            )
        ).all()
    assert turn_ids == [turn_id] * (len(produced) + 1)


async def test_turns_move_message_count_and_updated_at(store: Store) -> None:
    session = await open_session(store)
    mark = utcnow()
    await add_turn(store, session.id, assistant("one"), assistant("two"))
    after = await store.get_session(KEY)
    assert after is not None
    assert after.message_count == 3
    assert session.updated_at <= mark <= after.updated_at
    assert after.created_at == session.created_at


async def test_concurrent_turns_keep_every_message_counted(store: Store) -> None:
    session = await open_session(store)
    await asyncio.gather(
        *(
            add_turn(store, session.id, assistant(f"reply {i}"), prompt=f"ask {i}")
            for i in range(10)
        )
    )
    after = await store.get_session(KEY)
    assert after is not None
    assert after.message_count == 20
    assert len(await store.transcript(session.id)) == 20


async def test_start_turn_without_a_message(store: Store) -> None:
    session = await open_session(store)
    turn_id, message_id = await start_turn(store, session.id, None)
    assert message_id is None
    assert await store.turn_status(turn_id) == "running"
    assert await store.transcript(session.id) == []


async def test_turn_status_of_unknown_turn_is_none(store: Store) -> None:
    assert await store.turn_status(TurnId(424242)) is None


async def test_failed_finish_turn_writes_nothing(store: Store) -> None:
    session = await open_session(store)
    turn_id, _ = await start_turn(store, session.id, user("go"))
    before = await store.get_session(KEY)
    # The first message is inserted before the second one is refused.
    broken = TurnResult(
        status="completed",
        messages=(
            assistant("written first"),
            ChatMessage(role=Role.ASSISTANT, content="bad", created_at=datetime(2024, 1, 1)),
        ),
    )
    with pytest.raises(StatementError, match="naive datetime"):
        await finish_turn(store, session.id, turn_id, broken)

    assert await store.turn_status(turn_id) == "running"
    assert [bare(m) for m in await store.transcript(session.id)] == [user("go")]
    assert await store.get_session(KEY) == before
    assert await store.search_messages("written", user_id=None) == []


async def test_finish_turn_for_unknown_session_writes_nothing(store: Store) -> None:
    session = await open_session(store)
    turn_id, _ = await start_turn(store, session.id, user("go"))
    with pytest.raises(IntegrityError):
        await finish_turn(
            store,
            SessionId(session.id + 1000),
            turn_id,
            TurnResult(status="completed", messages=(assistant("orphan"),)),
        )
    assert await store.turn_status(turn_id) == "running"
    async with store.read() as conn:
        assert await conn.scalar(select(func.count()).select_from(messages)) == 1


async def test_start_turn_with_a_refused_message_writes_nothing(store: Store) -> None:
    session = await open_session(store)
    naive = ChatMessage(role=Role.USER, content="hi", created_at=datetime(2024, 1, 1))
    with pytest.raises(StatementError, match="naive datetime") as info:
        await start_turn(store, session.id, naive)
    assert isinstance(info.value.orig, ValueError)
    async with store.read() as conn:
        assert await conn.scalar(select(func.count()).select_from(turns)) == 0
    assert await store.transcript(session.id) == []


async def test_interrupt_running_turns_marks_only_running(store: Store) -> None:
    session = await open_session(store)
    done = await add_turn(store, session.id, assistant("ok"))
    failed, _ = await start_turn(store, session.id, user("boom"))
    await finish_turn(store, session.id, failed, TurnResult(status="failed", error="llm down"))
    running = [(await start_turn(store, session.id, user(f"r{i}")))[0] for i in range(2)]

    assert await store.interrupt_running_turns() == 2
    assert await store.turn_status(done) == "completed"
    assert await store.turn_status(failed) == "failed"
    assert [await store.turn_status(t) for t in running] == ["interrupted", "interrupted"]
    assert await store.interrupt_running_turns() == 0


# history -----------------------------------------------------------------------------------------


async def test_load_history_returns_the_newest_window_oldest_first(store: Store) -> None:
    session = await open_session(store)
    other = await open_session(store, SessionKey("test:acct:other"))
    texts = [f"message {i}" for i in range(2000)]
    ids = await add_messages(store, session.id, texts)
    await add_messages(store, other.id, ["not mine"])

    history = await store.load_history(session.id, 20)
    assert history.summary is None
    assert history.summary_upto is None
    assert len(history.messages) == 20
    assert [m.id for m in history.messages] == ids[-20:]
    assert [m.content for m in history.messages] == texts[-20:]

    assert len((await store.load_history(session.id, 1)).messages) == 1
    assert (await store.load_history(other.id, 20)).messages[0].content == "not mine"


async def test_load_history_starts_after_the_latest_summary(store: Store) -> None:
    session = await open_session(store)
    ids = await add_messages(store, session.id, [f"m{i}" for i in range(10)])
    await store.save_summary(session.id, ids[3], "the first four")
    await store.save_summary(session.id, ids[6], "the first seven")

    history = await store.load_history(session.id, 50)
    assert history.summary == "the first seven"
    assert history.summary_upto == ids[6]
    assert [m.id for m in history.messages] == ids[7:]

    assert [m.id for m in (await store.load_history(session.id, 2)).messages] == ids[8:]


async def test_load_history_of_empty_session(store: Store) -> None:
    session = await open_session(store)
    history = await store.load_history(session.id, 10)
    assert history.summary is None
    assert history.messages == ()


async def test_transcript_pages_backwards_with_before(store: Store) -> None:
    session = await open_session(store)
    ids = await add_messages(store, session.id, [f"m{i}" for i in range(25)])

    pages: list[list[MessageId]] = []
    before: MessageId | None = None
    while page := await store.transcript(session.id, limit=10, before=before):
        pages.append([m.id for m in page if m.id is not None])
        before = page[0].id
    assert pages == [ids[15:], ids[5:15], ids[:5]]


async def test_messages_around(store: Store) -> None:
    session = await open_session(store)
    other = await open_session(store, SessionKey("test:acct:other"))
    ids: list[MessageId] = []
    for i in range(6):  # interleave two sessions so their ids alternate
        ids += await add_messages(store, session.id, [f"m{i}"])
        await add_messages(store, other.id, [f"other {i}"])

    def around(found: list[ChatMessage]) -> list[MessageId | None]:
        return [m.id for m in found]

    assert around(await store.messages_around(ids[2], before=1, after=2)) == ids[1:5]
    assert around(await store.messages_around(ids[0], before=3, after=1)) == ids[:2]
    assert around(await store.messages_around(ids[-1], before=2, after=3)) == ids[-3:]
    assert around(await store.messages_around(ids[3], before=0, after=0)) == [ids[3]]
    assert await store.messages_around(MessageId(10**9), before=2, after=2) == []


# search ------------------------------------------------------------------------------------------


async def test_search_finds_stemmed_words_with_a_marked_snippet(store: Store) -> None:
    session = await open_session(store)
    await add_turn(store, session.id, assistant("We deployed the new release on Friday."))

    hits = await store.search_messages("deploying", user_id=None)
    assert len(hits) == 1
    hit = hits[0]
    assert hit.session_id == session.id
    assert hit.session_key == KEY
    assert hit.role is Role.ASSISTANT
    assert "«deployed»" in hit.snippet
    assert_utc(hit.created_at)
    found = await store.messages_around(hit.message_id, before=0, after=0)
    assert [m.content for m in found] == ["We deployed the new release on Friday."]


async def test_search_is_scoped_to_the_user(store: Store) -> None:
    alice = await store.resolve_user("telegram", "alice")
    bob = await store.resolve_user("telegram", "bob")
    mine = await open_session(store, SessionKey("test:acct:alice"), user_id=alice)
    theirs = await open_session(store, SessionKey("test:acct:bob"), user_id=bob)
    nobody = await open_session(store, SessionKey("test:acct:nobody"))
    for session in (mine, theirs, nobody):
        await add_turn(store, session.id, assistant(f"the pineapple of {session.key}"))

    assert {h.session_id for h in await store.search_messages("pineapple", user_id=alice)} == {
        mine.id
    }
    assert {h.session_id for h in await store.search_messages("pineapple", user_id=bob)} == {
        theirs.id
    }
    stranger = await store.resolve_user("telegram", "eve")
    assert await store.search_messages("pineapple", user_id=stranger) == []
    everyone = await store.search_messages("pineapple", user_id=None)
    assert {h.session_id for h in everyone} == {mine.id, theirs.id, nobody.id}


async def test_search_and_recent_sessions_are_scoped_to_the_profile(store: Store) -> None:
    alice = await store.resolve_user("telegram", "alice")
    snapshot = Snapshots()
    work = await store.open_session(
        SessionKey("test:acct:w"), platform="test", user_id=alice, snapshot=snapshot, profile="work"
    )
    home = await open_session(store, SessionKey("test:acct:h"), user_id=alice)
    for session in (work, home):
        await add_turn(store, session.id, assistant(f"the pineapple of {session.key}"))

    found = await store.search_messages("pineapple", user_id=alice, profile="work")
    assert {h.session_id for h in found} == {work.id}
    found = await store.search_messages("pineapple", user_id=alice, profile="default")
    assert {h.session_id for h in found} == {home.id}
    both = await store.search_messages("pineapple", user_id=alice)
    assert {h.session_id for h in both} == {work.id, home.id}
    recent = await store.recent_sessions(user_id=alice, profile="work")
    assert [s.id for s in recent] == [work.id]
    assert work.profile == "work"
    assert home.profile == "default"


async def test_a_session_of_another_profile_is_not_reused(store: Store) -> None:
    first = await open_session(store)
    same = await open_session(store)
    assert same.id == first.id
    other = await store.open_session(
        KEY, platform="test", user_id=None, snapshot=Snapshots(), profile="work"
    )
    assert other.id != first.id
    assert other.epoch == first.epoch + 1
    assert (await store.get_session(KEY)) == other


async def test_stored_bindings_bind_rebind_and_unbind(store: Store) -> None:
    bindings = StoredBindings(store)
    assert await bindings.list() == []
    assert await bindings.bind(Binding("work", "telegram", None, "42"))
    assert await bindings.bind(Binding("family", "telegram", "family"))
    assert not await bindings.bind(Binding("default", "telegram", None, "42"))  # rebound
    assert await bindings.list() == [
        Binding("default", "telegram", None, "42", source="cli"),
        Binding("family", "telegram", "family", source="cli"),
    ]
    assert await bindings.unbind(Binding("x", "telegram", None, "42"))
    assert not await bindings.unbind(Binding("x", "telegram", None, "42"))
    assert [b.profile for b in await bindings.list()] == ["family"]


async def assert_search_index_consistent(store: Store) -> None:
    """Every message's owner is its session's user's key, and (SQLite) FTS5 agrees with it."""
    async with store.read() as conn:
        pairs = (
            await conn.execute(
                select(messages.c.owner, sessions.c.user_id).join(
                    sessions, sessions.c.id == messages.c.session_id
                )
            )
        ).all()
        if store.dialect == "sqlite":
            await conn.execute(
                text("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")
            )
    assert pairs
    for owner, user_id in pairs:
        assert owner == (None if user_id is None else owner_key(UserId(user_id)))


async def test_search_follows_linked_identities(store: Store) -> None:
    ann = await store.resolve_user("telegram", "ann")
    other = await store.resolve_user("slack", "U-ann")
    hers = await open_session(store, SessionKey("test:acct:ann"), user_id=ann)
    moved = await open_session(store, SessionKey("test:acct:ann-slack"), user_id=other)
    await add_turn(store, hers.id, assistant("the walrus on telegram"))
    await add_turn(store, moved.id, assistant("the walrus on slack"))
    assert {h.session_id for h in await store.search_messages("walrus", user_id=ann)} == {hers.id}

    assert await store.link_identities(("telegram", "ann"), ("slack", "U-ann")) == (ann, other)

    found = await store.search_messages("walrus", user_id=ann)
    assert {h.session_id for h in found} == {hers.id, moved.id}
    assert await store.search_messages("walrus", user_id=other) == []
    await assert_search_index_consistent(store)


async def test_search_of_a_deleted_users_sessions_is_left_to_everyone(store: Store) -> None:
    gone = await store.resolve_user("telegram", "gone")
    session = await open_session(store, SessionKey("test:acct:gone"), user_id=gone)
    await add_turn(store, session.id, assistant("an orphaned kumquat"))
    async with store.write() as conn:
        await conn.execute(users.delete().where(users.c.id == gone))

    assert await store.search_messages("kumquat", user_id=gone) == []
    assert [h.session_id for h in await store.search_messages("kumquat", user_id=None)] == [
        session.id
    ]
    await assert_search_index_consistent(store)


@pytest.mark.parametrize("query", ["the and", "a"])
async def test_search_of_stop_words_for_a_user_finds_nothing(store: Store, query: str) -> None:
    someone = await store.resolve_user("telegram", "someone")
    session = await open_session(store, SessionKey("test:acct:someone"), user_id=someone)
    await add_turn(store, session.id, assistant("nothing here but a message"))
    hits = await store.search_messages(query, user_id=someone)
    # PostgreSQL drops stop words, and an empty query must not become "all of the user's".
    # FTS5 keeps them: "a" is a word there.
    assert [h.session_id for h in hits] == (
        [session.id] if store.dialect == "sqlite" and query == "a" else []
    )


async def test_search_owners_are_filled_by_the_migration(store: Store) -> None:
    ann = await store.resolve_user("telegram", "ann")
    session = await open_session(store, SessionKey("test:acct:ann"), user_id=ann)
    anonymous = await open_session(store, SessionKey("test:acct:nobody"))
    await add_turn(store, session.id, assistant("a yurt by the lake"))
    await add_turn(store, anonymous.id, assistant("another yurt"))

    await downgrade(store, "0005")
    assert [h.session_id for h in await store.search_messages("yurt", user_id=None)] == [
        anonymous.id,
        session.id,
    ]  # the old index still answers: shorter first (BM25), newer first (ts_rank tie)
    await engine_mod.upgrade(store.engine)

    assert [h.session_id for h in await store.search_messages("yurt", user_id=ann)] == [session.id]
    assert len(await store.search_messages("yurt", user_id=None)) == 2
    await assert_search_index_consistent(store)


async def test_search_skips_tool_messages(store: Store) -> None:
    session = await open_session(store)
    await add_turn(
        store,
        session.id,
        ChatMessage(role=Role.TOOL, content="zeppelin schedule", tool_call_id="c1", name="web"),
        prompt="when does the zeppelin fly?",
    )
    hits = await store.search_messages("zeppelin", user_id=None)
    assert [h.role for h in hits] == [Role.USER]


@pytest.mark.parametrize(
    "query",
    [
        '"foo" AND (bar',
        "*",
        "-x",
        "NEAR",
        "NEAR(foo bar, 2)",
        "foo OR bar NOT baz",
        "content:foo",
        "foo*",
        "^foo",
        "'; DROP TABLE messages; --",
        "a & b | !c <-> d:*",
        '\\"\\',
        "“smart” quotes",
        "the and",
        "\x00",
    ],
)
async def test_search_never_raises_on_query_syntax(store: Store, query: str) -> None:
    session = await open_session(store)
    await add_turn(store, session.id, assistant("foo bar baz and the content of x"))
    hits = await store.search_messages(query, user_id=None)
    assert all(h.session_id == session.id for h in hits)


@pytest.mark.parametrize("query", ["", "   ", "?!", "«»"])
async def test_search_without_words_finds_nothing(store: Store, query: str) -> None:
    session = await open_session(store)
    await add_turn(store, session.id, assistant("anything at all"))
    assert await store.search_messages(query, user_id=None) == []


async def test_search_honours_limit(store: Store) -> None:
    session = await open_session(store)
    await add_messages(store, session.id, [f"kiwi number {i}" for i in range(8)])
    assert len(await store.search_messages("kiwi", user_id=None, limit=3)) == 3
    assert len(await store.search_messages("kiwi", user_id=None)) == 8


# listing -----------------------------------------------------------------------------------------


async def test_list_sessions_most_recently_updated_first(store: Store) -> None:
    alice = await store.resolve_user("telegram", "alice")
    a = await open_session(store, SessionKey("test:acct:a"), user_id=alice)
    b = await open_session(store, SessionKey("test:acct:b"))
    c = await open_session(store, SessionKey("test:acct:c"), user_id=alice)
    await add_turn(store, a.id, assistant("a is active again"))

    assert [s.id for s in await store.list_sessions()] == [a.id, c.id, b.id]
    assert [s.id for s in await store.list_sessions(limit=2)] == [a.id, c.id]
    assert [s.id for s in await store.list_sessions(limit=2, offset=2)] == [b.id]
    assert await store.list_sessions(offset=3) == []
    assert [s.id for s in await store.list_sessions(user_id=alice)] == [a.id, c.id]
    assert [s.id for s in await store.list_sessions(user_id=alice, offset=1)] == [c.id]
    assert [s.id for s in await store.recent_sessions(user_id=alice, limit=1)] == [a.id]
    assert [s.id for s in await store.recent_sessions(user_id=None)] == [a.id, c.id, b.id]


# timestamps --------------------------------------------------------------------------------------


async def test_timestamps_are_aware_utc(store: Store) -> None:
    session = await open_session(store)
    plus_two = datetime(2024, 5, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    turn_id, _ = await start_turn(
        store, session.id, ChatMessage(role=Role.USER, content="timed message", created_at=plus_two)
    )
    await finish_turn(
        store,
        session.id,
        turn_id,
        TurnResult(status="completed", messages=(assistant("timed reply"),)),
    )

    current = await store.get_session(KEY)
    assert current is not None
    listed = await store.list_sessions()
    by_id = await store.get_session_by_id(session.id)
    assert by_id is not None
    for info in (session, current, by_id, *listed):
        assert_utc(info.created_at)
        assert_utc(info.updated_at)

    stored = [
        *await store.transcript(session.id),
        *(await store.load_history(session.id, 10)).messages,
    ]
    stored += await store.messages_around(stored[0].id or MessageId(0), before=1, after=1)
    for message in stored:
        assert message.created_at is not None
        assert_utc(message.created_at)
    assert stored[0].created_at == plus_two
    assert stored[0].created_at == datetime(2024, 5, 1, 12, 30, tzinfo=UTC)

    for hit in await store.search_messages("timed", user_id=None):
        assert_utc(hit.created_at)


async def test_naive_datetime_is_refused(store: Store) -> None:
    session = await open_session(store)
    turn_id, _ = await start_turn(store, session.id, None)
    naive = ChatMessage(role=Role.ASSISTANT, content="x", created_at=datetime(2024, 1, 1))
    with pytest.raises(StatementError, match="naive datetime") as info:
        await finish_turn(
            store, session.id, turn_id, TurnResult(status="completed", messages=(naive,))
        )
    assert isinstance(info.value.orig, ValueError)
    assert await store.transcript(session.id) == []


# the same text on both backends ------------------------------------------------------------------


async def test_text_with_nul_is_stored(store: Store) -> None:
    # NUL reaches us in pasted text and email bodies; SQLite keeps it, PostgreSQL refuses it.
    session = await open_session(store)
    await add_turn(store, session.id, assistant("after\x00wards"), prompt="be\x00fore")
    stored = [m.content for m in await store.transcript(session.id)]
    assert stored in (["be\x00fore", "after\x00wards"], ["be\ufffdfore", "after\ufffdwards"])


async def test_long_platform_identifiers_are_stored(store: Store) -> None:
    # Keys and ids come from platforms (mail thread ids, provider tool-call ids); a length
    # SQLite accepts must not become a driver error on PostgreSQL.
    key = SessionKey("email:inbox:" + "t" * 600)
    someone = await store.resolve_user("email", "x" * 300 + "@example.org")
    session = await open_session(store, key, user_id=someone)
    assert await store.get_session(key) == session
    call = ChatMessage(role=Role.TOOL, content="ok", tool_call_id="c" * 200, name="n" * 200)
    await add_turn(store, session.id, call)
    assert [bare(m) for m in await store.transcript(session.id)][-1] == call
