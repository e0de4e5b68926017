"""Commands typed in an API session (and so in `herald chat`): the same table as a platform
chat's (`gateway/commands.py`), each answered at once without a model call, or with where it
applies instead. Nothing is stored for them but what the command itself changes."""

from __future__ import annotations

import time

from gateway.commands import API_HELP_TEXT, Command, ParsedCommand, Surface, applies, not_here
from gateway.contracts.history import SessionInfo
from gateway.contracts.ids import Origin, SessionKey, UserId
from gateway.cron.service import JobService
from gateway.profiles import DEFAULT
from gateway.sessions.commands import jobs_answer, skills_answer
from gateway.sessions.context import SessionContext

STATELESS = (
    "applies to a named session (X-Herald-Session-Id or user); "
    "a request without one has no conversation to act on"
)


class ApiCommands:
    """Answers the commands of API requests."""

    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx

    async def answer(
        self, key: SessionKey | None, user_id: UserId | None, parsed: ParsedCommand
    ) -> str:
        """The reply to `parsed`, typed in session `key` (None: a stateless request) by
        `user_id`, the session's owner (the caller was checked to be them)."""
        command = parsed.command
        if not applies(command, Surface.API):
            return not_here(command, Surface.API)
        if command is Command.HELP:
            return API_HELP_TEXT
        if command is Command.SKILLS:
            return skills_answer(self.ctx, key or SessionKey("api:stateless"), user_id)
        if key is None:
            return f"/{command} {STATELESS}."
        if command is Command.CRON:
            service = JobService(self.ctx.store, configured=self.ctx.platforms)
            session = await self.ctx.store.get_session(key)
            profile = DEFAULT if session is None else session.profile
            mine = [] if user_id is None else await service.find(user_id=user_id)
            return jobs_answer(service, [j for j in mine if j.profile == profile])
        if command is Command.STATUS:
            return await self._status(key)
        return await self._new(key, user_id)

    async def _status(self, key: SessionKey) -> str:
        session = await self.ctx.store.get_session(key)
        lines = [f"Session {key}"]
        if session is None:
            lines.append("No messages yet")
        else:
            lines.append(f"Conversation #{session.epoch + 1}, {session.message_count} messages")
        lane = self.ctx.lanes.get(key)
        running = lane.running if lane is not None else None
        if running is not None:
            lines.append(f"Answering now (for {time.monotonic() - running.started:.0f}s)")
        else:
            lines.append("Idle")
        return "\n".join(lines)

    async def _new(self, key: SessionKey, user_id: UserId | None) -> str:
        ctx = self.ctx
        lane = ctx.lanes.get(key)
        if lane is not None and lane.running is not None:
            return (
                "A turn is answering in this session now; send /new after its answer "
                "(or close that request to stop it)."
            )
        old = await ctx.store.get_session(key)
        profile = DEFAULT if old is None else old.profile  # the next conversation is its too
        await ctx.store.open_session(
            key,
            platform=str(Origin.API),
            user_id=user_id,
            snapshot=ctx.profile(profile).snapshot,
            new_epoch=True,
            profile=profile,
        )
        if (
            old is not None
            and ctx.memory_sync is not None
            and ctx.shares_memory(old)
            and await self._ended(old)
        ):
            ctx.memory_sync.wake()
        return "✨ Started a new conversation. Earlier messages stay searchable."

    async def _ended(self, old: SessionInfo) -> bool:
        assert self.ctx.memory_sync is not None
        async with self.ctx.store.write() as conn:
            return await self.ctx.memory_sync.session_end(conn, old)
