"""`memory.provider` names a built-in provider or a third party's entry point."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from agent_core.memory_providers import MemoryProvider, SyncedTurn
from agent_core.memory_providers.config import HonchoConfig, Mem0Config
from agent_core.memory_providers.honcho import HonchoProvider
from agent_core.memory_providers.registry import ENTRY_POINT_GROUP, available, build
from gateway.contracts.ids import UserId


class ThirdParty(MemoryProvider):
    name = "third"

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)

    async def prefetch(self, person: UserId, query: str, *, session_key: str) -> str:
        return ""

    async def sync_turn(self, turn: SyncedTurn) -> None:
        return None


def third_party(options: Mapping[str, Any], state_dir: Path) -> MemoryProvider:
    return ThirdParty(options)


def not_a_provider(options: Mapping[str, Any], state_dir: Path) -> object:
    return object()


POINTS = [
    EntryPoint("third", f"{__name__}:third_party", ENTRY_POINT_GROUP),
    EntryPoint("broken", f"{__name__}:not_a_provider", ENTRY_POINT_GROUP),
]


def _build(name: str, **options: Any) -> MemoryProvider | None:
    return build(
        name,
        honcho=HonchoConfig(),
        mem0=Mem0Config(),
        options=options,
        state_dir=Path("/nonexistent"),
        found=POINTS,
    )


def test_built_ins_third_parties_and_none() -> None:
    assert available(POINTS) == ("honcho", "mem0", "broken", "third")
    assert _build("none") is None
    assert isinstance(_build("honcho"), HonchoProvider)
    third = _build("third", endpoint="http://127.0.0.1:9")
    assert isinstance(third, ThirdParty)
    assert third.options == {"endpoint": "http://127.0.0.1:9"}


def test_a_bad_name_or_factory_says_what_to_fix() -> None:
    with pytest.raises(ValueError, match="not installed; choose one of: none, honcho, mem0"):
        _build("supermemory")
    with pytest.raises(ValueError, match="did not return a MemoryProvider"):
        _build("broken")
    with pytest.raises(ValueError, match="api_key"):
        _build("mem0")  # the Mem0 client refuses to start without a key
