"""`herald memory status`, `herald memory test` and the memory line of `herald doctor`,
against the fake Honcho; and the `memory` config section's validation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent_core.memory import MemoryFiles
from agent_core.memory_providers import Speaker, SyncedMessage, SyncedTurn
from agent_core.memory_providers.config import HonchoConfig
from agent_core.memory_providers.honcho import HonchoProvider
from gateway.config import HeraldConfig
from gateway.contracts.ids import SessionId, UserId
from gateway.store import Store
from gateway.store import memory_sync as sql
from gateway.store.memory_docs import SqlMemoryDocs
from gateway.store.memory_sync import SyncKind
from tests.fakes.honcho_server import FakeHoncho
from tests.unit.cli_harness import Herald
from tests.unit.test_cli import verdicts


@pytest.fixture
async def honcho() -> AsyncIterator[FakeHoncho]:
    async with FakeHoncho() as fake:
        yield fake


def with_honcho(herald: Herald, fake: FakeHoncho, key: str | None = None) -> Herald:
    section: dict[str, Any] = {
        "provider": "honcho",
        "honcho": {"base_url": fake.base_url, "api_key": key or fake.key},
    }
    return herald.configure(memory=section)


async def test_status_without_a_provider(herald: Herald) -> None:
    await herald.create_database()
    result = await herald.invoke("memory", "status")
    assert result.exit_code == 0, result.output
    assert "provider: none" in result.stdout
    assert "queued syncs: 0" in result.stdout


async def test_status_shows_reachability_queued_and_dead_syncs(
    herald: Herald, honcho: FakeHoncho
) -> None:
    with_honcho(herald, honcho)
    await herald.create_database()
    async with Store.open(herald.database_url) as store, store.write() as conn:
        for text in ("one", "two", "three"):
            last = await sql.enqueue(
                conn,
                UserId("u_alice"),
                SyncKind.TURN,
                {"messages": [{"speaker": "person", "content": text}]},
                session_key="api:default:s",
                session_id=SessionId(1),
            )
        await sql.give_up(conn, last, "Honcho refused the request: 422")
    result = await herald.invoke("memory", "status")
    assert result.exit_code == 0, result.output
    assert "provider: honcho" in result.stdout
    assert "reachable: ok" in result.stdout
    assert "queued syncs: 2" in result.stdout
    assert "dead syncs: 1" in result.stdout
    assert "Honcho refused the request: 422" in result.stdout

    await honcho.down()
    result = await herald.invoke("memory", "status", "--json")
    assert result.exit_code == 0, result.output
    assert '"reachable": "unreachable"' in result.stdout


async def test_memory_test_shows_what_recall_would_bring(
    herald: Herald, honcho: FakeHoncho
) -> None:
    with_honcho(herald, honcho)
    await herald.create_database()
    async with Store.open(herald.database_url) as store:
        alice = await store.resolve_user("telegram", "1")
    config = HonchoConfig.model_validate({"base_url": honcho.base_url, "api_key": honcho.key})
    async with HonchoProvider(config) as provider:
        await provider.sync_turn(
            SyncedTurn(
                1,
                alice,
                "telegram:default:1",
                3,
                (SyncedMessage(Speaker.PERSON, "I grow tomatoes"),),
                datetime.now(UTC),
            )
        )
    result = await herald.invoke("memory", "test", "what do I grow?", "--user", "telegram:1")
    assert result.exit_code == 0, result.output
    assert "I grow tomatoes" in result.stdout
    assert "<recalled-memory" in result.stdout
    result = await herald.invoke("memory", "test", "hello there", "--user", "nobody")
    assert result.exit_code == 2
    assert "no user 'nobody'" in result.output


async def test_doctor_checks_the_provider(herald: Herald, honcho: FakeHoncho) -> None:
    with_honcho(herald, honcho)
    found = verdicts(await herald.invoke("doctor"))
    assert found["memory"][0] == "OK"
    assert "honcho: answers" in found["memory"][1]

    with_honcho(herald, honcho, key="wrong")
    result = await herald.invoke("doctor")
    assert result.exit_code == 1
    assert verdicts(result)["memory"][0] == "FAIL"


def test_config_refuses_an_unknown_provider_and_mem0_without_a_key() -> None:
    with pytest.raises(ValidationError, match="not installed"):
        HeraldConfig.model_validate({"memory": {"provider": "supermemory"}})
    with pytest.raises(ValidationError, match="api_key"):
        HeraldConfig.model_validate({"memory": {"provider": "mem0"}})
    config = HeraldConfig.model_validate({"memory": {"provider": "honcho"}})
    assert config.memory.recall_timeout == 2.0
    assert config.memory.honcho.workspace == "herald"
    assert config.memory.honcho.recall == "context"


async def test_memory_soul_shows_sets_and_resets_the_persona(
    herald: Herald, tmp_path: Path
) -> None:
    shown = await herald.invoke("memory", "soul")
    assert shown.exit_code == 2, shown.output  # no database yet: says where it looked
    persona = tmp_path / "jeeves.md"
    persona.write_text("You are Jeeves, a butler.\n", encoding="utf-8")

    done = await herald.invoke("memory", "soul", "--set", str(persona))

    assert done.exit_code == 0, done.output
    assert done.stdout == "You are Jeeves, a butler.\n"
    async with Store.open(herald.database_url) as store:
        assert await MemoryFiles(SqlMemoryDocs(store)).soul() == "You are Jeeves, a butler."
    assert (await herald.invoke("memory", "soul")).stdout == "You are Jeeves, a butler.\n"
    reset = await herald.invoke("memory", "soul", "--default")
    assert reset.stdout.startswith("You are Herald")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "missing.md"], "cannot read missing.md"),
        (["--set", "empty.md"], "is empty; use --default"),
        (["--set", "empty.md", "--default"], "not both"),
    ],
)
async def test_memory_soul_refuses_bad_input_and_changes_nothing(
    herald: Herald, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.md").write_text("  \n", encoding="utf-8")
    result = await herald.invoke("memory", "soul", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert not herald.state_dir.exists(), "nothing was created"
