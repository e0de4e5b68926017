"""`herald pairing list | approve | revoke` and `herald users link`, through Typer's test runner
against a SQLite database under tmp_path.

The runner is invoked in a worker thread (each command runs its own event loop with
`asyncio.run`), as in test_cli.py.
"""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import select

from adapters.telegram import PLATFORM as TELEGRAM
from agent_core.memory import MemoryFiles, MemoryScope, person
from gateway.access import CODE_ALPHABET, CODE_LENGTH, Access, Pairings, Verdict
from gateway.config import AccessConfig
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import AccountId, ChatId, ExternalUserId, PlatformMessageId
from gateway.contracts.messages import InboundMessage, Sender
from gateway.store import Store
from gateway.store.memory_docs import SqlMemoryDocs
from gateway.store.outbox import Outbox
from gateway.store.tables import grants, users
from tests.unit.cli_harness import Herald

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_environment")]

CODE = re.compile(rf"\b[{CODE_ALPHABET}]{{{CODE_LENGTH}}}\b")
SECTIONS = {("telegram", "bot"): PlatformSection(account="bot")}


def telegram_dm(sender: str, name: str = "") -> InboundMessage:
    return InboundMessage(
        platform=TELEGRAM,
        account=AccountId("bot"),
        chat_id=ChatId(sender),
        sender=Sender(ExternalUserId(sender), name),
        text="let me in",
        platform_message_id=PlatformMessageId(f"m-{sender}"),
        is_direct=True,
    )


async def decide(herald: Herald, sender: str, name: str = "") -> Verdict:
    """What a fresh Access says to a DM from telegram user `sender` (may issue a code)."""
    async with Store.open(herald.database_url) as store:
        access = Access(store, SECTIONS, AccessConfig())
        async with store.write() as conn:
            decision = await access.decide(conn, telegram_dm(sender, name))
    return decision.verdict


async def request_code(herald: Herald, sender: str = "123", name: str = "Alice") -> str:
    """A pending pairing code for telegram user `sender`, issued the way the daemon does."""
    assert await decide(herald, sender, name) is Verdict.PAIR
    async with Store.open(herald.database_url) as store:
        (pairing,) = [p for p in await Pairings(store).list() if p.external_id == sender]
    return pairing.code


# pairing list ------------------------------------------------------------------------------------


async def test_pairing_list_without_requests_says_so(herald: Herald) -> None:
    await herald.create_database()
    result = await herald.invoke("pairing", "list")

    assert result.exit_code == 0, result.output
    assert result.stdout == "no pending pairing requests\n"


async def test_pairing_list_shows_a_pending_code(herald: Herald) -> None:
    code = await request_code(herald, "123", "Alice")

    result = await herald.invoke("pairing", "list")

    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if code in line]
    cells = re.split(r"\s{2,}", row.strip())
    # The account the code was asked on: approving it lets the sender talk to that bot.
    assert cells[:6] == [code, "telegram", "bot", "123", "Alice", "pending"]
    listed = await herald.invoke("pairing", "list", "--json")
    assert [(p["code"], p["account"]) for p in json.loads(listed.stdout)] == [(code, "bot")]


async def test_pairing_list_hides_decided_codes_unless_all(herald: Herald) -> None:
    code = await request_code(herald)
    assert (await herald.invoke("pairing", "approve", code)).exit_code == 0

    pending = await herald.invoke("pairing", "list")
    everything = await herald.invoke("pairing", "list", "--all")

    assert pending.stdout == "no pending pairing requests\n"
    assert everything.exit_code == 0, everything.output
    (row,) = [line for line in everything.stdout.splitlines() if code in line]
    assert "approved" in row


# pairing approve ---------------------------------------------------------------------------------


