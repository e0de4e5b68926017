"""Scenario 5: resident memory. First with 10,000 sessions that each had a turn; then over a
soak at a steady load (10 minutes, 20 turns/s over 1,000 sessions), sampled every 5 s.
Growth is measured from the first sample after one minute of soak (caches warm) to the end.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from bench.context import Context
from bench.procs import API_KEY, Herald, database, fake_llm, herald
from bench.stats import fmt, fmt_spread, spread

NAME = "memory"
TITLE = "Resident memory: 10,000 sessions, then a steady soak"
SESSIONS = 10_000
SOAK_SECONDS = 600
SOAK_RATE = 20
SAMPLE_EVERY = 5.0


async def turns(url: str, sessions: list[str], concurrency: int = 32) -> int:
    """One turn in each session, `concurrency` at a time (closed loop); the failures."""
    failures = 0
    queue = list(reversed(sessions))
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal failures
        while queue:
            session = queue.pop()
            body = {"model": "herald", "messages": [{"role": "user", "content": "hello"}]}
            async with http.post(
                f"{url}/v1/chat/completions",
                json=body,
                headers={**headers, "X-Herald-Session-Id": session},
            ) as r:
                await r.read()
                failures += r.status != 200

    async with aiohttp.ClientSession() as http, asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker(http))
    return failures


async def run(ctx: Context) -> dict[str, Any]:
    """Per backend: fill, measure, soak."""
    sessions = ctx.scaled(SESSIONS, 500)
    soak = ctx.scaled(SOAK_SECONDS, 30)
    out: dict[str, Any] = {}
    for backend in ctx.backends:
        work = ctx.dir(NAME, backend)
        async with (
            fake_llm(work) as llm_url,
            database(backend, work / "db") as url,
            herald(
                work / "state",
                url,
                llm={"base_url": llm_url, "api_key": "sk", "memory_pass": False},
            ) as daemon,
        ):
            idle = daemon.rss_mb()
            failures = await turns(daemon.url, [f"m{i}" for i in range(sessions)])
            await asyncio.sleep(2)
            filled = daemon.rss_mb()
            samples = await _soak(daemon, soak)
            warm = next((rss for t, rss in samples if t >= min(60.0, soak / 2)), samples[0][1])
            end = samples[-1][1]
        out[backend] = {
            "sessions": sessions,
            "failures": failures,
            "idle_mb": idle,
            "filled_mb": filled,
            "soak_seconds": soak,
            "soak_start_mb": warm,
            "soak_end_mb": end,
            "growth_pct": spread([(end - warm) / warm * 100]),
            "samples": samples,
        }
    return out


async def _soak(daemon: Herald, seconds: float) -> list[tuple[float, float]]:
    """Steady load for `seconds`; RSS samples (seconds into the soak, MiB)."""
    samples: list[tuple[float, float]] = []
    started = time.monotonic()

    async def sample() -> None:
        while time.monotonic() - started < seconds:
            samples.append((time.monotonic() - started, daemon.rss_mb()))
            await asyncio.sleep(SAMPLE_EVERY)

    async def load() -> None:
        n = 0
        while time.monotonic() - started < seconds:
            batch = [f"m{(n + i) % 1000}" for i in range(SOAK_RATE)]
            n += SOAK_RATE
            tick = time.monotonic()
            await turns(daemon.url, batch, concurrency=SOAK_RATE)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))

    async with asyncio.TaskGroup() as group:
        group.create_task(sample())
        group.create_task(load())
    return samples


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per backend."""
    rows = [
        "| store | RSS idle MB | RSS after sessions MB | sessions | soak | RSS soak start → end MB "
        "| growth |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend, d in data.items():
        rows.append(
            f"| {backend} | {fmt(d['idle_mb'])} | {fmt(d['filled_mb'])} | {d['sessions']:,} "
            f"| {d['soak_seconds']} s | {fmt(d['soak_start_mb'])} → {fmt(d['soak_end_mb'])} "
            f"| {fmt_spread(d['growth_pct'], 1)} % |"
        )
    return "\n".join(rows)


def plot(fig: Any, data: dict[str, Any]) -> None:
    """RSS over the soak."""
    ax = fig.subplots()
    for backend, d in data.items():
        ax.plot([t for t, _ in d["samples"]], [m for _, m in d["samples"]], label=backend)
    ax.set(xlabel="seconds into the soak", ylabel="RSS (MiB)")
    ax.legend()
