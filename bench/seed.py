"""Filling a store fast for the benchmarks: sessions, turns and messages in bulk inserts."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from sqlalchemy import insert, select

from gateway.contracts.ids import UserId
from gateway.store import Store
from gateway.store.store import owner_key
from gateway.store.tables import messages, sessions, users

BATCH = 5000
_COMMON = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu invoice "
    "meeting deadline report budget server backup database release deploy customer ticket "
    "weekend holiday flight train dinner recipe garden weather python telegram slack discord "
    "email schedule reminder summary project roadmap"
)
WORDS = _COMMON.split()


def vocabulary(size: int, seed: int = 7) -> list[str]:
    """`size` distinct words: the common ones above, then made-up rare ones."""
    rng = random.Random(seed)
    extra = {
        "".join(rng.choice("bcdfghjklmnprstvz") + rng.choice("aeiou") for _ in range(3))
        for _ in range(size * 2)
    }
    return (WORDS + sorted(extra))[:size]


def sentence(rng: random.Random, vocab: list[str], words: int = 12) -> str:
    """Words drawn with a Zipf-like skew: a few are common, most are rare."""
    n = len(vocab)
    return " ".join(vocab[min(int(rng.paretovariate(1.1)) - 1, n - 1)] for _ in range(words))


async def seed_users(store: Store, count: int) -> list[str]:
    """`count` users; their ids."""
    now = datetime.now(UTC)
    ids = [f"bench-user-{i}" for i in range(count)]
    async with store.write() as conn:
        await conn.execute(
            insert(users), [{"id": u, "display_name": u, "created_at": now} for u in ids]
        )
    return ids


async def seed_sessions(
    store: Store, count: int, *, platform: str = "api", users_: list[str] | None = None
) -> list[int]:
    """`count` sessions keyed `<platform>:default:bench<i>`; their ids in order."""
    now = datetime.now(UTC)
    ids: list[int] = []
    for start in range(0, count, BATCH):
        rows = [
            {
                "key": f"{platform}:default:bench{i}",
                "epoch": 0,
                "platform": platform,
                "user_id": users_[i % len(users_)] if users_ else None,
                "user_snapshot": "",
                "memory_snapshot": "",
                "created_at": now,
                "updated_at": now,
                "message_count": 0,
            }
            for i in range(start, min(start + BATCH, count))
        ]
        async with store.write() as conn:
            result = await conn.execute(insert(sessions).returning(sessions.c.id), rows)
            ids.extend(int(r) for r in result.scalars())
    return ids


async def seed_messages(
    store: Store,
    session_ids: list[int],
    count: int,
    *,
    vocab: list[str] | None = None,
    seed: int = 11,
) -> None:
    """`count` messages spread round robin over the sessions, alternating user / assistant."""
    rng = random.Random(seed)
    words = vocab or vocabulary(5000)
    now = datetime.now(UTC)
    async with store.read() as conn:
        pairs = (await conn.execute(select(sessions.c.id, sessions.c.user_id))).all()
    owners = {int(r[0]): None if r[1] is None else owner_key(UserId(r[1])) for r in pairs}
    for start in range(0, count, BATCH):
        rows = [
            {
                "session_id": session_ids[i % len(session_ids)],
                "owner": owners[session_ids[i % len(session_ids)]],
                "role": "user" if i % 2 == 0 else "assistant",
                "content": sentence(rng, words),
                "interrupted": False,
                "created_at": now,
            }
            for i in range(start, min(start + BATCH, count))
        ]
        async with store.write() as conn:
            await conn.execute(insert(messages), rows)
