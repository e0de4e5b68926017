"""`TriggerRuns` on SQLite and PostgreSQL: a delivery is claimed once (by delivery id or by
content), taken by one runner, queued again once when its process died, then interrupted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.triggers import Accepted, TriggerRuns, TriggerStatus

pytestmark = pytest.mark.timeout(30)


async def test_claims_takes_recovers_and_prunes(store: Store) -> None:
    runs = TriggerRuns(store)
    now = utcnow()

    async def accept(delivery: str, content: str | None) -> tuple[Accepted, int | None]:
        return await runs.accept(
            "gh",
            delivery,
            event="push",
            headers={"x-github-event": "push"},
            payload="{}",
            now=now,
            max_queued=2,
            content_key=content,
        )

    outcome, run_id = await accept("d-1", "c-1")
    assert outcome is Accepted.NEW
    assert run_id is not None
    assert (await accept("d-1", "c-other"))[0] is Accepted.DUPLICATE
    assert (await accept("d-other", "c-1"))[0] is Accepted.DUPLICATE
    assert (await accept("d-2", None))[0] is Accepted.NEW
    assert (await accept("d-3", None))[0] is Accepted.FULL  # two wait already
    assert await runs.waiting() == {"gh": 2}

    taken = await runs.take("herald-a", now, 1)
    assert [r.id for r in taken] == [run_id]
    assert await runs.take("herald-b", now, 1) != taken  # the other one, never the same
    # The process died during both runs: its next life queues them again, once.
    assert await runs.recover("herald-a", now, own=True, lease_ttl=None, max_attempts=2) == (
        1,
        0,
    )
    again = await runs.take("herald-a", now, 5)
    assert [r.attempts for r in again] == [2]
    assert await runs.recover("herald-a", now, own=False, lease_ttl=None, max_attempts=2) == (
        0,
        0,
    )
    assert await runs.recover("herald-a", now, own=True, lease_ttl=None, max_attempts=2) == (
        0,
        1,
    )
    cut = await runs.get(run_id)
    assert cut is not None
    assert cut.status is TriggerStatus.INTERRUPTED
    assert await runs.prune(now + timedelta(seconds=1)) == 1
    assert await runs.get(run_id) is None
    assert (await accept("d-1", "c-1"))[0] is Accepted.NEW  # forgotten after the retention
