"""An open-loop load generator for Herald's OpenAI-compatible API, run as its own process.

Request `i` is due at `start + i / rate` whatever happened to the earlier ones (open loop),
each in one of `--sessions` named sessions, round robin. Each result line records when the
request was due, sent and answered (machine-wide monotonic clock), its status and Herald's
own `Server-Timing`. The generator's own lag (sent − due) and CPU use are reported so a
saturated generator is seen, not mistaken for a slow Herald.

`python -m bench.loadgen --url http://127.0.0.1:8642 --key K --rate 200 --duration 10 --out F`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp


@dataclass(slots=True)
class Result:
    """One request's fate."""

    id: str
    due: float
    sent: float
    done: float
    status: int
    herald_ms: float | None
    llm_ms: float | None
    warmup: bool


def server_timing(header: str | None) -> dict[str, float]:
    """`herald;dur=1.2, llm;dur=3.4` → {"herald": 1.2, "llm": 3.4}."""
    out: dict[str, float] = {}
    for part in (header or "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name and dur:
            out[name] = float(dur)
    return out


async def one(
    http: aiohttp.ClientSession,
    *,
    url: str,
    key: str,
    session: str,
    tag: str,
    due: float,
    warmup: bool,
    out: list[Result],
) -> None:
    """Send one chat completion and record its result (status 0: the connection failed)."""
    body = {"model": "herald", "messages": [{"role": "user", "content": f"[bench:{tag}] hi"}]}
    headers = {"Authorization": f"Bearer {key}", "X-Herald-Session-Id": session}
    sent = time.monotonic()
    status, timing = 0, {}
    try:
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            status, timing = r.status, server_timing(r.headers.get("Server-Timing"))
    except (aiohttp.ClientError, TimeoutError):
        pass
    done = time.monotonic()
    out.append(
        Result(tag, due, sent, done, status, timing.get("herald"), timing.get("llm"), warmup)
    )


async def generate(
    url: str, key: str, *, rate: float, duration: float, warmup: float, sessions: int, prefix: str
) -> dict[str, object]:
    """Offer `rate` requests/s for `warmup + duration` seconds; return the raw results."""
    results: list[Result] = []
    total = int(rate * (warmup + duration))
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        start = time.monotonic() + 0.2
        async with asyncio.TaskGroup() as tg:
            for i in range(total):
                due = start + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tg.create_task(
                    one(
                        http,
                        url=url,
                        key=key,
                        session=f"{prefix}s{i % sessions}",
                        tag=f"{prefix}{i}",
                        due=due,
                        warmup=i < rate * warmup,
                        out=results,
                    )
                )
        wall = time.monotonic() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {
        "rate": rate,
        "duration": duration,
        "warmup": warmup,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "results": [
            [r.id, r.due, r.sent, r.done, r.status, r.herald_ms, r.llm_ms, r.warmup]
            for r in results
        ],
    }


def main() -> None:
    """Run once and write the JSON results to `--out`."""
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--prefix", default="r")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = asyncio.run(
        generate(
            args.url,
            args.key,
            rate=args.rate,
            duration=args.duration,
            warmup=args.warmup,
            sessions=args.sessions,
            prefix=args.prefix,
        )
    )
    args.out.write_text(json.dumps(data), encoding="utf-8")


if __name__ == "__main__":
    main()
