"""Resident memory of several Telegram bots: one `herald run` with five accounts and three
profiles (the accounts bound to them) against five single-account `herald run` processes,
each bot on a fake Bot API of its own and the fake LLM, on SQLite. A measurement, never an
assertion: prints a Markdown table and JSON.

Each Herald is started, every bot gets one message and answers it (so each bot's adapter,
session, profile agent and turn path has run once), then the resident set (VmRSS) is read.

`python -m bench.accounts_rss [--bots 5] [--workdir DIR]`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

from bench.procs import Herald, database, fake_llm, herald, telegram_fake
from tests.fakes.telegram import TelegramServerClient

USER = 4242
PROFILES = ("family", "work", "support")
"""The profiles of the one Herald; bot i is bound to PROFILES[i % 3]."""


def token(i: int) -> str:
    return f"{100000 + i}:bench-bot-{i}"


def section(tg: TelegramServerClient, i: int) -> dict[str, Any]:
    return {
        "token": token(i),
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": [str(USER)],
        "stream_edits": False,
        "poll_timeout": 10,
    }


async def answered_once(bots: list[TelegramServerClient]) -> None:
    """Each bot gets one message and sends its answer."""
    for tg in bots:
        await tg.inject(USER, "hello", sender_id=USER)
    for tg in bots:
        await tg.wait(timeout=60, min_sent=1)


async def measure(work: Path, count: int) -> dict[str, Any]:
    """RSS (MiB) of one Herald with `count` accounts, and of `count` one-account Heralds."""
    work.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        llm_url = await stack.enter_async_context(fake_llm(work))
        llm = {"base_url": llm_url, "api_key": "sk", "memory_pass": False}
        for i in range(count):
            (work / f"bot{i}").mkdir(parents=True, exist_ok=True)
        bots = [
            await stack.enter_async_context(telegram_fake(work / f"bot{i}", token(i)))
            for i in range(count)
        ]

        async with database("sqlite", work / "one" / "db") as url:
            accounts = {f"bot{i}": section(tg, i) for i, tg in enumerate(bots)}
            profiles = {
                name: {"soul": f"You are the {name} assistant.", "llm": {"model": f"{name}-model"}}
                for name in PROFILES
            }
            bindings = [
                {"profile": PROFILES[i % len(PROFILES)], "platform": "telegram", "account": bot}
                for i, bot in enumerate(accounts)
            ]
            async with herald(
                work / "one" / "state",
                url,
                llm=llm,
                platforms={"telegram": {"accounts": accounts}},
                profiles=profiles,
                bindings=bindings,
            ) as one:
                await answered_once(bots)
                together = one.rss_mb()

        async with contextlib.AsyncExitStack() as many:
            daemons: list[Herald] = []
            for i, tg in enumerate(bots):
                url = await many.enter_async_context(database("sqlite", work / f"p{i}" / "db"))
                daemons.append(
                    await many.enter_async_context(
                        herald(
                            work / f"p{i}" / "state",
                            url,
                            llm=llm,
                            platforms={"telegram": section(tg, i)},
                        )
                    )
                )
            await _second_answers(bots)
            apart = [d.rss_mb() for d in daemons]
    return {
        "bots": count,
        "profiles": len(PROFILES),
        "one_process_mib": round(together, 1),
        "separate_processes_mib": [round(r, 1) for r in apart],
        "separate_total_mib": round(sum(apart), 1),
    }


async def _second_answers(bots: list[TelegramServerClient]) -> None:
    for tg in bots:
        await tg.inject(USER, "hello again", sender_id=USER)
    for tg in bots:
        await tg.wait(timeout=60, min_sent=2)


def machine() -> str:
    """The machine the figures come from."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    python = platform.python_version()
    return f"{os.cpu_count()} cores, {cpu}, {mem_kb // 1024} MiB RAM, Python {python}"


async def main(count: int, workdir: Path | None) -> None:
    with contextlib.ExitStack() as cleanup:
        work = workdir or Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        result = await measure(work, count)
    result["machine"] = machine()
    print(json.dumps(result, indent=2))
    print()
    print("| | RSS (MiB) |")
    print("|---|---|")
    print(
        f"| one `herald run`, {count} Telegram accounts, {len(PROFILES)} profiles | "
        f"{result['one_process_mib']} |"
    )
    each = ", ".join(str(r) for r in result["separate_processes_mib"])
    print(f"| {count} `herald run`, one account each | {result['separate_total_mib']} ({each}) |")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bots", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.bots, args.workdir))


if __name__ == "__main__":
    cli()
