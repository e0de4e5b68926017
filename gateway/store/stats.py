"""What the store asks of its database, counted: the per-turn cost in `/metrics`.

Plain integers bumped from SQLAlchemy's engine events (and, on SQLite, from the driver
wrapper), read when `/metrics` is scraped. Nothing here allocates per statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass(slots=True)
class StoreStats:
    """Counters since the engine was created (monotonic, like Prometheus counters)."""

    statements: int = 0
    """SQL statements sent to the driver (SQLite's explicit BEGINs included)."""
    transactions: int = 0
    """Transactions begun."""
    handoffs: int = 0
    """Trips from the event loop to the driver: on SQLite, calls run on a connection's
    thread (each wakes that thread and then the event loop); on PostgreSQL, round trips to
    the server (BEGIN, each statement, COMMIT or ROLLBACK)."""
    pings: int = 0
    """Liveness checks of a pooled connection before it was handed out (PostgreSQL)."""


def watch(engine: AsyncEngine, stats: StoreStats) -> None:
    """Count `engine`'s statements and transactions (and PostgreSQL's round trips) into
    `stats`."""
    sync = engine.sync_engine
    round_trips = engine.dialect.name != "sqlite"

    @event.listens_for(sync, "before_cursor_execute")
    def _statement(*_: Any) -> None:
        stats.statements += 1
        if round_trips:
            stats.handoffs += 1

    @event.listens_for(sync, "begin")
    def _begin(*_: Any) -> None:
        stats.transactions += 1
        if round_trips:
            stats.handoffs += 1

    if round_trips:

        @event.listens_for(sync, "commit")
        @event.listens_for(sync, "rollback")
        def _end(*_: Any) -> None:
            stats.handoffs += 1
