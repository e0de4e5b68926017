"""Approval in the chat: a tool call that needs the person's yes waits for `/approve`.

The question is a `tool_approvals` row (written with the message that asks, in one commit)
and a chat message through the outbox; the turn waits without blocking any other session.
`/approve` and `/deny` decide it: only the person whose message the turn answers, or an
operator. No answer within the timeout means no. A restart while waiting loses nothing: the
turn runs again, its call finds the same row (by session, tool and arguments) and asks again;
a yes given meanwhile is used at once. A /stop while waiting cancels the question.

The person approves what runs: every argument is shown in full (strings quoted, line breaks,
runs of spaces and invisible characters written out), over several messages when it is long;
the row keeps exactly those arguments and the tool runs only with arguments of the same
digest. A call that cannot be shown in full (too long for the chat, or holding a configured
secret, which every message masks) is refused and the person is told why.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from agent_core.tools.approval import (
    ApprovalOutcome,
    ApprovalRequest,
    Verdict,
    arguments_digest,
    canonical_arguments,
)
from agent_core.tools.base import ToolContext, ToolError
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import Origin, SessionId, TurnId
from gateway.contracts.messages import Button, SendLimits, TextFormat, utcnow
from gateway.store import Store
from gateway.store import approvals as sql
from gateway.store.approvals import ApprovalRow, ApprovalStatus
from gateway.store.outbox import Chunk, Target, enqueue
from gateway.tools.places import session_target

logger = logging.getLogger(__name__)

POLL = 1.0
"""Seconds between looks at the row (a decision taken on another instance)."""
MAX_PARTS = 10
"""The most messages one approval question may take; a longer call is refused."""
PART_CHARS = 1000
"""A part's length on platforms that allow less per message than twice this."""
_SPACES = re.compile(r"( {2,})")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_MARKS = frozenset("\u27e8\u27e9")
"""⟨ and ⟩ frame what Herald writes out (`⟨300 spaces⟩`); in arguments they are escaped."""
CONTINUED = " \u27e8continued\u27e9"
LEGEND = (
    "strings are in quotes; \\n is a line break, \u27e8N spaces\u27e9 is N spaces, "
    "\\uXXXX an invisible character, \u27e8continued\u27e9 a line that goes on in the next message"
)


