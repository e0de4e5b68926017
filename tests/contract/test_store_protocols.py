"""Each implementation satisfies its protocol in `gateway.store.abc`: mypy checks the
signatures of the assignments below, the tests check that every method is there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.cluster.bus import LocalBus, PgBus
from gateway.cluster.lanes import SoloLanes
from gateway.store import abc, approvals, inbox, instances, jobs, lanes, leases, outbox, pairings
from gateway.store import store as store_module
from gateway.store.store import Store

pytestmark = pytest.mark.timeout(60)


def _members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def _assert_complete(protocol: type, implementation: Any) -> None:
    missing = [n for n in _members(protocol) if not hasattr(implementation, n)]
    assert missing == [], f"{implementation!r} lacks {missing} of {protocol.__name__}"


async def test_the_store_and_the_repository_modules_implement_their_protocols(
    tmp_path: Path,
) -> None:
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}") as store:
        checks: list[tuple[type, Any]] = []
        users: abc.UserRepository = store
        sessions: abc.SessionRepository = store
        transcripts: abc.TranscriptRepository = store
        settings: abc.SettingsReader = store
        checks += [
            (abc.UserRepository, users),
            (abc.SessionRepository, sessions),
            (abc.TranscriptRepository, transcripts),
            (abc.SettingsReader, settings),
        ]
        session_writes: abc.SessionWrites = store_module
        turn_records: abc.TurnRecords = store_module
        settings_writes: abc.SettingsWrites = store_module
        inbox_queue: abc.InboxQueue = inbox
        inbox_reader: abc.InboxReader = inbox.Inbox(store)
        outbox_writes: abc.OutboxWrites = outbox
        outbox_repo: abc.OutboxRepository = outbox.Outbox(store)
        job_repo: abc.JobRepository = jobs.JobStore(store)
        run_records: abc.RunRecords = jobs
        pairing_repo: abc.PairingRepository = pairings
        approval_repo: abc.ApprovalRepository = approvals
        membership: abc.MembershipRepository = instances.Membership(store, "a", 10.0)
        lease_repo: abc.LeaseRepository = leases.Leases(store, "a", 10.0)
        solo: abc.Lanes = SoloLanes()
        sql: abc.Lanes = lanes.SqlLanes(store, "a", 10.0)
        local: abc.SignalBus = LocalBus("a")
        pg: abc.SignalBus = PgBus("postgresql://nobody@localhost/none", "a")
        checks += [
            (abc.SessionWrites, session_writes),
            (abc.TurnRecords, turn_records),
            (abc.SettingsWrites, settings_writes),
            (abc.InboxQueue, inbox_queue),
            (abc.InboxReader, inbox_reader),
            (abc.OutboxWrites, outbox_writes),
            (abc.OutboxRepository, outbox_repo),
            (abc.JobRepository, job_repo),
            (abc.RunRecords, run_records),
            (abc.PairingRepository, pairing_repo),
            (abc.ApprovalRepository, approval_repo),
            (abc.MembershipRepository, membership),
            (abc.LeaseRepository, lease_repo),
            (abc.Lanes, solo),
            (abc.Lanes, sql),
            (abc.SignalBus, local),
            (abc.SignalBus, pg),
        ]
        for protocol, implementation in checks:
            _assert_complete(protocol, implementation)


def test_the_cluster_reads_are_in_their_modules() -> None:
    for name in abc.ClusterReads.__dict__:
        if not name.startswith("_"):
            assert any(hasattr(m, name) for m in (instances, leases, lanes)), name
