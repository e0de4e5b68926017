"""Attacks on several accounts of one platform: what one account does (down, standby here,
pending) must not hold up another's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from gateway.access import Access, Decision, Verdict
from gateway.channels import Channels
from gateway.config import AccessConfig, DeliveryConfig
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import AccountId, ChatId
from gateway.delivery import DeliveryWorker
from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store.outbox import Chunk, Outbox, OutboxStatus, Target
from tests.fakes.platform import RecordingAdapter, inbound

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def worker(
    store: Store, adapter: RecordingAdapter, *, concurrency: int = 1
) -> AsyncIterator[DeliveryWorker]:
    """A running delivery worker: account `live` connected here, account `away` known but
    not connected here (its receiver runs on another instance)."""
    channels = Channels()
    channels.register("test", "live", adapter.limits, lambda: adapter)
    channels.register("test", "away", adapter.limits, lambda: None)
    config = DeliveryConfig(backoff_initial=0.01, backoff_max=0.05, concurrency=concurrency)
    delivery = DeliveryWorker(Outbox(store), channels, config, Metrics())
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(delivery.run())
        try:
            yield delivery
        finally:
            task.cancel()


def chunk(account: str, chat: str) -> Chunk:
    return Chunk(f"{account}:{chat}", Target("test", AccountId(account), ChatId(chat)), chat)


async def test_chats_of_an_account_not_live_here_never_starve_another_accounts(
    store: Store,
) -> None:
    """More due chats of an account whose receiver is elsewhere than one look returns
    (2 × concurrency), all older: the live account's chat is still served."""
    adapter = RecordingAdapter()
    outbox = Outbox(store)
    await outbox.enqueue([chunk("away", f"a{i}") for i in range(5)])
    await outbox.enqueue([chunk("live", "mine")])
    async with worker(store, adapter):
        delivered = await adapter.wait_for(lambda d: len(d) >= 1)
    assert [d.chat_id for d in delivered] == ["mine"]
    rows = await outbox.list()
    assert {r.target.chat_id for r in rows if r.status is OutboxStatus.PENDING} == {
        f"a{i}" for i in range(5)
    }, "the other account's chunks wait for the instance that holds its receiver"


async def test_flush_does_not_wait_for_chunks_of_an_account_not_live_here(
    store: Store,
) -> None:
    """At shutdown, the chunks of an account whose receiver runs elsewhere are not this
    instance's to send: flush is done once the live account's are out."""
    adapter = RecordingAdapter()
    outbox = Outbox(store)
    await outbox.enqueue([chunk("away", "theirs"), chunk("live", "mine")])
    async with worker(store, adapter) as delivery:
        assert await delivery.flush(20), "flush waited for another instance's chunks"
    assert [d.chat_id for d in adapter.delivered] == ["mine"]


async def test_strangers_flooding_one_bot_do_not_shut_pairing_on_another(store: Store) -> None:
    """`max_pending_pairings` codes asked on the family bot: a stranger writing to the work
    bot still gets a code of their own (the limit is per account, like the codes)."""
    sections = {
        ("test", account): PlatformSection(account=account, allowed_users=("alice",))
        for account in ("family", "work")
    }
    access = Access(store, sections, AccessConfig(max_pending_pairings=1, pairing_reply_interval=0))

    async def decide(sender: str, account: str) -> Decision:
        async with store.write() as conn:
            return await access.decide(conn, inbound("hi", sender=sender, account=account))

    first = await decide("s1", "family")
    flood = await decide("s2", "family")
    other = await decide("s3", "work")
    assert (first.verdict, flood.verdict, other.verdict) == (Verdict.PAIR,) * 3
    assert "pairing code" in (first.reply or "")
    assert "try again later" in (flood.reply or ""), "the family bot's limit holds"
    assert "pairing code" in (other.reply or ""), "the work bot was shut by the family bot's"
