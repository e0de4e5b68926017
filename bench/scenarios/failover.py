"""Scenario 8: failover between three instances on one PostgreSQL database (Telegram polling
under a lease, the scheduler under another), at the default lease TTL and a shorter one.

Per run, on a fresh database with three `herald run` processes:
(a) SIGKILL of the instance polling Telegram; a message is injected right after the kill.
    Measured: until another instance holds the poller lease, and until the message is
    answered (the fake Bot API's receipt time of the reply).
(b) SIGKILL of the instance holding `cron`: until another instance holds it.
(c) SIGTERM of the instance polling Telegram (a clean stop releases its leases); a message is
    injected right after the signal. Measured: until another instance holds the poller lease,
    until the message is answered, and until the stopped process exited.
A killed instance is started again (same instance id) before the next measurement. The lease
table is read every 20 ms and the fake's state every 20 ms, which bounds the resolution.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from bench.context import Context
from bench.procs import Herald, database, fake_llm, telegram_fake
from bench.stats import fmt_spread, spread
from gateway.store import Store
from gateway.store.tables import leases
from tests.fakes.telegram import TelegramServerClient

NAME = "failover"
TITLE = "Failover between three instances (PostgreSQL)"
TTLS = (15.0, 5.0)
"""`cluster.lease_ttl`: the default, and a shorter one. Heartbeats at a third of it."""
TOKEN = "123:failover"
INSTANCES = ("a", "b", "c")
POLLER = "adapter:telegram:default"
CRON = "cron"
SAMPLE = 0.02
"""Seconds between looks at the lease table and at the fake's state."""
WAIT = 120.0
"""Seconds any one wait may take before the run is given up."""
MEASURES = (
    "kill_poller_lease_s",
    "kill_poller_answer_s",
    "kill_cron_lease_s",
    "term_poller_lease_s",
    "term_poller_answer_s",
    "term_exit_s",
)


async def run(ctx: Context) -> dict[str, Any]:
    """`ctx.runs` runs per TTL; PostgreSQL only (SQLite serves one instance)."""
    if "postgres" not in ctx.backends:
        return {}
    work = ctx.dir(NAME)
    ttls = TTLS if not ctx.quick else TTLS[-1:]
    out: dict[str, Any] = {}
    async with (
        fake_llm(work) as llm_url,
        telegram_fake(work, TOKEN) as tg,
    ):
        chats = iter(range(1000, 1_000_000))
        for ttl in ttls:
            runs: list[dict[str, float]] = []
            for i in range(ctx.runs):
                folder = work / f"ttl{ttl:g}-run{i}"
                async with database("postgres", folder / "db") as url:
                    runs.append(
                        await _one_run(
                            folder, url=url, llm_url=llm_url, tg=tg, ttl=ttl, chats=chats
                        )
                    )
                print(f"failover ttl {ttl:g}s run {i + 1}: {runs[-1]}", flush=True)
            out[f"{ttl:g}"] = {
                "ttl_s": ttl,
                "heartbeat_s": ttl / 3,
                **{k: spread([r[k] for r in runs]) for k in MEASURES},
                "raw": runs,
            }
    return {"postgres": out}


class Cluster:
    """Three instances on one database, and a view of its lease table."""

    def __init__(self, folder: Path, url: str, settings: dict[str, Any], store: Store) -> None:
        self.store = store
        self.nodes = {
            name: Herald(folder / name, url, {**settings, "instance_id": f"bench-{name}"})
            for name in INSTANCES
        }

    async def holder(self, lease: str) -> str | None:
        """The instance (a, b, c) holding `lease` now, or None."""
        async with self.store.read() as conn:
            row = (
                await conn.execute(
                    select(leases.c.owner, leases.c.expires_at).where(leases.c.name == lease)
                )
            ).first()
        if row is None or row[1] <= datetime.now(UTC):
            return None
        return str(row[0]).removeprefix("bench-")

    async def held(self, lease: str) -> str:
        """Wait until someone holds `lease`; who."""
        async with asyncio.timeout(WAIT):
            while (owner := await self.holder(lease)) is None:
                await asyncio.sleep(SAMPLE)
        return owner

    async def moved(self, lease: str, old: str, since: float) -> float:
        """Wait until another instance than `old` holds `lease`; seconds since `since`."""
        async with asyncio.timeout(WAIT):
            while (owner := await self.holder(lease)) is None or owner == old:
                await asyncio.sleep(SAMPLE)
        return time.monotonic() - since

    async def stop(self) -> None:
        """SIGTERM every instance still running (SIGKILL if one is stuck)."""
        for node in self.nodes.values():
            if node.proc is not None and node.proc.returncode is None:
                try:
                    await node.stop()
                except TimeoutError:
                    await node.kill()