async def test_pairing_approve_grants_access_and_tells_the_sender(herald: Herald) -> None:
    code = await request_code(herald, "123", "Alice")

    result = await herald.invoke("pairing", "approve", code)

    assert result.exit_code == 0, result.output
    assert result.stdout == "approved telegram:123 (Alice)\n"
    assert await decide(herald, "123") is Verdict.ALLOW
    async with Store.open(herald.database_url) as store:
        (notice,) = await Outbox(store).list()
        (pairing,) = await Pairings(store).list(all_=True)
    assert "you now have access" in notice.text.lower()
    assert notice.idempotency_key == f"paired:{pairing.id}"
    assert (notice.target.platform, notice.target.account, notice.target.chat_id) == (
        "telegram",
        "bot",
        "123",
    )
    assert notice.status == "pending"


async def test_pairing_approve_accepts_a_lowercase_code(herald: Herald) -> None:
    code = await request_code(herald)

    result = await herald.invoke("pairing", "approve", code.lower())

    assert result.exit_code == 0, result.output
    assert await decide(herald, "123") is Verdict.ALLOW


async def test_pairing_approve_of_an_unknown_code_exits_1(herald: Herald) -> None:
    await herald.create_database()
    result = await herald.invoke("pairing", "approve", "NOPE2345")

    assert result.exit_code == 1
    assert "no pending pairing code 'NOPE2345'" in result.stderr
    assert result.stdout == ""


async def test_pairing_approve_twice_exits_1_and_sends_one_notice(herald: Herald) -> None:
    code = await request_code(herald)
    assert (await herald.invoke("pairing", "approve", code)).exit_code == 0

    again = await herald.invoke("pairing", "approve", code)

    assert again.exit_code == 1
    assert "no pending pairing code" in again.stderr
    async with Store.open(herald.database_url) as store:
        assert len(await Outbox(store).list()) == 1


# pairing revoke ----------------------------------------------------------------------------------


async def test_pairing_revoke_by_platform_and_user_id(herald: Herald) -> None:
    code = await request_code(herald, "123")
    assert (await herald.invoke("pairing", "approve", code)).exit_code == 0

    result = await herald.invoke("pairing", "revoke", "telegram:123")

    assert result.exit_code == 0, result.output
    assert result.stdout == "revoked telegram:123\n"
    async with Store.open(herald.database_url) as store, store.read() as conn:
        assert (await conn.execute(select(grants))).all() == []
    assert await decide(herald, "123") is not Verdict.ALLOW


async def test_pairing_revoke_by_code(herald: Herald) -> None:
    code = await request_code(herald, "123")
    assert (await herald.invoke("pairing", "approve", code)).exit_code == 0

    result = await herald.invoke("pairing", "revoke", code)

    assert result.exit_code == 0, result.output
    assert await decide(herald, "123") is not Verdict.ALLOW


@pytest.mark.parametrize("who", ["telegram:999", "NOPE2345"])
async def test_pairing_revoke_of_nothing_exits_1(herald: Herald, who: str) -> None:
    await herald.create_database()
    result = await herald.invoke("pairing", "revoke", who)

    assert result.exit_code == 1
    assert "error:" in result.stderr
    assert result.stdout == ""


# users link --------------------------------------------------------------------------------------


async def test_users_link_prints_the_linked_identities(herald: Herald) -> None:
    result = await herald.invoke("users", "link", "telegram:1", "email:a@x")

    assert result.exit_code == 0, result.output
    match = re.fullmatch(r"user (\S+): telegram:1, email:a@x\n", result.stdout)
    assert match is not None, result.stdout
    async with Store.open(herald.database_url) as store:
        assert await store.resolve_user("email", "a@x") == match[1]
        assert await store.resolve_user("telegram", "1") == match[1]


