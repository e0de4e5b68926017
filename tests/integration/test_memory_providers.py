"""The Honcho and Mem0 providers through their real SDKs against local fakes: what is stored
and recalled per person, and how each fault maps to the contract's errors."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import SecretStr

from agent_core.memory_providers import (
    MemoryHealth,
    MemoryProvider,
    MemoryRecall,
    MemoryRejected,
    MemoryState,
    MemoryUnavailable,
    Speaker,
    SyncedMessage,
    SyncedTurn,
)
from agent_core.memory_providers.config import HonchoConfig, Mem0Config
from agent_core.memory_providers.honcho import HonchoProvider
from agent_core.memory_providers.mem0 import Mem0Provider
from gateway.contracts.ids import UserId
from tests.fakes.honcho_server import FakeHoncho
from tests.fakes.mem0_server import FakeMem0
from tests.fakes.memory_service import FakeMemoryService

ALICE, BOB = UserId("u_alice"), UserId("u_bob")


def turn(person: UserId, said: str, answer: str, sync_id: int = 1, session: int = 7) -> SyncedTurn:
    return SyncedTurn(
        sync_id=sync_id,
        person=person,
        session_key=f"telegram:default:{person}",
        session_id=session,
        messages=(
            SyncedMessage(Speaker.PERSON, said),
            SyncedMessage(Speaker.AGENT, answer),
        ),
        at=datetime.now(UTC),
    )


@pytest.fixture
async def honcho() -> AsyncIterator[FakeHoncho]:
    async with FakeHoncho() as fake:
        yield fake


@pytest.fixture
async def mem0() -> AsyncIterator[FakeMem0]:
    async with FakeMem0() as fake:
        yield fake


def honcho_provider(fake: FakeHoncho, **extra: object) -> HonchoProvider:
    config = HonchoConfig.model_validate(
        {"base_url": fake.base_url, "api_key": fake.key, "request_timeout": 2, **extra}
    )
    return HonchoProvider(config)


def mem0_provider(fake: FakeMem0, tmp_path: Path, key: str | None = None) -> Mem0Provider:
    config = Mem0Config(
        base_url=fake.base_url, api_key=SecretStr(key or fake.key), request_timeout=2
    )
    return Mem0Provider(config, tmp_path / "state")


async def test_honcho_stores_each_turn_in_the_sessions_of_one_peer_per_person(
    honcho: FakeHoncho,
) -> None:
    async with honcho_provider(honcho) as provider:
        await provider.sync_turn(turn(ALICE, "My cat is called Tom", "Nice name!"))
        await provider.sync_turn(turn(BOB, "I live in Lyon", "Lovely city.", 2, session=8))
        await provider.sync_turn(turn(ALICE, "Tom is grey", "Noted.", 3, session=9))
        alice = await provider.prefetch(ALICE, "what is my cat called?", session_key="k")
        bob = await provider.prefetch(BOB, "where do I live?", session_key="k")
    assert honcho.said_by("u_alice") == ["My cat is called Tom", "Tom is grey"]
    assert honcho.said_by("herald") == ["Nice name!", "Lovely city.", "Noted."]
    assert honcho.sessions[("herald", "herald-7")] == {"u_alice", "herald"}
    assert honcho.sessions[("herald", "herald-8")] == {"u_bob", "herald"}
    first = honcho.messages[0]
    assert first.metadata == {"herald_sync_id": 1, "herald_session_key": "telegram:default:u_alice"}
    assert "Tom" in alice
    assert "Lyon" not in alice
    assert "Lyon" in bob
    assert "Tom" not in bob


async def test_honcho_dialectic_recall_asks_chat(honcho: FakeHoncho) -> None:
    async with honcho_provider(honcho, recall="dialectic") as provider:
        await provider.sync_turn(turn(ALICE, "I play the cello", "Wonderful."))
        recalled = await provider.prefetch(ALICE, "what do I play?", session_key="k")
    assert recalled.startswith("Dialectic:")
    assert "cello" in recalled
    assert any(s.path.endswith("/peers/u_alice/chat") for s in honcho.seen)


async def test_honcho_faults_map_to_retry_later_or_refused(honcho: FakeHoncho) -> None:
    async with honcho_provider(honcho) as provider:
        honcho.fail(1, 503)
        with pytest.raises(MemoryUnavailable):
            await provider.sync_turn(turn(ALICE, "a", "b"))
        honcho.rate_limit(1, retry_after=3)
        with pytest.raises(MemoryUnavailable) as limited:
            await provider.sync_turn(turn(ALICE, "a", "b"))
        assert limited.value.retry_after == 3
        await honcho.down()
        with pytest.raises(MemoryUnavailable):
            await provider.ping()
        await honcho.up()
        await provider.ping()
        await provider.sync_turn(turn(ALICE, "a", "b"))  # the same turn goes through now
    assert honcho.said_by("u_alice") == ["a"]
    async with honcho_provider(honcho, api_key="wrong") as refused:
        with pytest.raises(MemoryRejected):
            await refused.ping()


async def test_mem0_adds_with_the_person_and_searches_with_them_as_filter(
    mem0: FakeMem0, tmp_path: Path
) -> None:
    async with mem0_provider(mem0, tmp_path) as provider:
        await provider.sync_turn(turn(ALICE, "My cat is called Tom", "Nice name!"))
        await provider.sync_turn(turn(BOB, "My dog is called Rex", "Good dog.", 2))
        alice = await provider.prefetch(ALICE, "what is my cat called?", session_key="k")
        bob = await provider.prefetch(BOB, "what is my cat called?", session_key="k")
    assert mem0.of("u_alice") == ["My cat is called Tom"]
    assert mem0.adds[0]["user_id"] == "u_alice"
    assert mem0.adds[0]["messages"] == [
        {"role": "user", "content": "My cat is called Tom"},
        {"role": "assistant", "content": "Nice name!"},
    ]
    assert mem0.adds[0]["metadata"]["herald_sync_id"] == 1
    assert mem0.adds[0]["metadata"]["herald_agent"] == "herald"  # memory.mem0.agent_id
    searches = [s.body for s in mem0.seen if s.path == "/v3/memories/search/"]
    assert [s["filters"] for s in searches] == [{"user_id": "u_alice"}, {"user_id": "u_bob"}]
    assert alice == "- My cat is called Tom"
    assert "Tom" not in bob
    assert "Rex" in bob


async def test_mem0_stays_local_no_telemetry_and_no_home_folder(
    mem0: FakeMem0, tmp_path: Path
) -> None:
    async with mem0_provider(mem0, tmp_path) as provider:
        await provider.prefetch(ALICE, "anything at all?", session_key="k")
    from mem0.memory import telemetry

    assert telemetry.MEM0_TELEMETRY is False
    assert telemetry.client_telemetry.posthog is None


async def test_mem0_faults_map_to_retry_later_or_refused(mem0: FakeMem0, tmp_path: Path) -> None:
    await mem0.down()
    async with mem0_provider(mem0, tmp_path) as provider:
        # Down when Herald starts: the client cannot even be built; it is built later.
        with pytest.raises(MemoryUnavailable):
            await provider.prefetch(ALICE, "where do I live?", session_key="k")
        await mem0.up()
        mem0.rate_limit(1, retry_after=4)
        with pytest.raises(MemoryUnavailable) as limited:
            await provider.sync_turn(turn(ALICE, "I live in Lyon", "ok"))
        assert limited.value.retry_after == 4
        mem0.fail(1, 502)
        with pytest.raises(MemoryUnavailable):
            await provider.sync_turn(turn(ALICE, "I live in Lyon", "ok"))
        mem0.fail(1, 500)
        with pytest.raises(MemoryUnavailable):
            await provider.sync_turn(turn(ALICE, "I live in Lyon", "ok"))
        await provider.sync_turn(turn(ALICE, "I live in Lyon", "ok"))
        assert mem0.of("u_alice") == ["I live in Lyon"]
    async with mem0_provider(mem0, tmp_path, key="wrong") as refused:
        with pytest.raises(MemoryRejected):
            await refused.ping()


@pytest.mark.parametrize("service", ["honcho", "mem0"])
async def test_a_slow_provider_costs_a_turn_at_most_the_recall_timeout(
    service: str, honcho: FakeHoncho, mem0: FakeMem0, tmp_path: Path
) -> None:
    fake: FakeMemoryService = honcho if service == "honcho" else mem0
    provider: MemoryProvider = (
        honcho_provider(honcho) if service == "honcho" else mem0_provider(mem0, tmp_path)
    )
    failures: list[str] = []
    health = MemoryHealth(service)
    async with provider:
        recall = MemoryRecall(provider, health, timeout=0.3, on_failure=failures.append)
        await provider.sync_turn(turn(ALICE, "I collect stamps", "Fun."))
        assert "stamps" in await recall.recall(ALICE, "what do I collect?", session_key="k")
        fake.slow(5.0)
        started = time.monotonic()
        assert await recall.recall(ALICE, "what do I collect?", session_key="k") == ""
        took = time.monotonic() - started
        fake.slow(0)
    # The fake answers after 5 s: a recall back in under half of that was cut by the 0.3 s
    # timeout (a bound with room for a stalled machine, not a measurement).
    assert took < 5.0 / 2
    assert failures == ["timeout"]
    assert health.state is MemoryState.UNREACHABLE


async def test_honcho_skips_a_resent_turn_it_already_holds(honcho: FakeHoncho) -> None:
    async with honcho_provider(honcho) as provider:
        first = turn(ALICE, "I moved to Porto", "Nice.", sync_id=5)
        await provider.sync_turn(first)
        # Herald died before it could record the success: the same sync comes again.
        await provider.sync_turn(dataclasses.replace(first, resent=True))
    assert honcho.said_by("u_alice") == ["I moved to Porto"]


async def test_user_md_edits_are_mirrored(
    honcho: FakeHoncho, mem0: FakeMem0, tmp_path: Path
) -> None:
    async with honcho_provider(honcho) as provider:
        await provider.on_memory_write(ALICE, "user", "add", "Prefers short answers")
        await provider.on_memory_write(ALICE, "memory", "add", "Working on the garden plan")
        await provider.on_memory_write(ALICE, "user", "remove", "Prefers short answers")
        recalled = await provider.prefetch(ALICE, "how should I answer?", session_key="k")
    assert [c["content"] for c in honcho.conclusions] == ["Prefers short answers"]
    assert honcho.conclusions[0]["observer_id"] == "herald"
    assert honcho.conclusions[0]["observed_id"] == "u_alice"
    assert "Prefers short answers" in recalled
    async with mem0_provider(mem0, tmp_path) as m0:
        await m0.on_memory_write(ALICE, "user", "add", "Prefers short answers")
    assert mem0.of("u_alice") == ["Prefers short answers"]
    assert mem0.adds[0]["infer"] is False