def _char(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    if c == " ":
        return c
    if c in _MARKS or unicodedata.category(c)[0] in "CZ":
        # Control, format (zero-width, bidi), private, unassigned characters and every
        # space or separator other than the plain space: written out, never rendered.
        return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
    return c


def visible(text: str) -> str:
    """`text` quoted, with nothing a reader could miss: escapes for line breaks, quotes,
    backslashes and invisible characters, and each run of spaces counted (`⟨300 spaces⟩`).
    Two different strings never look the same."""
    out = []
    for i, piece in enumerate(_SPACES.split(text)):
        if i % 2:
            out.append(f"\u27e8{len(piece)} spaces\u27e9")
        else:
            out.append("".join(_char(c) for c in piece))
    return '"' + "".join(out) + '"'


def shown(value: Any) -> str:
    """A JSON value as the person sees it: strings through `visible`, the rest as JSON."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{visible(str(k))}: {shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return json.dumps(value)


def readable(arguments: Mapping[str, Any]) -> str:
    """The arguments, one `name: value` a line, in full (see `visible`)."""
    if not arguments:
        return "  (no arguments)"
    lines = []
    for name, value in arguments.items():
        label = name if _NAME.fullmatch(name) else visible(name)
        lines.append(f"  {label}: {shown(value)}")
    return "\n".join(lines)


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def split_lines(body: str, room: int) -> list[list[str]]:
    """The lines of `body` in groups of at most `room` characters; a longer line is cut
    into pieces that end with `CONTINUED`."""
    pieces: list[str] = []
    width = room - len(CONTINUED)
    for whole in body.split("\n"):
        line = whole
        while len(line) > room:
            pieces.append(line[:width] + CONTINUED)
            line = "  " + line[width:]
        pieces.append(line)
    groups: list[list[str]] = [[]]
    size = 0
    for piece in pieces:
        if groups[-1] and size + len(piece) + 1 > room:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += len(piece) + 1
    return groups


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
        sections: Mapping[tuple[str, str], PlatformSection],
        *,
        allow_api: bool = False,
        on_outbox: Callable[[], None] = lambda: None,
        poll: float = POLL,
        redact: Callable[[str], str] = lambda text: text,
        limits: Callable[[str, str], SendLimits] = lambda platform, account: SendLimits(),
    ) -> None:
        self.store = store
        self.sections = dict(sections)
        self.allow_api = allow_api
        self.on_outbox = on_outbox
        self.poll = poll
        self.redact = redact
        """Masks the configured secrets (as every message to a person is masked): a call
        with anything it masks cannot be shown in full."""
        self.limits = limits
        """What one message may hold, by (platform, account)."""
        self._events: dict[int, asyncio.Event] = {}

    async def ask(self, ctx: ToolContext, request: ApprovalRequest) -> ApprovalOutcome:
        """Ask in the chat and wait for the decision (see the module docstring)."""
        session = ctx.session
        if session is not None and session.platform == str(Origin.API):
            if self.allow_api:
                return ApprovalOutcome(
                    Verdict.APPROVED,
                    "api (api.allow_approval_tools)",
                    arguments_digest(request.arguments),
                )
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
        body = readable(request.arguments)
        limits = self.limits(target.platform, target.account)
        budget = max(min(limits.max_chunk, PART_CHARS), limits.max_chunk // 2)
        groups = split_lines(body, max(budget - 300, 400))  # room for the header
        why = self._unshowable(request, body, groups)
        if why is not None:
            await self._refuse(
                key,
                target=target,
                request=request,
                body=body,
                why=why,
                session_id=session.id,
                ctx=ctx,
            )
        arguments = canonical_arguments(request.arguments)
        now = utcnow()
        expires = now + timedelta(seconds=request.timeout)
        async with self.store.write() as conn:
            row = await sql.open_approval(conn, key)
            if row is not None and row.arguments != arguments:  # asked before this rule
                await sql.close_approval(conn, row.id, ApprovalStatus.CANCELLED, now)
                row = None
            if row is not None and row.status is ApprovalStatus.APPROVED:
                await sql.close_approval(conn, row.id, ApprovalStatus.USED, now)
                return ApprovalOutcome(
                    Verdict.APPROVED, row.decided_by, arguments_digest(arguments)
                )
            if row is None:
                approval_id = await sql.insert_approval(
                    conn,
                    {
                        "session_key": session.key,
                        "turn_id": ctx.turn_id,
                        "call_key": key,
                        "tool": request.tool,
                        "arguments": arguments,
                        "requester": ctx.sender,
                        "created_at": now,
                        "expires_at": expires,
                    },
                )
                asked = 1
            else:
                approval_id, asked = row.id, row.asked + 1
                await sql.ask_again(conn, row.id, turn_id=ctx.turn_id, expires_at=expires)
            texts = self._question(
                approval_id, request, sender=ctx.sender, asked=asked, groups=groups, body=body
            )
            buttons = (
                Button("✅ Approve", f"/approve {approval_id}"),
                Button("❌ Deny", f"/deny {approval_id}"),
            )
            chunks = [
                self._chunk(
                    f"approval:{approval_id}:{asked}" + (f":{n}" if n else ""),
                    target,
                    text,
                    session.id,
                    ctx,
                    buttons=buttons if n == len(texts) - 1 else (),
                )
                for n, text in enumerate(texts)
            ]
            await enqueue(conn, chunks)
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

    def _unshowable(
        self, request: ApprovalRequest, body: str, groups: list[list[str]]
    ) -> str | None:
        """Why the call cannot be shown in full here, or None."""
        texts = (body, *_strings(request.arguments))
        if any(self.redact(text) != text for text in texts):
            return "its arguments contain a configured secret, which every message masks"
        if len(groups) > MAX_PARTS:
            return (
                f"its arguments ({len(body)} characters shown) do not fit in {MAX_PARTS} "
                "messages here"
            )
        return None

    async def _refuse(
        self,
        key: str,
        *,
        target: Target,
        request: ApprovalRequest,
        body: str,
        why: str,
        session_id: SessionId,
        ctx: ToolContext,
    ) -> None:
        """Tell the person the call was refused and why; raise the ToolError for the model."""
        masked = self.redact(body)
        if len(masked) > 1500:
            masked = masked[:1500] + f"… (cut: {len(masked)} characters)"
        text = (
            f"🚫 I did not run the tool {request.tool}: {why}, and a call I cannot show you "
            f"in full is not run. What it asked for (masked, not approvable):\n{masked}"
        )
        chunk_key = f"approval-refused:{key}:{ctx.turn_id}"
        async with self.store.write() as conn:
            await enqueue(conn, [self._chunk(chunk_key, target, text, session_id, ctx)])
        self.on_outbox()
        logger.info("tool %s refused without asking: %s", request.tool, why)
        raise ToolError(
            f"{request.tool} did not run: {why}, so the person cannot see the call in full to "
            "approve it. Do not put secrets or credentials in tool arguments; split long work "
            "into smaller calls"
        )

    @staticmethod
    def _question(
        approval_id: int,
        request: ApprovalRequest,
        *,
        sender: str | None,
        asked: int,
        groups: list[list[str]],
        body: str,
    ) -> list[str]:
        """The question's messages: the header, every line of the arguments, the footer."""
        minutes = request.timeout / 60
        wait = f"{minutes:g} min" if minutes >= 1 else f"{request.timeout:g} s"
        again = " (asked again after a restart)" if asked > 1 else ""
        who = f" by {sender}" if sender else ""
        legend = f" ({LEGEND})" if "\\" in body or "\u27e8" in body else ""
        tool = "".join(_char(c) for c in request.tool)
        count = len(groups)
        texts = []
        for n, group in enumerate(groups, 1):
            if n == 1:
                head = (
                    f"🔐 Approval needed #{approval_id}{again}\n"
                    f"I want to run the tool {tool} with these arguments, shown in "
                    f"full{legend}:\n"
                )
            else:
                head = f"🔐 Approval #{approval_id}, part {n} of {count}:\n"
            tail = f"\n(part {n} of {count}: the call goes on in the next message)"
            if n == count:
                tail = (
                    f"\nReply /approve {approval_id} or /deny {approval_id} (only the person "
                    f"who asked{who}, or an operator). No answer within {wait} means no."
                )
            texts.append(head + "\n".join(group) + tail)
        return texts

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
                # What runs is what the row keeps, which is what was shown.
                return ApprovalOutcome(
                    Verdict.APPROVED, row.decided_by, arguments_digest(row.arguments)
                )
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
            missing = await sql.unsent_parts(conn, row.id, row.asked) if approve else 0
            if missing:
                return Decided(
                    f"Approval #{row.id} is not all here yet: {missing} of its messages did not "
                    f"reach this chat, and a call is approved only once seen in full. Wait for "
                    f"them, or /deny {row.id}.",
                    True,
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
