"""Who reads `/health`'s and `/ready`'s details: the key holder, or without `api.key` a
request made on this machine; anyone else gets the status alone (in-process through httpx's
ASGI transport)."""

from __future__ import annotations

import pytest

from gateway.sessions import SessionManager
from gateway.store import Store
from tests.integration.test_console import KEY, LOCAL, REMOTE, make_rig, manager

pytestmark = pytest.mark.timeout(60)

__all__ = ["manager"]  # the fixture


async def test_details_need_the_key_or_this_machine(store: Store, manager: SessionManager) -> None:
    keyless = make_rig(store, manager, {})
    keyed = make_rig(store, manager, {"api": {"key": KEY}})
    bearer = {"authorization": f"Bearer {KEY}"}
    forwarded = {"x-forwarded-for": "203.0.113.9"}
    cases = [
        (keyless, LOCAL, {}, True),
        (keyless, LOCAL, forwarded, False),  # a proxy's request is not this machine's
        (keyless, REMOTE, {}, False),
        (keyed, LOCAL, {}, False),  # with a key, the key is what counts
        (keyed, REMOTE, bearer, True),
    ]
    for rig, address, headers, detailed in cases:
        async with rig.client(address, headers) as http:
            health = (await http.get("/health")).json()
            ready = (await http.get("/ready")).json()
        assert ("llm" in health) is detailed, (address, headers, health)
        assert ("store" in ready) is detailed, (address, headers, ready)
        assert health["status"] in ("ok", "degraded", "draining")
        assert "ready" in ready
