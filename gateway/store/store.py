"""The store: connections and transactions, and the users, sessions, transcripts and
settings repositories.

All SQL lives in `gateway/store/` (the other repositories: inbox, outbox, jobs, pairings,
instances, leases, lanes); their contracts are written down in `gateway/store/abc.py`.
Methods of `Store` open a transaction of their own; module functions take the caller's
connection and work inside its transaction.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Self, TypeVar

from sqlalchemy import RowMapping, and_, bindparam, func, insert, or_, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.contracts.history import (
    ChatMessage,
    History,
    Role,
    SearchHit,
    SessionInfo,
    ToolCall,
    TurnResult,
)
from gateway.contracts.ids import MessageId, SessionId, SessionKey, TurnId, UserId
from gateway.contracts.messages import utcnow
from gateway.store import engine as engine_mod
from gateway.store import memory_sync as memory_sync_sql
from gateway.store.health import StoreHealth
from gateway.store.stats import StoreStats
from gateway.store.tables import (
    identities,
    jobs,
    messages,
    sessions,
    settings,
    summaries,
    turns,
    users,
)
from gateway.store.types import aware

T = TypeVar("T")

SnapshotFactory = Callable[[SessionKey, UserId | None], Awaitable[tuple[str, ...]]]
"""(USER.md, MEMORY.md[, skills index]) for a new session of that key and user, frozen into
the session."""
"""Returns (USER.md, MEMORY.md) as they are now, for a new session of that user."""

_WORD = re.compile(r"\w+", re.UNICODE)

# The statements of every turn, built once: building one per call (operators, coercions,
# cache key) cost about a fifth of the store's CPU per turn. Parameters come at execution.
_USER_OF_IDENTITY = select(identities.c.user_id).where(
    identities.c.platform == bindparam("platform"),
    identities.c.external_id == bindparam("external_id"),
)
_CURRENT_SESSION = (
    select(sessions)
    .where(sessions.c.key == bindparam("key"))
    .order_by(sessions.c.epoch.desc())
    .limit(1)
)
_LATEST_SUMMARY = (
    select(summaries.c.upto_message_id)
    .where(summaries.c.session_id == bindparam("session_id"))
    .order_by(summaries.c.id.desc())
    .limit(1)
)
_LAST_USAGE = (
    select(turns.c.id)
    .where(turns.c.session_id == bindparam("session_id"), turns.c.prompt_tokens.is_not(None))
    .order_by(turns.c.id.desc())
    .limit(1)
)
# A history in two statements: the newest summary with the latest turn's usage (one row,
# even when there is neither), then the window of messages after that summary.
_HISTORY_HEAD = select(
    select(summaries.c.content)
    .where(summaries.c.id == _LATEST_SUMMARY.with_only_columns(summaries.c.id).scalar_subquery())
    .scalar_subquery()
    .label("summary"),
    _LATEST_SUMMARY.scalar_subquery().label("upto"),
    select(turns.c.prompt_tokens)
    .where(turns.c.id == _LAST_USAGE.scalar_subquery())
    .scalar_subquery()
    .label("prompt_tokens"),
    select(turns.c.completion_tokens)
    .where(turns.c.id == _LAST_USAGE.scalar_subquery())
    .scalar_subquery()
    .label("completion_tokens"),
)
_WINDOW = (
    select(messages)
    .where(
        messages.c.session_id == bindparam("session_id"),
        messages.c.id > func.coalesce(_LATEST_SUMMARY.scalar_subquery(), 0),
    )
    .order_by(messages.c.id.desc())
    .limit(bindparam("window"))
)
_START_TURN = insert(turns).returning(turns.c.id)
_INSERT_MESSAGE = insert(messages).returning(messages.c.id)
_TOUCH_SESSION = (
    update(sessions)
    .where(sessions.c.id == bindparam("b_session_id"))
    .values(
        updated_at=bindparam("b_now"),
        message_count=sessions.c.message_count + bindparam("b_added"),
    )
    .returning(sessions.c.user_id)
)
_FINISH_TURN = update(turns).where(turns.c.id == bindparam("b_turn_id"))


class Store:
    """Herald's SQL state on SQLite or PostgreSQL. Safe to share across tasks."""

    def __init__(self, engine: AsyncEngine, stats: StoreStats | None = None) -> None:
        self.engine = engine
        self.stats = stats if stats is not None else StoreStats()
        """What this store asked of the database so far (counted by `Store.open`'s engine)."""
        # SQLite has one write lock per database. Writers of this process take turns here,
        # in order, instead of in SQLite's busy handler (which polls by sleeping, and past
        # its timeout fails with "database is locked").
        self._writer = asyncio.Lock() if engine.dialect.name == "sqlite" else None
        self._writing: asyncio.Task[Any] | None = None
        self.health = StoreHealth()
        """Whether writes commit (a full disk or a read-only database makes them fail)."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls, url: str, *, migrate: bool = True, create: bool = True
    ) -> AsyncIterator[Self]:
        """Connect (and migrate to the newest schema unless `migrate` is False).

        With `create` False, a database that does not exist yet raises SetupError instead of
        being created. One that cannot be opened, or that a newer Herald migrated, raises
        SetupError; a PostgreSQL server that does not answer, DatabaseUnavailable.
        """
        stats = StoreStats()
        engine = await engine_mod.open_engine(url, migrate=migrate, create=create, stats=stats)
        try:
            yield cls(engine, stats)
        finally:
            await engine.dispose()

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.engine.dialect.name

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction: committed on success, rolled back on any error.

        On SQLite, one at a time per process; a write opened inside another one of the same
        task raises RuntimeError (it could never start).
        """
        async with self._writing_turn(), self._transaction(write=True) as conn:
            yield conn

    @asynccontextmanager
    async def _writing_turn(self) -> AsyncIterator[None]:
        """This task's turn to write (on SQLite, one writer of the process at a time), with
        the store's health told whether the write committed."""
        try:
            if self._writer is None:
                yield
            else:
                task = asyncio.current_task()
                if task is not None and task is self._writing:
                    raise RuntimeError(
                        "a write transaction inside another one on the same database"
                    )
                async with self._writer:
                    self._writing = task
                    try:
                        yield
                    finally:
                        self._writing = None
        except Exception as err:
            self.health.failed(err)
            raise
        self.health.succeeded()

    async def unit(
        self, work: Callable[[AsyncConnection], Awaitable[T]], *, write: bool = True
    ) -> T:
        """`work(conn)` as one transaction, a write (as `write()`) or, with `write=False`, a
        read: committed when it returns, rolled back when it raises; its result.

        `work` awaits nothing but `conn`. On SQLite it then runs whole on the connection's
        thread: BEGIN, its statements and COMMIT in one trip there instead of one trip each.
        One that awaits anything else is rolled back and raises RuntimeError there.
        """
        if self._writer is None:
            async with self.write() if write else self.read() as conn:
                return await work(conn)
        if not write:
            return await self._whole(work, write=False)
        async with self._writing_turn():
            return await self._whole(work, write=True)

    async def _whole(self, work: Callable[[AsyncConnection], Awaitable[T]], *, write: bool) -> T:
        async with self.engine.connect() as plain:
            conn = await plain.execution_options(herald_write=True) if write else plain
            driver = (await conn.get_raw_connection()).driver_connection
            assert isinstance(driver, engine_mod.SqliteConnection)

            async def whole() -> T:
                async with conn.begin():
                    return await work(conn)

            return await driver.run_whole(whole())

    @asynccontextmanager
    async def _transaction(self, *, write: bool) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as plain:
            conn = await plain.execution_options(herald_write=True) if write else plain
            async with conn.begin():
                yield conn

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction."""
        async with self._transaction(write=False) as conn:
            yield conn

    async def ping(self) -> None:
        """Raise if the database cannot answer a trivial query."""
        async with self.read() as conn:
            await conn.execute(text("SELECT 1"))

    # users -----------------------------------------------------------------------------------

    async def user_of(self, platform: str, external_id: str) -> UserId | None:
        """The user that `platform:external_id` belongs to, or None (nothing is created)."""
        params = {"platform": platform, "external_id": external_id}
        found = await self.unit(lambda conn: conn.scalar(_USER_OF_IDENTITY, params), write=False)
        return None if found is None else UserId(str(found))

    async def resolve_user(self, platform: str, external_id: str, display_name: str = "") -> UserId:
        """The user that `platform:external_id` belongs to, created on first sight."""
        for _ in range(3):
            async with self.read() as conn:
                found = await conn.scalar(
                    _USER_OF_IDENTITY, {"platform": platform, "external_id": external_id}
                )
            if found is not None:
                return UserId(found)
            user_id = UserId(f"u_{secrets.token_hex(8)}")
            now = utcnow()
            try:
                async with self.write() as conn:
                    await conn.execute(
                        insert(users).values(
                            id=user_id, display_name=display_name[:256], created_at=now
                        )
                    )
                    await conn.execute(
                        insert(identities).values(
                            user_id=user_id,
                            platform=platform,
                            external_id=external_id,
                            created_at=now,
                        )
                    )
                return user_id
            except IntegrityError:
                continue  # another task created it first; read it back
        raise RuntimeError(f"could not resolve user {platform}:{external_id}")

    # sessions --------------------------------------------------------------------------------

    async def get_session(self, key: SessionKey | str) -> SessionInfo | None:
        """The current session (highest epoch) of `key`, or None."""
        return await self.unit(lambda conn: current_session(conn, key), write=False)

    async def session_of(
        self, key: SessionKey, identity: tuple[str, str]
    ) -> tuple[SessionInfo | None, bool]:
        """The current session of `key` (or None), and whether `identity` (platform,
        external id) is one of its user's (one read transaction)."""

        async def look(conn: AsyncConnection) -> tuple[SessionInfo | None, bool]:
            session = await current_session(conn, key)
            if session is None or session.user_id is None:
                return session, False
            found = await conn.scalar(
                _USER_OF_IDENTITY.where(identities.c.user_id == session.user_id),
                {"platform": identity[0], "external_id": identity[1]},
            )
            return session, found is not None

        return await self.unit(look, write=False)

    async def get_session_by_id(self, session_id: SessionId) -> SessionInfo | None:
        """The session with that id (of any epoch), or None."""
        async with self.read() as conn:
            row = (
                (await conn.execute(select(sessions).where(sessions.c.id == session_id)))
                .mappings()
                .first()
            )
        return _session(row) if row else None

    async def open_session(
        self,
        key: SessionKey,
        *,
        platform: str,
        user_id: UserId | None,
        snapshot: SnapshotFactory,
        new_epoch: bool = False,
        profile: str = "default",
    ) -> SessionInfo:
        """The current session of `key`, created (with memory snapshots) when there is none.

        With `new_epoch`, always start a fresh session under the same key (`/new`). A session
        that belongs to another user than `user_id` (its identity was unlinked since, say) is
        not reused either: a fresh one starts for `user_id`, so nothing of that user (their
        USER.md snapshot, history, search, tools) is reached from it. Nor is one another
        `profile` answered (the chat's binding changed): one profile never reads another's
        conversation.
        """
        for _ in range(3):
            current = await self.get_session(key)
            if (
                current is not None
                and not new_epoch
                and current.user_id == user_id
                and current.profile == profile
            ):
                return current
            epoch = current.epoch + 1 if current is not None else 0
            frozen = await snapshot(key, user_id)
            user_md, memory_md = frozen[0], frozen[1]
            skills_md = frozen[2] if len(frozen) > 2 else ""
            now = utcnow()
            try:
                async with self.write() as conn:
                    created = (
                        (
                            await conn.execute(
                                insert(sessions)
                                .values(
                                    key=key,
                                    epoch=epoch,
                                    platform=platform,
                                    user_id=user_id,
                                    user_snapshot=user_md,
                                    memory_snapshot=memory_md,
                                    skills_snapshot=skills_md,
                                    created_at=now,
                                    updated_at=now,
                                    message_count=0,
                                    profile=profile,
                                )
                                .returning(*sessions.c)
                            )
                        )
                        .mappings()
                        .one()
                    )
            except IntegrityError as err:
                raced = await self.get_session(key)
                if raced is None or (current is not None and raced.epoch == current.epoch):
                    raise ValueError(f"cannot create session {key}: {err.orig}") from err
                return raced  # another task created it first; take theirs
            return _session(created)
        raise RuntimeError(f"could not open session {key}")

    async def set_busy_mode(self, key: SessionKey, mode: str | None) -> None:
        """Set the busy mode of the current session of `key` (and of its later epochs)."""
        async with self.write() as conn:
            current = await conn.scalar(
                select(sessions.c.id)
                .where(sessions.c.key == key)
                .order_by(sessions.c.epoch.desc())
                .limit(1)
            )
            if current is None:
                raise LookupError(f"no session {key}")
            await conn.execute(
                update(sessions).where(sessions.c.id == current).values(busy_mode=mode)
            )

    async def get_setting(self, name: str) -> str | None:
        """A value set at runtime (like the home channel), or None."""
        async with self.read() as conn:
            value = await conn.scalar(select(settings.c.value).where(settings.c.key == name))
        return None if value is None else str(value)

    async def link_identities(
        self, first: tuple[str, str], second: tuple[str, str]
    ) -> tuple[UserId, UserId | None]:
        """Make two platform identities one user; return (kept user, merged-away user).

        The first identity's user is kept (created when unknown); the second identity, every
        other identity of its user, its sessions and its jobs move to it, and its user row is
        deleted.
        """
        keep = await self.resolve_user(*first)
        async with self.write() as conn:
            other = await conn.scalar(
                select(identities.c.user_id).where(
                    identities.c.platform == second[0], identities.c.external_id == second[1]
                )
            )
            if other is None:
                await conn.execute(
                    insert(identities).values(
                        user_id=keep, platform=second[0], external_id=second[1], created_at=utcnow()
                    )
                )
                return keep, None
            if other == keep:
                return keep, None
            await conn.execute(
                update(identities).where(identities.c.user_id == other).values(user_id=keep)
            )
            await conn.execute(
                update(sessions).where(sessions.c.user_id == other).values(user_id=keep)
            )
            # Its jobs too (their rights stay those of the identity that made them).
            await conn.execute(
                update(jobs)
                .where(jobs.c.user_id == other)
                .values(user_id=keep, updated_at=utcnow())
            )
            # One person to the memory provider too: their queued syncs go to the kept user.
            await memory_sync_sql.reassign(conn, UserId(str(other)), keep)
            await conn.execute(users.delete().where(users.c.id == other))
        return keep, UserId(str(other))

    async def identities_of(self, user_id: UserId) -> list[tuple[str, str]]:
        """The (platform, external id) pairs linked to a user."""
        async with self.read() as conn:
            rows = (
                await conn.execute(
                    select(identities.c.platform, identities.c.external_id)
                    .where(identities.c.user_id == user_id)
                    .order_by(identities.c.id)
                )
            ).all()
        return [(str(r[0]), str(r[1])) for r in rows]

    async def list_users(self) -> list[tuple[UserId, str, list[tuple[str, str]]]]:
        """Every user, oldest first: (id, display name, its (platform, external id) pairs)."""
        async with self.read() as conn:
            people = (
                await conn.execute(
                    select(users.c.id, users.c.display_name).order_by(
                        users.c.created_at, users.c.id
                    )
                )
            ).all()
            linked = (
                await conn.execute(
                    select(
                        identities.c.user_id, identities.c.platform, identities.c.external_id
                    ).order_by(identities.c.id)
                )
            ).all()
        by_user: dict[str, list[tuple[str, str]]] = {}
        for user_id, platform, external_id in linked:
            by_user.setdefault(str(user_id), []).append((str(platform), str(external_id)))
        return [(UserId(str(u)), str(name or ""), by_user.get(str(u), [])) for u, name in people]

    async def unlink_identity(self, identity: tuple[str, str]) -> UserId:
        """Detach one platform identity from its user; return that user.

        The identity becomes a user of its own at once: its sessions start over as that
        user's from its next message (`open_session`), and the jobs it made (`created_by`
        is `platform:id`) move to it, running with its rights and scope. Raises LookupError
        when the identity is unknown, or is its user's only one (nothing to unlink it from).
        """
        platform, external_id = identity
        async with self.write() as conn:
            user_id = await conn.scalar(
                _USER_OF_IDENTITY, {"platform": platform, "external_id": external_id}
            )
            if user_id is None:
                raise LookupError(f"no user has the identity {platform}:{external_id}")
            count = await conn.scalar(
                select(func.count()).select_from(identities).where(identities.c.user_id == user_id)
            )
            if int(count or 0) < 2:
                raise LookupError(
                    f"{platform}:{external_id} is the only identity of user {user_id}; "
                    "there is nothing to unlink it from"
                )
            own = UserId(f"u_{secrets.token_hex(8)}")
            now = utcnow()
            await conn.execute(insert(users).values(id=own, display_name="", created_at=now))
            await conn.execute(
                update(identities)
                .where(identities.c.platform == platform, identities.c.external_id == external_id)
                .values(user_id=own, created_at=now)
            )
            await conn.execute(
                update(jobs)
                .where(jobs.c.user_id == user_id, jobs.c.created_by == f"{platform}:{external_id}")
                .values(user_id=own, updated_at=now)
            )
        return UserId(str(user_id))

    async def list_sessions(
        self,
        *,
        user_id: UserId | None = None,
        limit: int = 50,
        offset: int = 0,
        profile: str | None = None,
    ) -> list[SessionInfo]:
        """Sessions (of `user_id`, answered by `profile`, when given), most recently active
        first."""
        query = select(sessions).order_by(sessions.c.updated_at.desc(), sessions.c.id.desc())
        if user_id is not None:
            query = query.where(sessions.c.user_id == user_id)
        if profile is not None:
            query = query.where(sessions.c.profile == profile)
        async with self.read() as conn:
            rows = (await conn.execute(query.limit(limit).offset(offset))).mappings().all()
        return [_session(r) for r in rows]

    async def recent_sessions(
        self, *, user_id: UserId | None, limit: int = 10, profile: str | None = None
    ) -> list[SessionInfo]:
        """The most recently active sessions of `user_id` (all when None), of `profile`
        when given."""
        return await self.list_sessions(user_id=user_id, limit=limit, profile=profile)

    # turns and transcripts ---------------------------------------------------------------------

    async def turn_status(self, turn_id: TurnId) -> str | None:
        """running, completed, failed or interrupted; None when there is no such turn."""
        async with self.read() as conn:
            value = await conn.scalar(select(turns.c.status).where(turns.c.id == turn_id))
        return None if value is None else str(value)

    async def interrupt_running_turns(self) -> int:
        """Mark turns left `running` by a previous process as interrupted; return how many."""
        async with self.write() as conn:
            result = await conn.execute(
                update(turns)
                .where(turns.c.status == "running")
                .values(status="interrupted", finished_at=utcnow(), error="process stopped")
            )
        return int(result.rowcount or 0)

    async def load_history(self, session_id: SessionId, window: int) -> History:
        """The latest summary and at most `window` messages after it, oldest first, with
        the token usage of the latest turn (one read transaction)."""
        async with self.read() as conn:
            return await read_history(conn, session_id, window)

    async def save_summary(
        self, session_id: SessionId, upto_message_id: MessageId, content: str
    ) -> None:
        """Record a summary covering every message of the session up to `upto_message_id`."""
        async with self.write() as conn:
            await conn.execute(
                insert(summaries).values(
                    session_id=session_id,
                    upto_message_id=upto_message_id,
                    content=content,
                    created_at=utcnow(),
                )
            )

    async def transcript(
        self, session_id: SessionId, *, limit: int = 200, before: MessageId | None = None
    ) -> list[ChatMessage]:
        """Up to `limit` messages of a session (before `before`), oldest first."""
        query = select(messages).where(messages.c.session_id == session_id)
        if before is not None:
            query = query.where(messages.c.id < before)
        async with self.read() as conn:
            rows = (
                (await conn.execute(query.order_by(messages.c.id.desc()).limit(limit)))
                .mappings()
                .all()
            )
        return [_message(r) for r in reversed(rows)]

    async def messages_around(
        self, message_id: MessageId, *, before: int, after: int
    ) -> list[ChatMessage]:
        """The messages of the same session surrounding `message_id`, itself included.

        Only the conversation counts: user messages and assistant messages with text. Tool
        calls and tool results are neither counted nor returned.
        """
        async with self.read() as conn:
            session_id = await conn.scalar(
                select(messages.c.session_id).where(messages.c.id == message_id)
            )
            if session_id is None:
                return []
            same = and_(
                messages.c.session_id == session_id,
                or_(
                    messages.c.role == Role.USER.value,
                    and_(messages.c.role == Role.ASSISTANT.value, messages.c.content != ""),
                ),
            )
            earlier = (
                (
                    await conn.execute(
                        select(messages)
                        .where(and_(same, messages.c.id < message_id))
                        .order_by(messages.c.id.desc())
                        .limit(before)
                    )
                )
                .mappings()
                .all()
            )
            later = (
                (
                    await conn.execute(
                        select(messages)
                        .where(and_(same, messages.c.id > message_id))
                        .order_by(messages.c.id)
                        .limit(after)
                    )
                )
                .mappings()
                .all()
            )
            itself = (
                (await conn.execute(select(messages).where(messages.c.id == message_id)))
                .mappings()
                .all()
            )
        return [_message(r) for r in [*reversed(earlier), *itself, *later]]

    async def search_messages(
        self, query: str, *, user_id: UserId | None, limit: int = 10, profile: str | None = None
    ) -> list[SearchHit]:
        """Full-text search over user and assistant messages (of sessions `profile`
        answered, when given), best match first."""
        words = _WORD.findall(query)
        if not words:
            return []
        params: dict[str, Any] = {"limit": limit}
        # With a user, the owner token narrows the full-text match inside the index (a
        # common word no longer means a walk over every user's messages), and `m.owner`,
        # the same value exactly, keeps this user's rows whatever the tokenizer did.
        owner = ""
        if user_id is not None:
            params["owner"] = owner_key(user_id)
            owner = "AND m.owner = :owner"
        if profile is not None:
            params["profile"] = profile
            owner += " AND m.session_id IN (SELECT id FROM sessions WHERE profile = :profile)"
        if self.dialect == "sqlite":
            terms = " ".join('"' + w.replace('"', "") + '"' for w in words)
            params["q"] = f"content : ({terms})"
            if user_id is not None:
                params["q"] = f'owner : "{params["owner"]}" AND {params["q"]}'
            # Not `ORDER BY rank` alone: FTS5 would take that over and rank every match
            # before the filters apply. The second term leaves the sort to SQLite, after
            # them, and breaks ties newest first as on PostgreSQL.
            sql = f"""
                SELECT hit.id, hit.session_id, s.key, hit.role, hit.created_at, hit.snippet
                FROM (
                    SELECT m.id, m.session_id, m.role, m.created_at,
                           messages_fts.rank AS rank,
                           snippet(messages_fts, 0, '«', '»', '…', 16) AS snippet
                    FROM messages_fts
                    JOIN messages m ON m.id = messages_fts.rowid
                    WHERE messages_fts MATCH :q AND m.role IN ('user', 'assistant') {owner}
                    ORDER BY messages_fts.rank, m.id DESC
                    LIMIT :limit
                ) hit
                JOIN sessions s ON s.id = hit.session_id
                ORDER BY hit.rank, hit.id DESC
            """
        else:
            params["q"] = " ".join(words)
            matches = "q"
            if user_id is not None:
                params["owner_q"] = f"'@{params['owner']}'"
                matches = "(q && CAST(:owner_q AS tsquery))"
            # numnode: a query of stop words only is empty, and `empty && owner` would
            # match every message of the user.
            sql = f"""
                SELECT hit.id, hit.session_id, s.key, hit.role, hit.created_at,
                       ts_headline('english', hit.content, hit.q,
                                   'StartSel=«, StopSel=», MaxWords=24, MinWords=8') AS snippet
                FROM (
                    SELECT m.id, m.session_id, m.role, m.created_at, m.content, q,
                           ts_rank(m.search, q) AS rank
                    FROM messages m, plainto_tsquery('english', :q) q
                    WHERE numnode(q) > 0 AND m.search @@ {matches}
                          AND m.role IN ('user', 'assistant') {owner}
                    ORDER BY rank DESC, m.id DESC
                    LIMIT :limit
                ) hit
                JOIN sessions s ON s.id = hit.session_id
                ORDER BY hit.rank DESC, hit.id DESC
            """
        async with self.read() as conn:
            rows = (await conn.execute(text(sql), params)).mappings().all()
        return [
            SearchHit(
                message_id=MessageId(r["id"]),
                session_id=SessionId(r["session_id"]),
                session_key=SessionKey(r["key"]),
                role=Role(r["role"]),
                snippet=str(r["snippet"]),
                created_at=aware(r["created_at"]),
            )
            for r in rows
        ]


