"""Scenario 7: a busy-mode storm. 100 sessions each get 20 messages within one second while
their turns are running (the fake LLM takes 0.5 s a call); every message must end with exactly
one outcome. Reported: the time from the storm's end until everything is settled (every inbox
row has its outcome and the outbox is empty), per busy mode.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from sqlalchemy import func, select

from bench.context import Context
from bench.procs import CHAT_TOKEN, Herald, chat_server, database, fake_llm
from bench.stats import fmt_spread, spread
from gateway.store import Store
from gateway.store.tables import inbox, outbox
from tests.fakes.chat_server import ChatServerClient

NAME = "storm"
TITLE = "Busy-mode storm: 100 sessions × 20 messages in 1 s while busy"
SESSIONS = 100
MESSAGES = 20
MODES = ("queue", "collect", "steer", "interrupt")
LATENCY = 0.5


async def settled(url: str, expected: int, timeout: float = 600.0) -> dict[str, Any]:
    """Wait until `expected` inbox rows all have outcomes and nothing is left to deliver."""
    async with Store.open(url, migrate=False) as store, asyncio.timeout(timeout):
        while True:
            async with store.read() as conn:
                total = await conn.scalar(select(func.count()).select_from(inbox))
                open_rows = await conn.scalar(
                    select(func.count()).select_from(inbox).where(inbox.c.outcome.is_(None))
                )
                unsent = await conn.scalar(
                    select(func.count())
                    .select_from(outbox)
                    .where(outbox.c.status.in_(("pending", "sending")))
                )
                if total == expected and open_rows == 0 and unsent == 0:
                    rows = await conn.execute(
                        select(inbox.c.outcome, func.count()).group_by(inbox.c.outcome)
                    )
                    return {str(k): int(v) for k, v in rows.all()}
            await asyncio.sleep(0.1)


async def run(ctx: Context) -> dict[str, Any]:
    """Every busy mode on every backend, `ctx.runs` times."""
    sessions = ctx.scaled(SESSIONS, 20)
    modes = MODES if not ctx.quick else ("queue", "collect")
    out: dict[str, Any] = {}
    for backend in ctx.backends:
        work = ctx.dir(NAME, backend)
        rows: dict[str, Any] = {}
        async with (
            fake_llm(work, LATENCY) as llm_url,
            chat_server(work) as chat_url,
            ChatServerClient(chat_url) as chat,
        ):
            for mode in modes:
                quiesce, outcomes = [], {}
                for i in range(ctx.runs):
                    async with database(backend, work / f"{mode}{i}") as url:
                        daemon = Herald(
                            work / f"state-{mode}{i}",
                            url,
                            {
                                "llm": {"base_url": llm_url, "api_key": "sk", "memory_pass": False},
                                "sessions": {"busy_mode": mode, "ack_interval": 30},
                                "platforms": {
                                    "test": {
                                        "url": chat_url,
                                        "token": CHAT_TOKEN,
                                        "allowed_users": ["*"],
                                        "stream_edits": False,
                                    }
                                },
                            },
                        )
                        await daemon.start()
                        try:
                            quiesce.append(
                                await _storm(chat, llm_url, url, sessions, f"{mode}{i}-")
                            )
                            outcomes = await settled(url, sessions * (MESSAGES + 1))
                        finally:
                            await daemon.stop()
                rows[mode] = {"quiesce_s": spread(quiesce), "outcomes": outcomes}
        out[backend] = {"sessions": sessions, "messages": MESSAGES, "modes": rows}
    return out


async def _storm(chat: ChatServerClient, llm_url: str, url: str, sessions: int, tag: str) -> float:
    """Start a turn in every session, storm them, and time the settling after the storm."""
    timings = llm_url.removesuffix("/v1") + "/bench/timings"
    async with httpx.AsyncClient() as http:
        before = (await http.get(timings)).json()["requests"]
        await chat.inject_many(
            {"chat_id": f"{tag}c{s}", "text": "start", "sender_id": f"{tag}u{s}"}
            for s in range(sessions)
        )
        async with asyncio.timeout(60):
            while (await http.get(timings)).json()["requests"] - before < sessions:
                await asyncio.sleep(0.02)
    started = time.monotonic()
    for m in range(MESSAGES):
        await chat.inject_many(
            {"chat_id": f"{tag}c{s}", "text": f"storm {m}", "sender_id": f"{tag}u{s}"}
            for s in range(sessions)
        )
        await asyncio.sleep(max(0.0, started + (m + 1) / MESSAGES - time.monotonic()))
    storm_end = time.monotonic()
    await settled(url, sessions * (MESSAGES + 1))
    return time.monotonic() - storm_end


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per backend and busy mode."""
    rows = [
        "| store | busy mode | messages | storm end → settled s | outcomes |",
        "|---|---|---|---|---|",
    ]
    for backend, d in data.items():
        total = d["sessions"] * (d["messages"] + 1)
        for mode, r in d["modes"].items():
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
            rows.append(
                f"| {backend} | {mode} | {total:,} | {fmt_spread(r['quiesce_s'], 1)} | {outcomes} |"
            )
    return "\n".join(rows)
