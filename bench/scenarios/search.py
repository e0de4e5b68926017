"""Scenario 4: full-text search over many stored messages (FTS5 / tsvector + GIN).

Queries are one or two words, common and rare, scoped to one user as `session_search` is.
"""

from __future__ import annotations

import random
import time
from typing import Any

from sqlalchemy import text

from bench.context import Context
from bench.procs import database
from bench.seed import seed_messages, seed_sessions, seed_users, vocabulary
from bench.stats import fmt_spread, percentile, spread
from gateway.contracts.ids import UserId
from gateway.store import Store

NAME = "search"
TITLE = "Full-text search over stored messages"
MESSAGES = 1_000_000
QUERIES = 300


async def run(ctx: Context) -> dict[str, Any]:
    """Fill each backend, then time `Store.search_messages`."""
    count = ctx.scaled(MESSAGES, 20_000)
    out: dict[str, Any] = {}
    for backend in ctx.backends:
        work = ctx.dir(NAME, backend)
        async with database(backend, work / "db") as url, Store.open(url) as store:
            vocab = vocabulary(5000)
            users = await seed_users(store, 100)
            sessions = await seed_sessions(store, 1000, users_=users)
            started = time.monotonic()
            await seed_messages(store, sessions, count, vocab=vocab)
            fill = time.monotonic() - started
            if backend == "postgres":
                # Planner statistics, as autovacuum keeps them on a database in use: without
                # them PostgreSQL intersects the full-text index with each session's rows
                # instead of reading the user's few rows. (Herald never runs ANALYZE on
                # SQLite, so that one is measured as it runs.)
                async with store.write() as conn:
                    await conn.execute(text("ANALYZE"))
            rng = random.Random(3)
            runs_p50, runs_p95, hits = [], [], 0
            for _ in range(ctx.runs):
                times = []
                for i in range(QUERIES):
                    words = rng.sample(vocab[:50] if i % 2 else vocab, rng.choice((1, 2)))
                    user = UserId(rng.choice(users))
                    t0 = time.perf_counter()
                    found = await store.search_messages(" ".join(words), user_id=user, limit=10)
                    times.append((time.perf_counter() - t0) * 1000)
                    hits += bool(found)
                runs_p50.append(percentile(times, 50))
                runs_p95.append(percentile(times, 95))
        out[backend] = {
            "messages": count,
            "fill_seconds": round(fill, 1),
            "queries_with_hits": hits / (QUERIES * ctx.runs),
            "p50_ms": spread(runs_p50),
            "p95_ms": spread(runs_p95),
        }
    return out


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per backend."""
    rows = [
        "| store | messages | queries with hits | p50 ms | p95 ms |",
        "|---|---|---|---|---|",
    ]
    for backend, d in data.items():
        rows.append(
            f"| {backend} | {d['messages']:,} | {d['queries_with_hits']:.0%} "
            f"| {fmt_spread(d['p50_ms'], 2)} | {fmt_spread(d['p95_ms'], 2)} |"
        )
    return "\n".join(rows)