async def current_session(conn: AsyncConnection, key: SessionKey | str) -> SessionInfo | None:
    """In the caller's transaction: `Store.get_session`."""
    row = (await conn.execute(_CURRENT_SESSION, {"key": key})).mappings().first()
    return _session(row) if row else None


async def read_history(conn: AsyncConnection, session_id: SessionId, window: int) -> History:
    """In the caller's transaction: `Store.load_history` (two statements)."""
    of_session = {"session_id": session_id}
    head = (await conn.execute(_HISTORY_HEAD, of_session)).one()
    rows = (await conn.execute(_WINDOW, {**of_session, "window": window})).mappings().all()
    upto = head.upto
    return History(
        summary=None if upto is None else str(head.summary),
        summary_upto=None if upto is None else MessageId(upto),
        messages=tuple(_message(r) for r in reversed(rows)),
        last_usage=(
            None
            if head.prompt_tokens is None
            else (int(head.prompt_tokens), int(head.completion_tokens or 0))
        ),
    )


async def busy_mode_of(conn: AsyncConnection, key: SessionKey) -> str | None:
    """In the caller's transaction: the busy mode set on the current session of `key`
    (None when it has none, or there is no session)."""
    value = await conn.scalar(
        select(sessions.c.busy_mode)
        .where(sessions.c.key == key)
        .order_by(sessions.c.epoch.desc())
        .limit(1)
    )
    return None if value is None else str(value)


