"""Scenario 9: scaling out, one against two `herald run` instances on one PostgreSQL.

The same offered load through the HTTP API (open loop, fake LLM answering at once), first to
one instance, then split evenly between two instances on the same (fresh) database, in the
same run. Each instance gets sessions of its own, as a load balancer that keeps a session
on one instance would send them (a session's turns still take turns through the `lanes`
table, so any instance may serve any session). Reported per step: turns/s achieved by all
instances together, Herald's own time (the worse instance's p50 and p99), requests refused,
and the servers' CPU per answered turn (all instances' CPU over all their answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from bench.context import Context
from bench.procs import database, fake_llm, herald
from bench.scenarios.api import _one_run
from bench.stats import fmt_spread, spread

NAME = "scaleout"
TITLE = "Scaling out: one against two instances on one PostgreSQL (HTTP API)"
RATES = (50, 100, 200)
INSTANCES = (1, 2)


async def run(ctx: Context) -> dict[str, Any]:
    """Every offered rate with one and with two instances, `ctx.runs` times each
    (PostgreSQL only: SQLite serves one instance)."""
    if "postgres" not in ctx.backends:
        return {}
    duration = ctx.scaled(10, 2)
    warmup = ctx.scaled(3, 1)
    rates = RATES if not ctx.quick else (50,)
    out: dict[str, Any] = {}
    work = ctx.dir(NAME)
    async with fake_llm(work) as llm_url:
        for count in INSTANCES:
            steps: dict[str, Any] = {}
            async with contextlib.AsyncExitStack() as stack:
                url = await stack.enter_async_context(database("postgres", work / f"db{count}"))
                daemons = [
                    await stack.enter_async_context(
                        herald(
                            work / f"state{count}-{i}",
                            url,
                            instance_id=f"bench-{count}-{i}",
                            llm={"base_url": llm_url, "api_key": "sk-bench", "memory_pass": False},
                        )
                    )
                    for i in range(count)
                ]
                for rate in rates:
                    runs = []
                    for r in range(ctx.runs):
                        parts = await asyncio.gather(
                            *(
                                _one_run(
                                    work,
                                    d.url,
                                    d.proc.pid if d.proc else 0,
                                    llm_url,
                                    rate=max(1, round(rate / count)),
                                    duration=duration,
                                    warmup=warmup,
                                    prefix=f"{count}i{i}-{rate}r{r}-",
                                )
                                for i, d in enumerate(daemons)
                            )
                        )
                        runs.append(_together(parts, rate))
                    steps[str(rate)] = {k: spread([r[k] for r in runs]) for k in runs[0]}
            out[str(count)] = steps
    return out


def _together(parts: list[dict[str, float]], rate: int) -> dict[str, float]:
    """One step's figures over all instances."""

    def answered(p: dict[str, float]) -> float:
        return max(p["achieved"], 1e-9)

    total = sum(answered(p) for p in parts)
    return {
        "offered": float(rate),
        "achieved": sum(p["achieved"] for p in parts),
        "refused": sum(p["refused"] for p in parts),
        "errors": sum(p["errors"] for p in parts),
        "herald_p50_ms": max(p["herald_p50_ms"] for p in parts),
        "herald_p99_ms": max(p["herald_p99_ms"] for p in parts),
        "server_cpu_ms": sum(p["server_cpu_ms"] * answered(p) for p in parts) / total,
        "gen_lag_p99_ms": max(p["gen_lag_p99_ms"] for p in parts),
    }


def table(data: dict[str, Any]) -> str:
    """Markdown rows: one per instance count and offered rate."""
    head = (
        "| instances | offered/s | achieved turns/s | Herald p50 ms | Herald p99 ms "
        "| refused (503) | errors | server CPU ms per answer | generator lag p99 ms |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    for count, steps in data.items():
        for rate, s in steps.items():
            if math.isnan(s["achieved"]["median"]):
                continue
            rows.append(
                f"| {count} | {rate} | {fmt_spread(s['achieved'], 0)} "
                f"| {fmt_spread(s['herald_p50_ms'], 1)} | {fmt_spread(s['herald_p99_ms'], 1)} "
                f"| {fmt_spread(s['refused'], 0)} | {fmt_spread(s['errors'], 0)} "
                f"| {fmt_spread(s['server_cpu_ms'], 1)} | {fmt_spread(s['gen_lag_p99_ms'], 1)} |"
            )
    return "\n".join([head, *rows])


def plot(fig: Any, data: dict[str, Any]) -> None:
    """Achieved vs offered rate, one line per instance count."""
    ax = fig.subplots(1, 1)
    for count, steps in data.items():
        offered = [float(r) for r in steps]
        ax.plot(
            offered,
            [s["achieved"]["median"] for s in steps.values()],
            "o-",
            label=f"{count} instance(s)",
        )
    ax.plot([0, max(RATES)], [0, max(RATES)], ":", color="grey", label="offered")
    ax.set(xlabel="offered requests/s (all instances)", ylabel="achieved turns/s")
    ax.legend()
