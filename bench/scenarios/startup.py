"""Scenario 6: start to ready, and SIGTERM to exit, with 10,000 sessions and 1,000 deliveries
waiting in the outbox (for the loopback test platform, served by its fake chat server).
"""

from __future__ import annotations

from typing import Any

from bench.context import Context
from bench.procs import CHAT_TOKEN, Herald, chat_server, database
from bench.seed import seed_sessions
from bench.stats import fmt_spread, spread
from gateway.contracts.ids import AccountId, ChatId
from gateway.store import Store
from gateway.store.outbox import Chunk, Outbox, Target
from tests.fakes.chat_server import ChatServerClient

NAME = "startup"
TITLE = "Startup to ready and SIGTERM to exit"
SESSIONS = 10_000
DELIVERIES = 1_000
CHATS = 100


async def seed(url: str, sessions: int, deliveries: int) -> None:
    """Sessions of the test platform and notices waiting to be delivered."""
    async with Store.open(url) as store:
        await seed_sessions(store, sessions, platform="test")
        await Outbox(store).enqueue(
            [
                Chunk(
                    key=f"bench:{i}",
                    target=Target("test", AccountId("default"), ChatId(f"chat{i % CHATS}")),
                    text=f"queued notice {i}",
                )
                for i in range(deliveries)
            ]
        )


async def run(ctx: Context) -> dict[str, Any]:
    """Per backend: `ctx.runs` fresh databases, each started, drained and stopped twice."""
    sessions = ctx.scaled(SESSIONS, 1_000)
    deliveries = ctx.scaled(DELIVERIES, 100)
    out: dict[str, Any] = {}
    for backend in ctx.backends:
        work = ctx.dir(NAME, backend)
        ready, stop_busy, stop_idle, codes = [], [], [], []
        async with (
            chat_server(work) as chat_url,
            ChatServerClient(chat_url) as chat,
        ):
            for i in range(ctx.runs):
                async with database(backend, work / f"db{i}") as url:
                    await seed(url, sessions, deliveries)
                    settings = {"platforms": {"test": {"url": chat_url, "token": CHAT_TOKEN}}}
                    # First start: stopped at once, while the backlog is being delivered.
                    daemon = Herald(work / f"state{i}", url, settings)
                    ready.append(await daemon.start())
                    seconds, code = await daemon.stop()
                    stop_busy.append(seconds)
                    codes.append(code)
                    # Second start: the rest of the backlog delivered, then an idle stop.
                    daemon = Herald(work / f"state{i}", url, settings)
                    ready.append(await daemon.start())
                    await chat.wait(120, min_sent=deliveries * (i + 1))
                    seconds, code = await daemon.stop()
                    stop_idle.append(seconds)
                    codes.append(code)
        out[backend] = {
            "sessions": sessions,
            "deliveries": deliveries,
            "ready_s": spread(ready),
            "sigterm_with_backlog_s": spread(stop_busy),
            "sigterm_idle_s": spread(stop_idle),
            "exit_codes": sorted(set(codes)),
        }
    return out


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per backend."""
    rows = [
        "| store | sessions | queued deliveries | start → ready s | SIGTERM → exit, "
        "delivering s | SIGTERM → exit, idle s | exit codes |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend, d in data.items():
        rows.append(
            f"| {backend} | {d['sessions']:,} | {d['deliveries']:,} "
            f"| {fmt_spread(d['ready_s'], 2)} | {fmt_spread(d['sigterm_with_backlog_s'], 2)} "
            f"| {fmt_spread(d['sigterm_idle_s'], 2)} | {d['exit_codes']} |"
        )
    return "\n".join(rows)
