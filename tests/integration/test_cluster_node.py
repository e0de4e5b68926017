"""The node's heartbeat on PostgreSQL: leases wanted while a heartbeat round runs."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

import pytest

from gateway.cluster.node import Node
from gateway.config import ClusterConfig
from gateway.contracts.messages import utcnow
from gateway.store import Store

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


async def test_leases_wanted_during_a_heartbeat_round_are_all_taken_without_a_failure(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The node beats from registration, while the supervisor is still naming the leases it
    # wants; here each look at the clock names one more, the third one in the middle of the
    # round that renews or acquires the first two.
    nodes: list[Node] = []
    wanted: list[str] = []

    def now() -> datetime:
        if nodes and len(wanted) < 3:
            wanted.append(f"late-{len(wanted)}")
            nodes[0].lease(wanted[-1])
        return utcnow()

    caplog.set_level(logging.WARNING, logger="gateway.cluster.node")
    config = ClusterConfig(lease_ttl=3.0, heartbeat_interval=0.2)
    async with Store.open(pg_url) as store:
        node = Node(store, "busy", config, pg_url, now=now)
        nodes.append(node)
        async with node:
            async with asyncio.timeout(10):
                while len(wanted) < 3 or node.holds() != sorted(wanted):
                    await asyncio.sleep(0.05)
    assert not [r for r in caplog.records if "heartbeat failed" in r.getMessage()]
