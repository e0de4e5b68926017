"""Scenario 2: through a platform adapter (Telegram, against the fake Bot API): inbound to
reply latency and throughput, the fake LLM answering at once, delivery included.

Messages are offered open-loop, each in a chat of its own (Telegram's one-message-a-second
per chat spacing would otherwise dominate). The first reply seen in a chat ends that
message's latency; the fake is asked for the chats answered since its last answer every
20 ms (`bench.telegram_fake`: the whole state cost the fake quadratic time and stole its
loop from the bot), which bounds the resolution.
The inbound half (injection to the model's request) is exact, from the fake LLM's timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx

from bench.context import Context
from bench.procs import database, fake_llm, herald, telegram_fake
from bench.stats import fmt_spread, percentile, spread
from tests.fakes.telegram import TelegramServerClient

NAME = "telegram"
TITLE = "Through the Telegram adapter (inbound to reply)"
RATES = (10, 25, 50, 100)
TOKEN = "123:bench"
POLL = 0.02


async def run(ctx: Context) -> dict[str, Any]:
    """Each offered rate on each backend, `ctx.runs` times."""
    duration = ctx.scaled(10, 3)
    rates = RATES if not ctx.quick else (10, 25)
    out: dict[str, Any] = {}
    for backend in ctx.backends:
        work = ctx.dir(NAME, backend)
        steps: dict[str, Any] = {}
        async with (
            fake_llm(work) as llm_url,
            telegram_fake(work, TOKEN) as tg,
            database(backend, work / "db") as url,
            herald(
                work / "state",
                url,
                llm={"base_url": llm_url, "api_key": "sk", "memory_pass": False},
                platforms={
                    "telegram": {
                        "token": TOKEN,
                        "base_url": tg.base_url,
                        "base_file_url": tg.base_file_url,
                        "allowed_users": ["*"],
                        "stream_edits": False,
                        "poll_timeout": 10,
                    }
                },
            ),
        ):
            chat = 1000
            for rate in rates:
                runs = []
                for _ in range(ctx.runs):
                    runs.append(await _one_run(tg, llm_url, rate, duration, chat))
                    chat += rate * duration + 10
                steps[str(rate)] = {k: spread([r[k] for r in runs]) for k in runs[0]}
        out[backend] = steps
    return out


async def _one_run(
    tg: TelegramServerClient, llm_url: str, rate: int, duration: int, first_chat: int
) -> dict[str, float]:
    total = rate * duration
    injected: dict[int, float] = {}
    replied: dict[int, float] = {}
    seen = await _sent_count(tg)
    start = time.monotonic()

    async def offer() -> None:
        batch = max(1, rate // 10)
        for i in range(0, total, batch):
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            chats = range(first_chat + i, first_chat + min(i + batch, total))
            now = time.monotonic()
            await tg.inject_many(
                {"chat_id": c, "sender_id": c, "text": f"[bench:tg{c}] hello"} for c in chats
            )
            for c in chats:
                injected[c] = now

    async def watch() -> None:
        nonlocal seen
        # A step far past saturation may not drain in time: what was answered is reported,
        # and how many were not (`unanswered`), instead of losing the whole run.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(duration + 120):
                while len(replied) < total:
                    body = (await http.get("/control/sent_chats", params={"since": seen})).json()
                    now = time.monotonic()
                    for chat_id in body["chat_ids"]:
                        replied.setdefault(int(chat_id), now)
                    seen += len(body["chat_ids"])
                    await asyncio.sleep(POLL)

    async with (
        httpx.AsyncClient(base_url=tg.url, trust_env=False) as http,
        asyncio.TaskGroup() as group,
    ):
        group.create_task(offer())
        group.create_task(watch())
    async with httpx.AsyncClient() as http:
        llm = (await http.get(llm_url.removesuffix("/v1") + "/bench/timings")).json()["timings"]
    latency = [(replied[c] - injected[c]) * 1000 for c in injected if c in replied]
    inbound = [(llm[f"tg{c}"][0] - injected[c]) * 1000 for c in injected if f"tg{c}" in llm]
    span = max(replied.values()) - start
    return {
        "offered": float(rate),
        "achieved": len(replied) / span,
        "latency_p50_ms": percentile(latency, 50),
        "latency_p99_ms": percentile(latency, 99),
        "inbound_p50_ms": percentile(inbound, 50),
        "inbound_p99_ms": percentile(inbound, 99),
        "unanswered": float(total - len(replied)),
    }


async def _sent_count(tg: TelegramServerClient) -> int:
    async with httpx.AsyncClient(base_url=tg.url, trust_env=False) as http:
        count: int = (await http.get("/control/sent_chats", params={"since": 1 << 30})).json()[
            "count"
        ]
    return count


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per backend and offered rate."""
    rows = [
        "| store | offered msg/s | replies/s | inbound → reply p50 ms | p99 ms "
        "| inbound → model request p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend, steps in data.items():
        for rate, s in steps.items():
            rows.append(
                f"| {backend} | {rate} | {fmt_spread(s['achieved'], 1)} "
                f"| {fmt_spread(s['latency_p50_ms'], 0)} | {fmt_spread(s['latency_p99_ms'], 0)} "
                f"| {fmt_spread(s['inbound_p50_ms'], 1)} | {fmt_spread(s['inbound_p99_ms'], 1)} |"
            )
    return "\n".join(rows)
