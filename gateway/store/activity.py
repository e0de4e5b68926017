"""What happened since a moment, read for the console's charts: messages in, answers out,
turns and the outbox, as plain rows (no SQL types past this module).

Each read is bounded by `LIMIT` rows per table (the newest kept), so a daemon that took a
flood is charted from its latest part rather than read whole into memory. The reads use
the time indexes of migration 0013.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from gateway.contracts.ids import Origin
from gateway.store import Store
from gateway.store.outbox import OutboxKind, OutboxStatus
from gateway.store.tables import inbox, outbox, sessions, turns
from gateway.store.types import aware

LIMIT = 50_000
"""Rows read per table at most."""


@dataclass(frozen=True, slots=True)
class Inbound:
    """A platform's message (not a command), and when its answer's first chunk was sent."""

    platform: str
    received_at: datetime
    answered_at: datetime | None


@dataclass(frozen=True, slots=True)
class Sent:
    """The first chunk of an answer, sent."""

    platform: str
    sent_at: datetime


@dataclass(frozen=True, slots=True)
class TurnRow:
    """A turn: where its session lives, when it ran, how it ended (`running` while on)."""

    platform: str
    started_at: datetime
    finished_at: datetime | None
    status: str


@dataclass(frozen=True, slots=True)
class Queued:
    """An outbox row: queued from `created_at` until `left_at` (sent or given up; None while
    it waits). A dead row's moment of death is not stored: its last scheduled try stands
    for it."""

    platform: str
    created_at: datetime
    left_at: datetime | None
    dead: bool


@dataclass(frozen=True, slots=True)
class ActivityRows:
    """Everything `Activity.since` read."""

    inbound: list[Inbound]
    sent: list[Sent]
    turns: list[TurnRow]
    queued: list[Queued]
    cut_at: datetime | None = None
    """Set when a table held more rows than `LIMIT`: before this moment the rows were not
    all read (the charts say so)."""


class Activity:
    """Reads for the console's charts; each call is one read transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def since(self, start: datetime, *, queued_since: datetime | None = None) -> ActivityRows:
        """The rows of `start` and later. Outbox rows come from `queued_since` on (default
        `start`; the delivery's `max_age` before it, so that a row queued earlier and sent or
        given up within the window counts), with every row still waiting, however old."""
        outbox_from = start if queued_since is None else min(start, queued_since)
        out_columns = (
            outbox.c.id,
            outbox.c.platform,
            outbox.c.created_at,
            outbox.c.sent_at,
            outbox.c.next_attempt_at,
            outbox.c.status,
            outbox.c.kind,
            outbox.c.chunk_index,
            outbox.c.inbox_id,
        )
        async with self.store.read() as conn:
            inbound_rows = (
                await conn.execute(
                    select(inbox.c.id, inbox.c.platform, inbox.c.received_at)
                    .where(inbox.c.received_at >= start, inbox.c.kind == "message")
                    .order_by(inbox.c.received_at.desc())
                    .limit(LIMIT)
                )
            ).all()
            # Two reads, each on its own index (an OR of both would scan the table).
            recent = (
                await conn.execute(
                    select(*out_columns)
                    .where(outbox.c.created_at >= outbox_from)
                    .order_by(outbox.c.created_at.desc())
                    .limit(LIMIT)
                )
            ).all()
            waiting = (
                await conn.execute(
                    select(*out_columns)
                    .where(outbox.c.status.in_((OutboxStatus.PENDING, OutboxStatus.SENDING)))
                    .limit(LIMIT)
                )
            ).all()
            turn_rows = (
                await conn.execute(
                    select(
                        sessions.c.platform,
                        turns.c.started_at,
                        turns.c.finished_at,
                        turns.c.status,
                    )
                    .join(sessions, sessions.c.id == turns.c.session_id)
                    .where(turns.c.started_at >= start)
                    .order_by(turns.c.started_at.desc())
                    .limit(LIMIT)
                )
            ).all()
        truncated = [
            aware(rows[-1][at])
            for rows, at in ((inbound_rows, 2), (recent, 2), (turn_rows, 1))
            if len(rows) >= LIMIT
        ]
        out_rows = list({row[0]: row[1:] for row in [*recent, *waiting]}.values())
        answered: dict[int, datetime] = {}
        sent: list[Sent] = []
        queued: list[Queued] = []
        for platform, created, sent_at, next_try, status, kind, index, inbox_id in out_rows:
            dead = status == OutboxStatus.DEAD
            left = aware(sent_at) if sent_at is not None else None
            if dead or status == OutboxStatus.DISCARDED:
                left = max(aware(created), aware(next_try))
            if aware(created) < start and left is not None and left < start:
                continue  # queued and gone before the window
            queued.append(Queued(str(platform), aware(created), left, dead))
            if kind == OutboxKind.REPLY and index == 0 and sent_at is not None:
                sent.append(Sent(str(platform), aware(sent_at)))
                if inbox_id is not None:
                    at = aware(sent_at)
                    earlier = answered.get(int(inbox_id))
                    answered[int(inbox_id)] = at if earlier is None else min(earlier, at)
        inbound = [
            Inbound(str(platform), aware(at), answered.get(int(row_id)))
            for row_id, platform, at in inbound_rows
        ]
        api = str(Origin.API)
        turn_list = [
            TurnRow(
                str(platform),
                aware(started),
                None if finished is None else aware(finished),
                str(status),
            )
            for platform, started, finished, status in turn_rows
        ]
        # API and terminal questions skip the inbox and the outbox: their turn is both.
        for t in turn_list:
            if t.platform != api:
                continue
            done = t.finished_at if t.status == "completed" else None
            inbound.append(Inbound(api, t.started_at, done))
            if done is not None:
                sent.append(Sent(api, done))
        return ActivityRows(inbound, sent, turn_list, queued, max(truncated, default=None))
