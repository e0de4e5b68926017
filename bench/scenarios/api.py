"""Scenario 1: gateway overhead and throughput through the HTTP API (fake LLM answers at once).

Open-loop load over 1,000 sessions, stepped. Herald's own overhead per turn comes from its
`Server-Timing` header (arrival to response, less the model calls) and is cross-checked from
outside: the client's latency less the fake LLM's own time for the same request. A last row,
`floor`, offers the same load to `bench.floor_app` (the HTTP stack and model client alone),
for what this machine allows any gateway built on them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx

from bench.context import Context
from bench.procs import API_KEY, cpu_seconds, database, fake_llm, floor_app, herald, process
from bench.stats import fmt_spread, percentile, spread

NAME = "api"
TITLE = "Gateway overhead and throughput (HTTP API)"
RATES = (50, 100, 200, 500, 1000)
FLOOR = "floor"
"""The row of `bench.floor_app`: FastAPI, uvicorn and the model client with no gateway."""
SESSIONS = 1000


async def run(ctx: Context) -> dict[str, Any]:
    """Every offered rate on every backend, `ctx.runs` times each."""
    out: dict[str, Any] = {}
    duration = ctx.scaled(10, 2)
    warmup = ctx.scaled(3, 1)
    rates = RATES if not ctx.quick else (50, 200)
    for backend in ctx.backends:
        work = ctx.dir(NAME, backend)
        steps: dict[str, Any] = {}
        async with (
            fake_llm(work) as llm_url,
            database(backend, work / "db") as url,
            herald(
                work / "state",
                url,
                llm={"base_url": llm_url, "api_key": "sk-bench", "memory_pass": False},
            ) as daemon,
        ):
            for rate in rates:
                runs = []
                for i in range(ctx.runs):
                    runs.append(
                        await _one_run(
                            work,
                            daemon.url,
                            daemon.proc.pid if daemon.proc else 0,
                            llm_url,
                            rate=rate,
                            duration=duration,
                            warmup=warmup,
                            prefix=f"{rate}r{i}-",
                        )
                    )
                steps[str(rate)] = _combine(runs)
        out[backend] = steps
    # The same load on the HTTP stack and model client alone: the ceiling of this machine.
    work = ctx.dir(NAME, FLOOR)
    async with fake_llm(work) as llm_url, floor_app(work, llm_url) as (url, pid):
        steps = {}
        for rate in rates:
            runs = [
                await _one_run(
                    work,
                    url,
                    pid,
                    llm_url,
                    rate=rate,
                    duration=duration,
                    warmup=warmup,
                    prefix=f"{rate}r{i}-",
                )
                for i in range(ctx.runs)
            ]
            steps[str(rate)] = _combine(runs)
        out[FLOOR] = steps
    return out


async def _one_run(
    work: Path,
    url: str,
    pid: int,
    llm_url: str,
    *,
    rate: int,
    duration: int,
    warmup: int,
    prefix: str,
) -> dict[str, float]:
    """One load generator run against the server at `url` (process `pid`)."""
    result = work / f"load-{prefix}json"
    store_before = await store_counters(url)
    cpu_before = cpu_seconds(pid)
    async with process(
        sys.executable,
        "-m",
        "bench.loadgen",
        "--url",
        url,
        "--key",
        API_KEY,
        "--rate",
        str(rate),
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
        "--sessions",
        str(SESSIONS),
        "--prefix",
        prefix,
        "--out",
        str(result),
        log=work / "loadgen.log",
    ) as proc:
        await proc.wait()
    cpu = cpu_seconds(pid) - cpu_before
    store_after = await store_counters(url)
    data = json.loads(result.read_text())
    async with httpx.AsyncClient() as client:
        llm_timings = (await client.get(llm_url.removesuffix("/v1") + "/bench/timings")).json()
    figures = _measure(data, llm_timings["timings"], duration, cpu)
    answered = max(sum(1 for r in data["results"] if r[4] == 200), 1)
    for name, before in store_before.items():
        figures[f"{name}_per_turn"] = (store_after[name] - before) / answered
    return figures


STORE_COUNTERS = ("statements", "transactions", "handoffs", "pings")
"""`herald_store_<name>_total` in `/metrics`: the store's work, read around each run."""


