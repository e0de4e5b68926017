"""Three instances on one PostgreSQL with two Telegram accounts: the accounts' receivers
spread over the instances, and stopping the holder of one account's lease moves that
account alone; the other account's receiver goes on untouched."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PgServer
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import Herald, running_daemon
from tests.integration.telegram_rig import ANN

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

FAMILY = ("telegram", "family")
WORK = ("telegram", "work")


def section(family: FakeTelegramServer, work: FakeTelegramServer) -> dict[str, Any]:
    def one(tg: FakeTelegramServer, token: str) -> dict[str, Any]:
        return {"token": token, "base_url": tg.base_url, "base_file_url": tg.base_file_url}

    return {
        "allowed_users": [str(ANN)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
        "accounts": {
            "family": one(family, "111111:family-token"),
            "work": one(work, "222222:work-token"),
        },
    }


@contextlib.asynccontextmanager
async def instance(tmp: Path, name: str, url: str, llm: FakeLLM, telegram: dict[str, Any]) -> Any:
    extra = {
        "database_url": url,
        "instance_id": name,
        "cluster": {"lease_ttl": 10, "heartbeat_interval": 0.5, "scan_interval": 0.2},
    }
    async with running_daemon(tmp / name, llm, "telegram", telegram, extra=extra) as herald:
        yield herald


def holder(instances: list[Herald], key: tuple[str, str]) -> Herald | None:
    held = [h for h in instances if h.supervisor.receiver_leases[key].held()]
    return held[0] if len(held) == 1 else None


async def test_accounts_spread_and_fail_over_separately(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: PgServer = request.getfixturevalue("pg_server")
    database: str = request.getfixturevalue("pg_database")
    server.copy_database(database, request.getfixturevalue("pg_template"))  # migrated
    url = server.url(database)
    async with (
        FakeTelegramServer("111111:family-token", bot_username="family_bot") as family,
        FakeTelegramServer("222222:work-token", bot_username="work_bot") as work,
        FakeLLM() as llm,
        contextlib.AsyncExitStack() as later,
        contextlib.AsyncExitStack() as stack,
    ):
        telegram = section(family, work)
        a = await stack.enter_async_context(instance(tmp_path, "a", url, llm, telegram))
        await a.until(lambda: holder([a], FAMILY) and holder([a], WORK), timeout=30)
        b = await later.enter_async_context(instance(tmp_path, "b", url, llm, telegram))
        everyone = [a, b]
        # a holds both; b holds none: a hands one over (its newest) and b takes it.
        await a.until(lambda: holder(everyone, FAMILY) not in (None, holder(everyone, WORK)))
        async with instance(tmp_path, "c", url, llm, telegram) as c:
            everyone.append(c)
            first = holder(everyone, FAMILY)
            steady = holder(everyone, WORK)
            # a took both in one beat and handed over the newer one.
            assert (first, steady) == (a, b)
            assert steady is not None
            work_lease = steady.supervisor.receiver_leases[WORK]
            token = work_lease.token
            work_runner = steady.supervisor.runners["telegram:work"]
            adapter = work_runner.adapter

            family.inject_message(ANN, "before", sender_id=ANN)
            await family.wait_for_sent(1, timeout=30)

            # The family holder stops: family moves, work's receiver goes on as it was.
            await stack.aclose()
            everyone.remove(a)
            await c.until(lambda: holder(everyone, FAMILY) is not None, timeout=30)
            family.inject_message(ANN, "after", sender_id=ANN)
            [_, again] = await family.wait_for_sent(2, timeout=30)
            assert again.plain_text == "You said: after"
            work.inject_message(ANN, "still there?", sender_id=ANN)
            [answer] = await work.wait_for_sent(1, timeout=30)
            assert answer.plain_text == "You said: still there?"
            assert holder(everyone, WORK) is steady
            assert work_lease.token == token  # never lost and taken again
            assert work_runner.adapter is adapter  # never reconnected
            assert work_runner.restarts == 0
