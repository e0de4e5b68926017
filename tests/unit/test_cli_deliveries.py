"""`herald deliveries list|retry`, against an outbox on a SQLite file under tmp_path.

The rows are written with the `Outbox` API first; each command runs in a worker thread
(it calls `asyncio.run` itself), as in tests/unit/test_cli.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.contracts.ids import AccountId, ChatId
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.outbox import Chunk, Outbox, OutboxRow, OutboxStatus, Target
from tests.unit.cli_harness import Herald

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_environment")]

TARGET = Target("test", AccountId("acct"), ChatId("chat-42"))


async def outbox_row(herald: Herald, row_id: int) -> OutboxRow:
    """The outbox row as the database holds it now."""
    async with Store.open(herald.database_url) as store:
        row = await Outbox(store).get(row_id)
    assert row is not None
    return row


async def add_rows(herald: Herald) -> dict[str, int]:
    """A dead letter, a pending chunk and a sent chunk; their ids by name."""
    async with Store.open(herald.database_url) as store:
        box = Outbox(store)
        dead, pending, sent = await box.enqueue(
            [
                Chunk("dead-key", TARGET, "a reply that never arrived"),
                Chunk("pending-key", TARGET, "a reply on its way"),
                Chunk("sent-key", TARGET, "a reply delivered"),
            ]
        )
        assert await box.claim(dead)
        await box.dead(dead, "Forbidden: bot was blocked by the user")
        assert await box.claim(sent)
        await box.sent(sent, "m-1", utcnow())
    return {"dead": dead, "pending": pending, "sent": sent}


def lines_with(output: str, needle: str) -> list[str]:
    return [line for line in output.splitlines() if needle in line]


async def test_database_is_under_tmp_path(herald: Herald, tmp_path: Path) -> None:
    assert herald.database_url.startswith("sqlite+aiosqlite:///")
    assert str(tmp_path) in herald.database_url


async def test_list_dead_shows_the_dead_letter_only(herald: Herald) -> None:
    ids = await add_rows(herald)
    result = await herald.invoke("deliveries", "list", "--dead")
    assert result.exit_code == 0, result.output
    [line] = lines_with(result.output, "a reply that never arrived")
    assert str(ids["dead"]) in line.split()
    assert "dead" in line
    assert "test:chat-42" in line
    assert "Forbidden: bot was blocked by the user" in line
    assert "on its way" not in result.output
    assert "a reply delivered" not in result.output


async def test_list_shows_every_status_and_pending_filters(herald: Herald) -> None:
    await add_rows(herald)
    everything = await herald.invoke("deliveries", "list")
    assert everything.exit_code == 0, everything.output
    for text, status in [
        ("a reply that never arrived", "dead"),
        ("a reply on its way", "pending"),
        ("a reply delivered", "sent"),
    ]:
        [line] = lines_with(everything.output, text)
        assert status in line
    pending = await herald.invoke("deliveries", "list", "--pending")
    assert pending.exit_code == 0, pending.output
    assert lines_with(pending.output, "a reply on its way")
    assert not lines_with(pending.output, "a reply that never arrived")


async def test_list_dead_with_no_dead_letters(herald: Herald) -> None:
    async with Store.open(herald.database_url) as store:
        await Outbox(store).enqueue([Chunk("k", TARGET, "hello")])
    result = await herald.invoke("deliveries", "list", "--dead")
    assert result.exit_code == 0, result.output
    assert "no dead deliveries" in result.output


async def test_retry_makes_a_dead_letter_pending_again(herald: Herald) -> None:
    ids = await add_rows(herald)
    result = await herald.invoke("deliveries", "retry", str(ids["dead"]))
    assert result.exit_code == 0, result.output
    assert f"{ids['dead']}: queued again for test:chat-42" in result.output
    row = await outbox_row(herald, ids["dead"])
    assert row.status is OutboxStatus.PENDING
    assert row.attempts == 0
    assert row.last_error is None
    listed = await herald.invoke("deliveries", "list", "--dead")
    assert "no dead deliveries" in listed.output


async def test_retry_of_an_unknown_id_exits_1_with_a_clear_error(herald: Herald) -> None:
    await add_rows(herald)
    result = await herald.invoke("deliveries", "retry", "9999")
    assert result.exit_code == 1, result.output
    assert "there is no dead letter with id 9999" in result.stderr
    assert "queued again" not in result.stdout


async def test_retry_of_a_row_that_is_not_dead_exits_1(herald: Herald) -> None:
    ids = await add_rows(herald)
    result = await herald.invoke("deliveries", "retry", str(ids["sent"]))
    assert result.exit_code == 1, result.output
    assert f"there is no dead letter with id {ids['sent']}" in result.stderr
    assert (await outbox_row(herald, ids["sent"])).status is OutboxStatus.SENT


async def test_retry_of_several_ids_retries_the_good_ones_and_exits_1(herald: Herald) -> None:
    ids = await add_rows(herald)
    result = await herald.invoke("deliveries", "retry", "9999", str(ids["dead"]))
    assert result.exit_code == 1, result.output
    assert "there is no dead letter with id 9999" in result.stderr
    assert f"{ids['dead']}: queued again" in result.stdout
    assert (await outbox_row(herald, ids["dead"])).status is OutboxStatus.PENDING


async def test_list_shows_a_failed_delivery_report(herald: Herald) -> None:
    ids = await add_rows(herald)
    async with Store.open(herald.database_url) as store:
        assert await Outbox(store).delivery_report(
            "test", "acct", "m-1", "undelivered", "twilio undelivered: error 30003"
        )
    result = await herald.invoke("deliveries", "list")
    assert result.exit_code == 0, result.output
    [line] = lines_with(result.output, "a reply delivered")
    assert str(ids["sent"]) in line.split()
    assert "sent, undelivered" in line
    assert "error 30003" in result.output


async def test_discard_keeps_a_dead_letter_as_discarded(herald: Herald) -> None:
    ids = await add_rows(herald)
    result = await herald.invoke("deliveries", "discard", str(ids["dead"]), str(ids["sent"]))
    assert result.exit_code == 1, result.output
    assert f"{ids['dead']}: discarded (to test:chat-42)" in result.stdout
    assert f"there is no dead letter with id {ids['sent']}" in result.stderr
    assert (await outbox_row(herald, ids["dead"])).status is OutboxStatus.DISCARDED
    again = await herald.invoke("deliveries", "retry", str(ids["dead"]))
    assert again.exit_code == 1
