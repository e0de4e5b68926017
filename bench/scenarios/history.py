"""Scenario 3: rebuilding the context for the next turn as the transcript grows.

The agent loads the latest summary and a window of messages (`llm.history_window`, 40), so
the cost should stay flat however long the session is.
"""

from __future__ import annotations

import time
from typing import Any

from agent_core.llm import make_provider
from bench.context import Context
from bench.procs import database
from bench.seed import seed_messages, seed_sessions
from bench.stats import fmt_spread, percentile, spread
from gateway.config import HeraldConfig
from gateway.contracts.ids import SessionId
from gateway.store import Store
from gateway.supervisor import build_agent

NAME = "history"
TITLE = "History rebuild vs transcript length"
SIZES = (1_000, 10_000, 100_000)
CALLS = 200


async def run(ctx: Context) -> dict[str, Any]:
    """Time `Agent.load_context` on sessions of each length, on each backend."""
    sizes = SIZES if not ctx.quick else (1_000, 10_000)
    out: dict[str, Any] = {}
    for backend in ctx.backends:
        work = ctx.dir(NAME, backend)
        async with database(backend, work / "db") as url, Store.open(url) as store:
            config = HeraldConfig(state_dir=work / "state", database_url=url)
            provider = make_provider(config.llm)
            agent, _ = build_agent(config, provider, store)
            rows: dict[str, Any] = {}
            for size in sizes:
                (session_id,) = await seed_sessions(store, 1, platform=f"h{size}")
                await seed_messages(store, [session_id], size)
                session = await store.get_session_by_id(SessionId(session_id))
                assert session is not None
                runs_p50, runs_p95 = [], []
                for _ in range(ctx.runs):
                    for _ in range(20):
                        await agent.load_context(session)
                    times = []
                    for _ in range(CALLS):
                        started = time.perf_counter()
                        context = await agent.load_context(session)
                        times.append((time.perf_counter() - started) * 1000)
                    assert len(context) > 1
                    runs_p50.append(percentile(times, 50))
                    runs_p95.append(percentile(times, 95))
                rows[str(size)] = {"p50_ms": spread(runs_p50), "p95_ms": spread(runs_p95)}
            await provider.aclose()
        out[backend] = rows
    return out


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per backend and transcript length."""
    rows = ["| store | messages in session | p50 ms | p95 ms |", "|---|---|---|---|"]
    for backend, sizes in data.items():
        for size, s in sizes.items():
            rows.append(
                f"| {backend} | {int(size):,} | {fmt_spread(s['p50_ms'], 2)} "
                f"| {fmt_spread(s['p95_ms'], 2)} |"
            )
    return "\n".join(rows)


def plot(fig: Any, data: dict[str, Any]) -> None:
    """p50 and p95 against transcript length (log scale)."""
    ax = fig.subplots()
    for backend, sizes in data.items():
        xs = [int(s) for s in sizes]
        ax.plot(xs, [v["p50_ms"]["median"] for v in sizes.values()], "o-", label=f"{backend} p50")
        ax.plot(xs, [v["p95_ms"]["median"] for v in sizes.values()], "s--", label=f"{backend} p95")
    ax.set(xscale="log", xlabel="messages in the session", ylabel="ms to build the context")
    ax.legend()