async def test_users_link_merges_two_users_and_their_memory(herald: Herald) -> None:
    async with Store.open(herald.database_url) as store:
        kept = await store.resolve_user("telegram", "1")
        merged = await store.resolve_user("email", "a@x")
    async with Store.open(herald.database_url) as store:
        memory = MemoryFiles(SqlMemoryDocs(store))
        await memory.add(MemoryScope.USER, person(kept), "Name: Alice")
        await memory.add(MemoryScope.USER, person(merged), "Name: Alice")
        await memory.add(MemoryScope.USER, person(merged), "Prefers tea")

    result = await herald.invoke("users", "link", "TELEGRAM:1", "email:a@x")

    assert result.exit_code == 0, result.output
    assert result.stdout == f"user {kept}: telegram:1, email:a@x\n"
    async with Store.open(herald.database_url) as store:
        memory = MemoryFiles(SqlMemoryDocs(store))
        assert await memory.read(MemoryScope.USER, person(kept)) == "- Name: Alice\n- Prefers tea\n"
        assert await memory.read(MemoryScope.USER, person(merged)) == ""
        assert await SqlMemoryDocs(store).owners() == [person(kept)]
    async with Store.open(herald.database_url) as store, store.read() as conn:
        assert set((await conn.execute(select(users.c.id))).scalars()) == {kept}


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("foo", "bar"), id="no-colons"),
        pytest.param(("telegram:1", "email:"), id="empty-id"),
        pytest.param((":1", "email:a@x"), id="empty-platform"),
    ],
)
async def test_users_link_with_bad_identities_is_a_usage_error(
    herald: Herald, args: tuple[str, str]
) -> None:
    result = await herald.invoke("users", "link", *args)

    assert result.exit_code == 2
    assert "is not platform:id" in result.output
    assert not (herald.state_dir / "herald.db").exists()  # refused before touching the db


async def test_users_link_with_a_missing_argument_is_a_usage_error(herald: Herald) -> None:
    result = await herald.invoke("users", "link", "telegram:1")

    assert result.exit_code == 2
    assert "Missing argument" in result.output


async def test_users_link_refuses_an_unknown_platform(herald: Herald) -> None:
    result = await herald.invoke("users", "link", "telgram:1", "email:a@x")

    assert result.exit_code == 2
    assert "unknown platform 'telgram'; did you mean telegram?" in result.output
    assert not (herald.state_dir / "herald.db").exists()


async def test_users_list_shows_each_user_with_its_identities(herald: Herald) -> None:
    linked = await herald.invoke("users", "link", "telegram:1", "email:a@x")
    assert linked.exit_code == 0, linked.output
    async with Store.open(herald.database_url) as store:
        kept = await store.resolve_user("telegram", "1")
        alone = await store.resolve_user("discord", "77", "Bob")

    table = await herald.invoke("users", "list")
    as_json = await herald.invoke("users", "list", "--json")

    assert table.exit_code == 0, table.output
    [row] = [line for line in table.stdout.splitlines() if kept in line]
    assert "telegram:1, email:a@x" in row
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == [
        {"id": kept, "name": "", "identities": ["telegram:1", "email:a@x"]},
        {"id": alone, "name": "Bob", "identities": ["discord:77"]},
    ]


async def test_users_unlink_detaches_one_identity(herald: Herald) -> None:
    await herald.invoke("users", "link", "telegram:1", "email:a@x")
    async with Store.open(herald.database_url) as store:
        kept = await store.resolve_user("telegram", "1")

    result = await herald.invoke("users", "unlink", "email:a@x")

    assert result.exit_code == 0, result.output
    assert f"unlinked email:a@x from user {kept} (still telegram:1)" in result.stdout
    async with Store.open(herald.database_url) as store:
        assert await store.identities_of(kept) == [("telegram", "1")]
        assert await store.resolve_user("email", "a@x") != kept
    again = await herald.invoke("users", "unlink", "telegram:1")
    assert again.exit_code == 1
    assert "the only identity of user" in again.output


# pairing reject ----------------------------------------------------------------------------------


async def test_pairing_reject_refuses_the_code(herald: Herald) -> None:
    code = await request_code(herald, "123", "Alice")

    result = await herald.invoke("pairing", "reject", code.lower())

    assert result.exit_code == 0, result.output
    assert result.stdout == f"rejected telegram:123 ({code})\n"
    assert await decide(herald, "123") is not Verdict.ALLOW
    again = await herald.invoke("pairing", "approve", code)
    assert again.exit_code == 1
    assert f"no pending pairing code {code!r}" in again.stderr
