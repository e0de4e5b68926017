"""A micro-benchmark of the store work of one HTTP API turn, in this process.

Per turn, what `POST /v1/chat/completions` asks of the store for a named session when the
model answers at once: whose session it is (creating it on first sight), begin the turn
(the session, the turn with the user's message, the history with the last turn's usage, in
one transaction), finish the turn (with the reply).
`--concurrency` turns run at once, each in one of `--sessions` sessions (one turn per session
at a time, as lanes do). Prints turns/s, wall ms per turn (p50 / p99) and this process's CPU
ms per turn.

Diagnosis only, like the rest of bench/: the numbers are for before/after comparisons.

`python -m bench.store_turn [--url URL] [--turns 2000] [--concurrency 8] [--sessions 1000]`
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.stats import percentile
from gateway.contracts.history import ChatMessage, Role, TurnResult
from gateway.contracts.ids import SessionKey
from gateway.store import Store
from gateway.store.store import current_session, read_history, record_finish, record_start


async def _snapshot(*_: object) -> tuple[str, str]:
    return "", ""


async def one_turn(store: Store, key: SessionKey) -> None:
    """The store calls of one API turn, in the order the gateway makes them."""
    session, _ = await store.session_of(key, ("local", "owner"))  # whose session it is
    if session is None:
        user_id = await store.resolve_user("local", "owner")
        await store.open_session(key, platform="api", user_id=user_id, snapshot=_snapshot)
    # The turn begins: its session, the turn with the user's message, the history.
    async with store.write() as conn:
        current = await current_session(conn, key)
        assert current is not None
        turn_id, _ = await record_start(conn, current.id, [ChatMessage(Role.USER, "hi")])
        await read_history(conn, current.id, 40)
    reply = ChatMessage(Role.ASSISTANT, "hello")
    async with store.write() as conn:
        await record_finish(
            conn,
            current.id,
            turn_id,
            TurnResult("completed", (reply,), prompt_tokens=5, completion_tokens=1),
        )


async def run(url: str, turns: int, concurrency: int, sessions: int) -> dict[str, float]:
    """Run `turns` turns, `concurrency` at once; return the figures."""
    async with Store.open(url) as store:
        # Warm up: every session exists, statements are compiled and cached.
        for i in range(sessions):
            await one_turn(store, SessionKey(f"api:default:s{i}"))
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(turns):
            queue.put_nowait(i)
        walls: list[float] = []

        async def worker(w: int) -> None:
            while not queue.empty():
                i = queue.get_nowait()
                # Worker w only takes sessions ≡ w (mod concurrency): one turn per session.
                key = SessionKey(f"api:default:s{(i * concurrency + w) % sessions}")
                started = time.perf_counter()
                await one_turn(store, key)
                walls.append((time.perf_counter() - started) * 1000)

        cpu0, wall0 = time.process_time(), time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for w in range(concurrency):
                tg.create_task(worker(w))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "turns_per_s": turns / wall,
        "wall_p50_ms": percentile(walls, 50),
        "wall_p99_ms": percentile(walls, 99),
        "cpu_ms_per_turn": cpu * 1000 / turns,
    }


def main() -> None:
    """Parse the command line, run, print one line."""
    parser = argparse.ArgumentParser(prog="python -m bench.store_turn", description=__doc__)
    parser.add_argument("--url", default="")
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="herald-store-turn-") as tmp:
        url = args.url or f"sqlite+aiosqlite:///{Path(tmp) / 'herald.db'}"
        figures = asyncio.run(run(url, args.turns, args.concurrency, args.sessions))
    print(
        f"concurrency={args.concurrency} turns/s={figures['turns_per_s']:.0f} "
        f"wall p50={figures['wall_p50_ms']:.2f} ms p99={figures['wall_p99_ms']:.2f} ms "
        f"cpu/turn={figures['cpu_ms_per_turn']:.2f} ms"
    )


if __name__ == "__main__":
    main()
