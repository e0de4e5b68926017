"""A test-only platform: a small long-polling chat protocol spoken by `tests/fakes/chat_server.py`.

It exists so that Herald's message path (inbox, busy modes, outbox, delivery, crash safety) can
be exercised end to end, through `herald run`, before and besides the real platform adapters.
"""

from __future__ import annotations

from collections.abc import Callable

from adapters.loopback.config import LoopbackConfig
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import PlatformSpec

PLATFORM = Platform("test")


def _factory(section: LoopbackConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.loopback.adapter import LoopbackAdapter  # noqa: PLC0415

    return lambda: LoopbackAdapter(section)


SPEC = PlatformSpec(
    name=PLATFORM,
    config=LoopbackConfig,
    factory=_factory,
    example="test:123",
    internal=True,
)
"""The test-only loopback platform (`platforms.test`)."""