async def set_setting(conn: AsyncConnection, name: str, value: str) -> None:
    """In the caller's transaction: set a runtime value."""
    now = utcnow()
    result = await conn.execute(
        update(settings).where(settings.c.key == name).values(value=value, updated_at=now)
    )
    if not result.rowcount:
        await conn.execute(insert(settings).values(key=name, value=value, updated_at=now))


async def record_start(
    conn: AsyncConnection, session_id: SessionId, user_messages: Sequence[ChatMessage]
) -> tuple[TurnId, list[MessageId]]:
    """In the caller's transaction: a running turn and the user messages that started it."""
    now = utcnow()
    turn_id = TurnId(
        (
            await conn.execute(
                _START_TURN, {"session_id": session_id, "status": "running", "started_at": now}
            )
        ).scalar_one()
    )
    ids = (
        await _insert_messages(conn, session_id, turn_id, user_messages, now)
        if user_messages
        else []
    )
    return turn_id, ids


async def turns_in_session(
    conn: AsyncConnection, session_id: SessionId, turn_ids: Sequence[TurnId]
) -> set[TurnId]:
    """Which of `turn_ids` are turns of session `session_id`."""
    if not turn_ids:
        return set()
    found = await conn.scalars(
        select(turns.c.id).where(turns.c.session_id == session_id, turns.c.id.in_(turn_ids))
    )
    return {TurnId(i) for i in found}


