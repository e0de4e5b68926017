"""Chat commands (`/stop`, `/new`, `/mode`…): a table from command to handler.

Commands bypass the queue: each is answered at once, its outcome and its answer in one
commit. A handler says what to answer and whether the running turn is to be cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from agent_core.agent import Agent
from gateway.cluster.bus import SignalAction
from gateway.commands import HELP_TEXT, WITH_TEXT, Command, ParsedCommand, parse_command
from gateway.contracts.config import BusyMode, PlatformSection
from gateway.contracts.ids import SessionKey, UserId
from gateway.contracts.messages import TextFormat
from gateway.cron.service import JobService, describe
from gateway.cron.targets import HOME_SETTING, chat_target, named_account
from gateway.profiles import DEFAULT
from gateway.sessions.context import SessionContext
from gateway.sessions.signals import ClusterSignals
from gateway.sessions.state import Lane, Running
from gateway.store import inbox as inbox_sql
from gateway.store.inbox import InboxRow, Outcome
from gateway.store.jobs import Job
from gateway.store.outbox import Chunk, Target, enqueue
from gateway.store.store import set_setting

STOPPING = (Command.STOP, Command.NEW, Command.RESET)
"""Commands that end what the session is doing."""
MODES = ", ".join(str(m) for m in BusyMode)


@dataclass(frozen=True, slots=True)
class Asked:
    """One command as its handler sees it."""

    row: InboxRow
    command: ParsedCommand
    lane: Lane | None
    running: Running | None
    section: PlatformSection | None

    @property
    def key(self) -> SessionKey:
        """The session the command was sent in."""
        return self.row.session_key


@dataclass(frozen=True, slots=True)
class Answer:
    """What a command does: its reply, its outcome, and the cancel it asks for."""

    text: str
    cancel: str | None = None
    """Cancel the running turn (here or on another instance) with this reason."""
    outcome: Outcome = Outcome.ANSWERED
    detail: str | None = None


Handler = Callable[["Commands", Asked], Awaitable[Answer]]


class Commands:
    """Runs command rows."""

    def __init__(self, ctx: SessionContext, signals: ClusterSignals) -> None:
        self.ctx = ctx
        self.signals = signals

    async def run(self, row: InboxRow) -> None:
        """Act on a command row and answer it; the row's outcome and the answer in one commit."""
        ctx = self.ctx
        if ctx.clustered:
            # Another instance may be recovering the same row: whoever takes it runs it.
            async with ctx.store.write() as conn:
                if not await inbox_sql.take_command(conn, row.id, ctx.instance):
                    return
        lane = ctx.lanes.get(row.session_key)
        parsed = parse_command(row.text)
        if lane is None or parsed is None or parsed.command not in STOPPING:
            await self._run(row, parsed, lane)
            return
        # Not while a turn of this lane is settling its outcome: either that turn sees this
        # stop (and drops what it would have tried again), or its rows are back in the queue
        # before this command clears it.
        async with lane.settling:
            lane.stops += 1
            try:
                await self._run(row, parsed, lane)
            finally:
                # Counted again once its writes are in: a batch read while it ran (before
                # /new stored the waiting rows again) is stale, and its turn must read anew.
                lane.stops += 1

    async def _run(self, row: InboxRow, parsed: ParsedCommand | None, lane: Lane | None) -> None:
        ctx = self.ctx
        running = lane.running if lane else None
        if parsed is None:  # cannot happen for stored command rows; answer rather than crash
            answer = Answer(HELP_TEXT)
        else:
            asked = Asked(
                row, parsed, lane, running, ctx.platforms.get((row.platform, row.account))
            )
            handler = HANDLERS.get(parsed.command, Commands._usage)
            answer = await handler(self, asked)
        target = Target(row.platform, row.account, row.chat_id, row.thread_id)
        detail = answer.detail or (f"/{parsed.command}" if parsed else "command")
        async with ctx.store.write() as conn:
            await inbox_sql.settle(conn, [row.id], answer.outcome, detail=detail)
            reply = Chunk(f"cmd:{row.id}", target, answer.text, format=TextFormat.PLAIN)
            await enqueue(conn, [reply])
        ctx.metrics.outcomes.labels(outcome=str(answer.outcome)).inc()
        ctx.on_outbox()
        if answer.cancel is not None and running is not None:
            running.cancel(answer.cancel)
        elif answer.cancel is not None:
            await self.signals.tell_owner(row.session_key, SignalAction.CANCEL, answer.cancel)

    # handlers, one per command ---------------------------------------------------------------

    async def _help(self, asked: Asked) -> Answer:
        return Answer(HELP_TEXT)

    async def _usage(self, asked: Asked) -> Answer:
        """`/queue`, `/steer`, `/interrupt` without a text."""
        return Answer(f"Usage: /{asked.command.command} TEXT")

    async def _stop(self, asked: Asked) -> Answer:
        ctx, key = self.ctx, asked.key
        async with ctx.store.read() as conn:
            waiting = await inbox_sql.pending(conn, key)
        async with ctx.store.write() as conn:
            n = await inbox_sql.settle(
                conn,
                [r.id for r in waiting],
                Outcome.DROPPED,
                detail="cleared by /stop",
                only_pending=True,
            )
        if n:
            ctx.metrics.outcomes.labels(outcome=str(Outcome.DROPPED)).inc(n)
        lane, running = asked.lane, asked.running
        remote = None if running is not None else await self.signals.elsewhere(key)
        busy = (
            running is not None
            or (lane is not None and lane.worker is not None and n == 0)
            or (remote is not None and remote.running)
        )
        stopped = "Stopped." if busy else "Nothing was running."
        plural = "s" if n != 1 else ""
        return Answer(f"⏹ {stopped} Cleared {n} queued message{plural}.", "stopped by /stop")

    async def _new(self, asked: Asked) -> Answer:
        ctx, key, row = self.ctx, asked.key, asked.row
        old = await ctx.store.get_session(key)
        agent = await ctx.agent_of(row)  # the profile bound to the chat now
        await ctx.store.open_session(
            key,
            platform=row.platform,
            user_id=await ctx.owner(row),  # who they are now (an unlinked identity: its own)
            snapshot=ctx.snapshot_of(row, agent),
            new_epoch=True,
            profile=agent.profile,
        )
        if old is not None and old.busy_mode:
            await ctx.store.set_busy_mode(key, old.busy_mode)
        ended = False
        async with ctx.store.write() as conn:
            # What still waits is answered in the new conversation, so it goes there too.
            await inbox_sql.restore_pending(conn, key)
            if (
                old is not None
                and ctx.memory_sync is not None
                and row.is_direct
                and ctx.shares_memory(old)
            ):
                ended = await ctx.memory_sync.session_end(conn, old)  # groups are not synced
        if ended and ctx.memory_sync is not None:
            ctx.memory_sync.wake()
        return Answer(
            "✨ Started a new conversation. Earlier messages stay searchable.",
            "the session was reset with /new",
        )

    async def _mode(self, asked: Asked) -> Answer:
        ctx, key, arg = self.ctx, asked.key, asked.command.arg
        if not arg:
            async with ctx.store.read() as conn:
                current = await ctx.mode(conn, key, asked.section)
            return Answer(f"Busy mode: {current}. Choose with /mode {'|'.join(BusyMode)}.")
        row = asked.row
        if not row.is_direct and not ctx.is_operator(row.platform, row.sender_id, row.account):
            # Everyone in a group lives with its busy mode: steer mode lets one person's
            # words into another's running turn, so only an operator chooses it there.
            return Answer(
                "🚫 Only Herald's operator can change the busy mode of a group; "
                "you can choose yours with /mode in your direct chat with me.",
                outcome=Outcome.REJECTED,
                detail="/mode: not an operator",
            )
        try:
            mode = BusyMode(arg.strip().lower())
        except ValueError:
            return Answer(f"Unknown mode {arg!r}. Use one of: {MODES}.")
        if await ctx.store.get_session(key) is None:
            agent = await ctx.agent_of(asked.row)
            await ctx.store.open_session(
                key,
                platform=asked.row.platform,
                user_id=await ctx.owner(asked.row),
                snapshot=ctx.snapshot_of(asked.row, agent),
                profile=agent.profile,
            )
        await ctx.store.set_busy_mode(key, str(mode))
        return Answer(f"Busy mode set to {mode}.")

    async def _status(self, asked: Asked) -> Answer:
        ctx, key, running = self.ctx, asked.key, asked.running
        session = await ctx.store.get_session(key)
        async with ctx.store.read() as conn:
            mode = await ctx.mode(conn, key, asked.section)
            waiting = await inbox_sql.count_waiting(conn, key)
        lines = [f"Session {key}"]
        if session is not None:
            lines.append(f"Conversation #{session.epoch + 1}, {session.message_count} messages")
        lines.append(f"Busy mode: {mode}")
        remote = None if running is not None else await self.signals.elsewhere(key)
        if running is not None:
            lines.append(f"Answering now (for {time.monotonic() - running.started:.0f}s)")
        elif remote is not None and remote.running:
            lines.append(f"Answering now (on instance {remote.owner})")
        else:
            lines.append("Idle")
        lines.append(f"Waiting: {waiting}")
        return Answer("\n".join(lines))

    async def _cron(self, asked: Asked) -> Answer:
        """The scheduled jobs of the chat's profile that report to this chat (by name, or as
        a home channel: `/sethome`'s or one of `home.targets`), and in a direct chat the
        sender's own too (never in a group: everyone there would read them)."""
        ctx, row = self.ctx, asked.row
        service = JobService(ctx.store, configured=ctx.platforms)
        user_id = (
            await ctx.store.resolve_user(row.platform, row.sender_id, row.sender_name)
            if row.is_direct
            else None
        )
        here = chat_target(
            row.platform,
            row.chat_id,
            row.thread_id,
            named_account(row.platform, row.account, ctx.platforms),
        )
        profile = (await ctx.agent_of(row)).profile  # another profile's jobs are not shown
        if profile == DEFAULT:
            homes, sethome = ctx.homes, await ctx.store.get_setting(HOME_SETTING)
        else:  # `home` of a job of another profile is that profile's home
            homes, sethome = ctx.profile_homes.get(profile, ()), None
        reporting = {j.id for j in await service.delivering_to(here, homes=homes, sethome=sethome)}
        found = [
            j
            for j in await service.find()
            if j.profile == profile
            and ((user_id is not None and j.user_id == user_id) or j.id in reporting)
        ]
        return Answer(jobs_answer(service, found))

    async def _skills(self, asked: Asked) -> Answer:
        """The skills a turn of this session may use (the sender's own included)."""
        ctx, row = self.ctx, asked.row
        user_id = await ctx.owner(row)
        return Answer(skills_answer(ctx, row.session_key, user_id, await ctx.agent_of(row)))

    async def _sethome(self, asked: Asked) -> Answer:
        ctx, row = self.ctx, asked.row
        if ctx.access is not None and not ctx.access.is_operator(
            row.platform, row.sender_id, row.account
        ):
            # The home channel receives the operator's reports: nobody else may redirect them.
            return Answer(
                "🚫 Only Herald's operator can choose where scheduled reports go. "
                f"(An operator lists {row.platform}:{row.sender_id} in access.operators.)",
                outcome=Outcome.REJECTED,
                detail="/sethome: not an operator",
            )
        profile = (await ctx.agent_of(row)).profile
        if profile != DEFAULT:
            # /sethome chooses the default profile's home; this chat's profile has its own.
            return Answer(
                f"This chat answers as profile {profile}: its scheduled reports go to "
                f"profiles.{profile}.home in the config file. /sethome chooses the default "
                "profile's home: send it in a chat of the default profile.",
                outcome=Outcome.REJECTED,
                detail=f"/sethome: a chat of profile {profile}",
            )
        home = chat_target(
            row.platform,
            row.chat_id,
            row.thread_id,
            named_account(row.platform, row.account, ctx.platforms),
        )
        async with ctx.store.write() as conn:
            await set_setting(conn, HOME_SETTING, home)
        return Answer(f"🏠 Scheduled reports will come to this chat ({home}).")

    async def _approve(self, asked: Asked) -> Answer:
        return await self._decide(asked, approve=True)

    async def _deny(self, asked: Asked) -> Answer:
        return await self._decide(asked, approve=False)

    async def _decide(self, asked: Asked, *, approve: bool) -> Answer:
        """`/approve` and `/deny`: a tool call waiting in this session (see
        `gateway/tools/approvals.py`; only the person who asked, or an operator)."""
        ctx, row = self.ctx, asked.row
        if ctx.approvals is None:
            return Answer("No tool here asks for approval.")
        operator = ctx.access is not None and ctx.access.is_operator(
            row.platform, row.sender_id, row.account
        )
        decided = await ctx.approvals.decide(
            row.session_key,
            f"{row.platform}:{row.sender_id}",
            asked.command.arg,
            approve=approve,
            operator=operator,
        )
        if decided.forbidden:
            return Answer(
                decided.text,
                outcome=Outcome.REJECTED,
                detail=f"/{asked.command.command}: not theirs",
            )
        return Answer(decided.text)


