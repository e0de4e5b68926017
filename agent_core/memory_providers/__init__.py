"""External memory providers: the contract (`base`), recall around a turn (`recall`), the
built-in Honcho and Mem0 providers, and the registry that picks one from config."""

from agent_core.memory_providers.base import (
    MemoryProvider,
    MemoryProviderError,
    MemoryRejected,
    MemoryUnavailable,
    ProviderFactory,
    Speaker,
    SyncedMessage,
    SyncedTurn,
)
from agent_core.memory_providers.recall import MemoryHealth, MemoryRecall, MemoryState

__all__ = [
    "MemoryHealth",
    "MemoryProvider",
    "MemoryProviderError",
    "MemoryRecall",
    "MemoryRejected",
    "MemoryState",
    "MemoryUnavailable",
    "ProviderFactory",
    "Speaker",
    "SyncedMessage",
    "SyncedTurn",
]