async def record_note(conn: AsyncConnection, session_id: SessionId, note: ChatMessage) -> None:
    """In the caller's transaction: a message in a session's history outside any turn (a
    reaction to one of the agent's messages), read with the session's next turn."""
    await _insert_messages(conn, session_id, None, [note], utcnow())


async def record_finish(
    conn: AsyncConnection, session_id: SessionId, turn_id: TurnId, result: TurnResult
) -> list[MessageId]:
    """In the caller's transaction: what the turn produced and its final status."""
    now = utcnow()
    ids = await _insert_messages(conn, session_id, turn_id, result.messages, now)
    await conn.execute(
        _FINISH_TURN,
        {
            "b_turn_id": turn_id,
            "status": result.status,
            "finished_at": now,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "error": result.error,
        },
    )
    return ids


async def _insert_messages(
    conn: AsyncConnection,
    session_id: SessionId,
    turn_id: TurnId | None,
    items: Sequence[ChatMessage],
    now: datetime,
) -> list[MessageId]:
    # No session row: the inserts below fail on the foreign key, as the caller expects.
    user_id = (
        await conn.execute(
            _TOUCH_SESSION, {"b_session_id": session_id, "b_now": now, "b_added": len(items)}
        )
    ).scalar()
    owner = None if user_id is None else owner_key(UserId(user_id))
    ids: list[MessageId] = []
    for m in items:
        new_id = (
            await conn.execute(
                _INSERT_MESSAGE,
                {
                    "session_id": session_id,
                    "owner": owner,
                    "turn_id": turn_id,
                    "role": str(m.role),
                    "content": m.content,
                    "tool_calls": [c.to_openai() for c in m.tool_calls] if m.tool_calls else None,
                    "tool_call_id": m.tool_call_id,
                    "name": m.name,
                    "interrupted": m.interrupted,
                    "created_at": m.created_at or now,
                },
            )
        ).scalar_one()
        ids.append(MessageId(new_id))
    return ids