HANDLERS: dict[Command, Handler] = {
    Command.HELP: Commands._help,
    Command.STOP: Commands._stop,
    Command.NEW: Commands._new,
    Command.RESET: Commands._new,
    Command.MODE: Commands._mode,
    Command.STATUS: Commands._status,
    Command.CRON: Commands._cron,
    Command.SKILLS: Commands._skills,
    Command.SETHOME: Commands._sethome,
    Command.APPROVE: Commands._approve,
    Command.DENY: Commands._deny,
    **{c: Commands._usage for c in WITH_TEXT},
}
"""Every command's handler (a command with a text never reaches here with one)."""


def skills_answer(
    ctx: SessionContext, key: SessionKey, user_id: UserId | None, agent: Agent | None = None
) -> str:
    """What `/skills` answers: the skills a turn of session `key` for `user_id` may use
    (with `agent`: in its profile; else the default one's)."""
    agent = agent or ctx.agent
    if agent.skills is None:
        return "Skills are turned off here."
    found = agent.skills.store.visible(agent.memory.skill_owner(key, user_id))
    if not found:
        return "No skills yet. When a task works out, I may save it as one."
    lines = [f"Skills ({len(found)}): send /NAME TEXT to use one."]
    lines.extend(f"• /{s.name} — {_first_sentence(s.description)}" for s in found)
    return "\n".join(lines)


def jobs_answer(service: JobService, found: Sequence[Job]) -> str:
    """What `/cron` answers for the jobs `found`."""
    if not found:
        return "No scheduled jobs here. Ask me to schedule one, e.g. “every weekday at 9…”."
    lines = [f"Scheduled jobs ({len(found)}):"]
    lines.extend(f"• {describe(j, service.next_run(j))}" for j in found)
    return "\n".join(lines)


def _first_sentence(text: str, limit: int = 100) -> str:
    """The description's first sentence, cut to `limit` characters."""
    head = text.split(". ", 1)[0]
    return head if len(head) <= limit else head[: limit - 1] + "…"
