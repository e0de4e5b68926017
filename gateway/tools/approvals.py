"""Approval in the chat: a tool call that needs the person's yes waits for `/approve`.

The question is a `tool_approvals` row (written with the message that asks, in one commit)
and a chat message through the outbox; the turn waits without blocking any other session.
`/approve` and `/deny` decide it: only the person whose message the turn answers, or an
operator. No answer within the timeout means no. A restart while waiting loses nothing: the
turn runs again, its call finds the same row (by session, tool and arguments) and asks again;
a yes given meanwhile is used at once. A /stop while waiting cancels the question.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from agent_core.tools.approval import ApprovalOutcome, ApprovalRequest, Verdict
from agent_core.tools.base import ToolContext, ToolError
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import Origin, SessionId, TurnId
from gateway.contracts.messages import Button, TextFormat, utcnow
from gateway.store import Store
from gateway.store import approvals as sql
from gateway.store.approvals import ApprovalRow, ApprovalStatus
from gateway.store.outbox import Chunk, Target, enqueue
from gateway.tools.places import session_target

logger = logging.getLogger(__name__)

POLL = 1.0
"""Seconds between looks at the row (a decision taken on another instance)."""
SECRET_KEY = re.compile(
    r"pass(word|wd|phrase)?|secret|token|api[-_]?key|auth|credential|private[-_]?key|cookie"
    r"|session[-_]?id|signature",
    re.I,
)
SECRET_VALUE = re.compile(
    r"(\bBearer\s+)\S+|(\b[a-z][\w+.-]*://[^\s:/@]+:)[^\s@/]+@|\b(sk|ghp|gho|xox[abp])[-_][\w-]{8,}",
    re.I,
)
MASK = "***"
VALUE_CHARS = 300
ARGUMENTS_CHARS = 2500
"""The arguments shown in a question at most (it must fit one message on every platform)."""


def mask(value: Any, key: str = "") -> Any:
    """Arguments with secrets masked: values under secret-looking keys, and credentials
    shaped like tokens inside strings."""
    if key and SECRET_KEY.search(key):
        return MASK
    if isinstance(value, Mapping):
        return {str(k): mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask(v) for v in value]
    if isinstance(value, str):
        return SECRET_VALUE.sub(_mask_match, value)
    return value


def _mask_match(match: re.Match[str]) -> str:
    if match.group(1):
        return match.group(1) + MASK
    if match.group(2):
        return match.group(2) + MASK + "@"
    return MASK


def readable(arguments: Mapping[str, Any]) -> str:
    """The arguments, one `name: value` a line, secrets masked, long values cut."""
    if not arguments:
        return "  (no arguments)"
    lines = []
    for name, value in mask(arguments).items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(text) > VALUE_CHARS:
            text = text[:VALUE_CHARS] + f"… ({len(text)} characters)"
        lines.append(f"  {name}: {text}")
    shown = "\n".join(lines)
    if len(shown) > ARGUMENTS_CHARS:
        shown = shown[:ARGUMENTS_CHARS] + "\n  … (more arguments not shown)"
    return shown


def call_key(session_key: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """What identifies one call across restarts: the session, the tool, the arguments."""
    text = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(f"{session_key}\0{tool}\0{text}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Decided:
    """What `/approve` or `/deny` did: its reply, and whether it was refused."""

    text: str
    refused: bool = False
    """Nothing was decided (a bad number, nothing pending, or not allowed)."""
    forbidden: bool = False
    """The sender may not decide it."""


class ChatApprovals:
    """The gateway's `Approvals`: asks in the session's chat, decides on `/approve`."""

    def __init__(
        self,
        store: Store,
        sections: Mapping[str, PlatformSection],
        *,
        allow_api: bool = False,
        on_outbox: Callable[[], None] = lambda: None,
        poll: float = POLL,
    ) -> None:
        self.store = store
        self.sections = dict(sections)
        self.allow_api = allow_api
        self.on_outbox = on_outbox
        self.poll = poll
        self._events: dict[int, asyncio.Event] = {}

    async def ask(self, ctx: ToolContext, request: ApprovalRequest) -> ApprovalOutcome:
        """Ask in the chat and wait for the decision (see the module docstring)."""
        session = ctx.session
        if session is not None and session.platform == str(Origin.API):
            if self.allow_api:
                return ApprovalOutcome(Verdict.APPROVED, "api (api.allow_approval_tools)")
            raise ToolError(
                f"{request.tool} needs a person's approval in a chat, and a call over the HTTP "
                "API cannot ask for it, so it did not run (the operator may allow such tools "
                "over the API with api.allow_approval_tools)"
            )
        target = None if session is None else session_target(session.key, self.sections)
        if session is None or target is None:
            raise ToolError(
                f"{request.tool} needs a person's approval in a chat, and this run (a "
                "scheduled job, or no chat) has nobody to ask, so it did not run"
            )
        key = call_key(session.key, request.tool, request.arguments)
        now = utcnow()
        expires = now + timedelta(seconds=request.timeout)
        async with self.store.write() as conn:
            row = await sql.open_approval(conn, key)
            if row is not None and row.status is ApprovalStatus.APPROVED:
                await sql.close_approval(conn, row.id, ApprovalStatus.USED, now)
                return ApprovalOutcome(Verdict.APPROVED, row.decided_by)
            if row is None:
                approval_id = await sql.insert_approval(
                    conn,
                    {
                        "session_key": session.key,
                        "turn_id": ctx.turn_id,
                        "call_key": key,
                        "tool": request.tool,
                        "arguments": json.dumps(mask(request.arguments), ensure_ascii=False),
                        "requester": ctx.sender,
                        "created_at": now,
                        "expires_at": expires,
                    },
                )
                asked = 1
            else:
                approval_id, asked = row.id, row.asked + 1
                await sql.ask_again(conn, row.id, turn_id=ctx.turn_id, expires_at=expires)
            text = self._question(approval_id, request, ctx.sender, asked)
            buttons = (
                Button("✅ Approve", f"/approve {approval_id}"),
                Button("❌ Deny", f"/deny {approval_id}"),
            )
            chunk_key = f"approval:{approval_id}:{asked}"
            question = self._chunk(chunk_key, target, text, session.id, ctx, buttons=buttons)
            await enqueue(conn, [question])
        self.on_outbox()
        logger.info("tool %s in %s waits for approval #%d", request.tool, session.key, approval_id)
        try:
            return await self._wait(approval_id, target, request, session.id, ctx)
        except asyncio.CancelledError:
            await asyncio.shield(self._cancel(approval_id))
            raise
        finally:
            self._events.pop(approval_id, None)

    def _chunk(
        self,
        key: str,
        target: Target,
        text: str,
        session_id: SessionId,
        ctx: ToolContext,
        *,
        buttons: tuple[Button, ...] = (),
    ) -> Chunk:
        turn = None if ctx.turn_id is None else TurnId(ctx.turn_id)
        return Chunk(
            key,
            target,
            text,
            format=TextFormat.PLAIN,
            session_id=session_id,
            turn_id=turn,
            buttons=buttons,
        )

    @staticmethod
    def _question(
        approval_id: int, request: ApprovalRequest, sender: str | None, asked: int
    ) -> str:
        minutes = request.timeout / 60
        wait = f"{minutes:g} min" if minutes >= 1 else f"{request.timeout:g} s"
        again = " (asked again after a restart)" if asked > 1 else ""
        who = f" by {sender}" if sender else ""
        return (
            f"🔐 Approval needed #{approval_id}{again}\n"
            f"I want to run the tool {request.tool} with:\n{readable(request.arguments)}\n"
            f"Reply /approve {approval_id} or /deny {approval_id} (only the person who asked"
            f"{who}, or an operator). No answer within {wait} means no."
        )

    async def _wait(
        self,
        approval_id: int,
        target: Target,
        request: ApprovalRequest,
        session_id: SessionId,
        ctx: ToolContext,
    ) -> ApprovalOutcome:
        event = self._events.setdefault(approval_id, asyncio.Event())
        while True:
            event.clear()
            async with self.store.read() as conn:
                row = await sql.get_approval(conn, approval_id)
            if row is None:
                raise ToolError("the approval was withdrawn; the tool did not run")
            if row.status is ApprovalStatus.APPROVED:
                async with self.store.write() as conn:
                    await sql.close_approval(conn, approval_id, ApprovalStatus.USED, utcnow())
                return ApprovalOutcome(Verdict.APPROVED, row.decided_by)
            if row.status is ApprovalStatus.DENIED:
                return ApprovalOutcome(Verdict.DENIED, row.decided_by)
            if row.status is not ApprovalStatus.PENDING:
                return ApprovalOutcome(Verdict.TIMED_OUT)
            left = (row.expires_at - utcnow()).total_seconds()
            if left <= 0:
                return await self._time_out(row, target, request, session_id, ctx)
            try:
                async with asyncio.timeout(min(left, self.poll)):
                    await event.wait()
            except TimeoutError:
                pass

    async def _time_out(
        self,
        row: ApprovalRow,
        target: Target,
        request: ApprovalRequest,
        session_id: SessionId,
        ctx: ToolContext,
    ) -> ApprovalOutcome:
        async with self.store.write() as conn:
            if not await sql.decide_approval(
                conn, row.id, ApprovalStatus.TIMED_OUT, by=None, now=utcnow()
            ):
                return await self._wait(
                    row.id, target, request, session_id, ctx
                )  # decided just now
            text = f"⌛ Approval #{row.id} for {request.tool} timed out: it did not run."
            await enqueue(
                conn, [self._chunk(f"approval:{row.id}:timeout", target, text, session_id, ctx)]
            )
        self.on_outbox()
        return ApprovalOutcome(Verdict.TIMED_OUT)

    async def _cancel(self, approval_id: int) -> None:
        try:
            async with self.store.write() as conn:
                await sql.close_approval(conn, approval_id, ApprovalStatus.CANCELLED, utcnow())
        except Exception as err:  # the row stays pending; a restarted turn asks again
            logger.warning("approval #%d: could not record the cancellation: %s", approval_id, err)

    async def decide(
        self, session_key: str, sender: str, arg: str, *, approve: bool, operator: bool
    ) -> Decided:
        """`/approve [ID]` or `/deny [ID]` sent by `sender` in the session `session_key`."""
        verb = "approve" if approve else "deny"
        wanted = arg.strip().lstrip("#")
        if wanted and not wanted.isdigit():
            return Decided(f"Usage: /{verb} [NUMBER] (the number in the approval request)", True)
        async with self.store.write() as conn:
            pending = await sql.pending_approvals(conn, session_key)
            if wanted:
                pending = [r for r in pending if r.id == int(wanted)]
            if not pending:
                where = f" #{wanted}" if wanted else ""
                return Decided(f"Nothing is waiting for approval{where} here.", True)
            row = pending[-1]
            if row.requester and row.requester != sender and not operator:
                return Decided(
                    f"🚫 Only the person who asked ({row.requester}) or an operator can "
                    f"{verb} #{row.id}.",
                    refused=True,
                    forbidden=True,
                )
            status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
            if not await sql.decide_approval(conn, row.id, status, by=sender, now=utcnow()):
                return Decided(f"Approval #{row.id} was already decided.", True)
        event = self._events.get(row.id)
        if event is not None:
            event.set()
        if approve:
            return Decided(f"✅ Approved #{row.id}: running {row.tool}.")
        return Decided(f"❌ Denied #{row.id}: {row.tool} will not run.")