def owner_key(user_id: UserId) -> str:
    """`messages.owner` for a session of `user_id`: lowercase hex of its UTF-8, one token."""
    return user_id.encode().hex()


def _session(row: RowMapping) -> SessionInfo:
    return SessionInfo(
        id=SessionId(row["id"]),
        key=SessionKey(row["key"]),
        epoch=int(row["epoch"]),
        platform=str(row["platform"]),
        user_id=None if row["user_id"] is None else UserId(row["user_id"]),
        busy_mode=row["busy_mode"],
        user_snapshot=str(row["user_snapshot"]),
        memory_snapshot=str(row["memory_snapshot"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        message_count=int(row["message_count"]),
        skills_snapshot=str(row["skills_snapshot"] or ""),
        profile=str(row["profile"] or "default"),
    )


def _message(row: RowMapping) -> ChatMessage:
    calls = tuple(
        ToolCall(
            id=str(c["id"]),
            name=str(c["function"]["name"]),
            arguments=str(c["function"]["arguments"]),
        )
        for c in (row["tool_calls"] or ())
    )
    return ChatMessage(
        role=Role(row["role"]),
        content=str(row["content"]),
        tool_calls=calls,
        tool_call_id=row["tool_call_id"],
        name=row["name"],
        interrupted=bool(row["interrupted"]),
        id=MessageId(row["id"]),
        created_at=row["created_at"],
    )