async def store_counters(url: str) -> dict[str, float]:
    """The server's `herald_store_*_total` counters now (none from the floor)."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(
            f"{url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}
        )
    if response.status_code != 200:
        return {}
    values: dict[str, float] = {}
    for line in response.text.splitlines():
        for name in STORE_COUNTERS:
            if line.startswith(f"herald_store_{name}_total "):
                values[name] = float(line.split()[1])
    return values


def _measure(
    data: dict[str, Any], llm: dict[str, list[float]], duration: float, cpu: float
) -> dict[str, float]:
    rows = [r for r in data["results"] if not r[7]]
    ok = [r for r in rows if r[4] == 200]
    herald_ms = [r[5] for r in ok if r[5] is not None]
    latency_ms = [(r[3] - r[1]) * 1000 for r in ok]
    outside_ms = [
        (r[3] - r[2]) * 1000 - (llm[r[0]][1] - llm[r[0]][0]) * 1000 for r in ok if r[0] in llm
    ]
    lag_ms = [(r[2] - r[1]) * 1000 for r in data["results"]]
    first_due = min((r[1] for r in rows), default=0.0)
    last_done = max((r[3] for r in ok), default=first_due)
    span = max(last_done - first_due, duration)
    return {
        "offered": float(data["rate"]),
        "achieved": len(ok) / span,
        "refused": float(sum(1 for r in rows if r[4] == 503)),
        "errors": float(sum(1 for r in rows if r[4] not in (200, 503))),
        "herald_p50_ms": percentile(herald_ms, 50),
        "herald_p99_ms": percentile(herald_ms, 99),
        "outside_p50_ms": percentile(outside_ms, 50),
        "outside_p99_ms": percentile(outside_ms, 99),
        "latency_p50_ms": percentile(latency_ms, 50),
        "latency_p99_ms": percentile(latency_ms, 99),
        "gen_lag_p99_ms": percentile(lag_ms, 99),
        "gen_cpu_share": data["cpu_seconds"] / max(data["wall_seconds"], 1e-9),
        # The server's CPU over the whole run (warm-up included) per request it answered:
        # every thread of the process, so SQLite's threads count too.
        "server_cpu_ms": cpu * 1000 / max(sum(1 for r in data["results"] if r[4] == 200), 1),
    }


def _combine(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {key: spread([r[key] for r in runs]) for key in runs[0]}


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per backend and offered rate."""
    head = (
        "| store | offered/s | achieved/s | Herald p50 ms | Herald p99 ms | outside p50 ms "
        "| outside p99 ms | client p99 ms | refused (503) | errors | generator lag p99 ms "
        "| server CPU ms per answer | statements per turn | transactions per turn "
        "| hand-offs per turn | pings per turn |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    for backend, steps in data.items():
        for rate, s in steps.items():
            rows.append(
                f"| {backend} | {rate} | {fmt_spread(s['achieved'], 0)} "
                f"| {fmt_spread(s['herald_p50_ms'], 2)} | {fmt_spread(s['herald_p99_ms'], 2)} "
                f"| {fmt_spread(s['outside_p50_ms'], 2)} | {fmt_spread(s['outside_p99_ms'], 2)} "
                f"| {fmt_spread(s['latency_p99_ms'], 1)} | {fmt_spread(s['refused'], 0)} "
                f"| {fmt_spread(s['errors'], 0)} "
                f"| {fmt_spread(s['gen_lag_p99_ms'], 1)} "
                f"| {fmt_spread(s['server_cpu_ms'], 1) if 'server_cpu_ms' in s else '–'} "
                + "".join(
                    f"| {fmt_spread(s[k], 1) if k in s else '–'} "
                    for k in (f"{name}_per_turn" for name in STORE_COUNTERS)
                )
                + "|"
            )
    return "\n".join([head, *rows])


def plot(fig: Any, data: dict[str, Any]) -> None:
    """Achieved vs offered rate, and Herald's p99 overhead vs offered rate."""
    left, right = fig.subplots(1, 2)
    for backend, steps in data.items():
        offered = [float(r) for r in steps]
        left.plot(offered, [s["achieved"]["median"] for s in steps.values()], "o-", label=backend)
        right.plot(
            offered, [s["herald_p99_ms"]["median"] for s in steps.values()], "o-", label=backend
        )
    left.plot([0, max(RATES)], [0, max(RATES)], ":", color="grey", label="offered")
    left.set(xlabel="offered requests/s", ylabel="achieved turns/s")
    right.set(xlabel="offered requests/s", ylabel="Herald overhead p99 (ms)", yscale="log")
    left.legend()
    right.legend()
