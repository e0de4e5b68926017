"""Which provider `memory.provider` names: `none`, the built-in `honcho` and `mem0`, or a
third party's, found through the entry-point group `herald.memory_providers`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from agent_core.memory_providers.base import MemoryProvider
from agent_core.memory_providers.config import HonchoConfig, Mem0Config

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "herald.memory_providers"
BUILT_IN = ("honcho", "mem0")
NONE = "none"


def available(found: Iterable[EntryPoint] | None = None) -> tuple[str, ...]:
    """Every name `memory.provider` accepts (besides `none`)."""
    points = entry_points(group=ENTRY_POINT_GROUP) if found is None else found
    return (*BUILT_IN, *sorted(p.name for p in points if p.name not in BUILT_IN))


def build(
    name: str,
    *,
    honcho: HonchoConfig,
    mem0: Mem0Config,
    options: Mapping[str, Any],
    state_dir: Path,
    found: Iterable[EntryPoint] | None = None,
) -> MemoryProvider | None:
    """The provider `name` names, not entered yet (None for `none`).

    Raises ValueError, saying what to fix, for an unknown name or options a provider refuses.
    """
    if name == NONE:
        return None
    if name == "honcho":
        from agent_core.memory_providers.honcho import HonchoProvider  # noqa: PLC0415 - its SDK

        return HonchoProvider(honcho)
    if name == "mem0":
        from agent_core.memory_providers.mem0 import Mem0Provider  # noqa: PLC0415 - its SDK

        return Mem0Provider(mem0, state_dir)
    points = list(entry_points(group=ENTRY_POINT_GROUP) if found is None else found)
    for point in points:
        if point.name == name:
            factory = point.load()
            provider = factory(options, state_dir)
            if not isinstance(provider, MemoryProvider):
                raise ValueError(
                    f"memory.provider {name!r}: entry point {point.value} did not return a "
                    "MemoryProvider"
                )
            return provider
    choices = ", ".join([NONE, *available(points)])
    raise ValueError(f"memory.provider {name!r} is not installed; choose one of: {choices}")