async def _one_run(
    folder: Path,
    *,
    url: str,
    llm_url: str,
    tg: TelegramServerClient,
    ttl: float,
    chats: Iterator[int],
) -> dict[str, float]:
    settings: dict[str, Any] = {
        "llm": {"base_url": llm_url, "api_key": "sk", "memory_pass": False},
        "cluster": {"lease_ttl": ttl},
        "platforms": {
            "telegram": {
                "token": TOKEN,
                "base_url": tg.base_url,
                "base_file_url": tg.base_file_url,
                "allowed_users": ["*"],
                "stream_edits": False,
            }
        },
    }
    result: dict[str, float] = {}
    async with Store.open(url) as store:  # migrated once, before the instances start
        cluster = Cluster(folder, url, settings, store)
        try:
            for node in cluster.nodes.values():
                await node.start()
            # (a) SIGKILL of the poller's instance.
            poller = await cluster.held(POLLER)
            await cluster.held(CRON)
            node = cluster.nodes[poller]
            assert node.proc is not None
            node.proc.kill()
            killed = time.monotonic()
            chat = next(chats)
            await tg.inject(chat, f"[bench:fo{chat}] after a kill", sender_id=chat)
            await node.proc.wait()
            answered = asyncio.create_task(_answered(tg, chat))
            result["kill_poller_lease_s"] = await cluster.moved(POLLER, poller, killed)
            result["kill_poller_answer_s"] = await answered - killed
            await node.start()

            # (b) SIGKILL of the scheduler's instance.
            holder = await cluster.held(CRON)
            node = cluster.nodes[holder]
            assert node.proc is not None
            node.proc.kill()
            killed = time.monotonic()
            await node.proc.wait()
            result["kill_cron_lease_s"] = await cluster.moved(CRON, holder, killed)
            await node.start()

            # (c) SIGTERM of the poller's instance: a clean handover.
            poller = await cluster.held(POLLER)
            node = cluster.nodes[poller]
            assert node.proc is not None
            node.proc.terminate()
            termed = time.monotonic()
            exited = asyncio.create_task(_exited(node))
            chat = next(chats)
            await tg.inject(chat, f"[bench:fo{chat}] after a stop", sender_id=chat)
            answered = asyncio.create_task(_answered(tg, chat))
            result["term_poller_lease_s"] = await cluster.moved(POLLER, poller, termed)
            result["term_poller_answer_s"] = await answered - termed
            result["term_exit_s"] = await exited - termed
        finally:
            await cluster.stop()
    return result


async def _exited(node: Herald) -> float:
    """When (monotonic) the process exited."""
    assert node.proc is not None
    async with asyncio.timeout(WAIT):
        await node.proc.wait()
    return time.monotonic()


async def _answered(tg: TelegramServerClient, chat: int) -> float:
    """When (monotonic, as the fake recorded it) the first reply reached `chat`."""
    async with asyncio.timeout(WAIT):
        while True:
            with contextlib.suppress(KeyError):
                for sent in (await tg.state())["sent"]:
                    if int(sent["chat_id"]) == chat:
                        return float(sent["received_at"])
            await asyncio.sleep(SAMPLE)


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per lease TTL."""
    rows = [
        "| lease TTL s | heartbeat s | SIGKILL poller → lease moved s | → message answered s "
        "| SIGKILL cron holder → lease moved s | SIGTERM poller → lease moved s "
        "| → message answered s | → exited s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in data.get("postgres", {}).values():
        rows.append(
            f"| {d['ttl_s']:g} | {d['heartbeat_s']:.1f} "
            + " ".join(f"| {fmt_spread(d[k], 2)}" for k in MEASURES)
            + " |"
        )
    return "\n".join(rows)
