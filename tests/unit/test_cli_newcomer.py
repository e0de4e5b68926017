"""The `herald` command line as a newcomer meets it: version, help, tables, `--json`."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import insert
from typer.testing import CliRunner

from gateway import __version__
from gateway.cli.main import app
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import AccountId, ChatId, SessionKey
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.instances import Membership
from gateway.store.outbox import Chunk, Outbox, Target
from gateway.store.tables import pairings
from tests.unit.cli_harness import Herald
from tests.unit.test_cli import add_exchange

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_environment")]


def run_plain(*args: str) -> str:
    """`herald <args>` without a config file; its output (exit code 0 asserted)."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    assert run_plain(flag) == f"herald {__version__}\n"


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["--help"], id="herald"),
        pytest.param(["sessions", "show", "--help"], id="sessions-show"),
        pytest.param(["jobs", "add", "--help"], id="jobs-add"),
        pytest.param(["deliveries", "list", "--help"], id="deliveries-list"),
    ],
)
def test_help_shows_no_type_after_flags_and_no_braces(command: list[str]) -> None:
    text = run_plain(*command)

    assert "<bool>" not in text
    assert "{" not in text
    assert "--help" in text


def test_help_names_arguments_in_capitals() -> None:
    text = run_plain("sessions", "show", "--help")

    assert "Usage: herald sessions show [OPTIONS] KEY" in text


# stored data is never markup ---------------------------------------------------------------------


async def test_sessions_search_prints_markup_in_session_keys_as_text(herald: Herald) -> None:
    key = SessionKey("api:default:[link=https://evil.example]click[/link]")
    async with Store.open(herald.database_url) as store:
        await add_exchange(
            store,
            key,
            ChatMessage(Role.USER, "the lighthouse keeper"),
            ChatMessage(Role.ASSISTANT, "keeps the light"),
        )

    result = await herald.invoke("sessions", "search", "lighthouse")

    assert result.exit_code == 0, result.output
    assert "[link=https://evil.example]click[/link]" in result.stdout


# lists at 80 columns, and as JSON ----------------------------------------------------------------

LONG_KEY = SessionKey("slack:default:C0123ABCDEF:1732612345.123456:u=U0123ABCD")
SHORT_KEY = SessionKey("telegram:default:123456789")


async def narrow(herald: Herald, *args: str) -> str:
    """`herald <args>` on an 80-column terminal; its stdout (exit code 0 asserted)."""
    runner = CliRunner()
    async with asyncio.timeout(60):
        result = await asyncio.to_thread(
            runner.invoke,
            app,
            [*args, "--config", str(herald.path)],
            env={"COLUMNS": "80", "NO_COLOR": "1"},
        )
    assert result.exit_code == 0, result.output
    return result.stdout


async def two_sessions(herald: Herald) -> None:
    async with Store.open(herald.database_url) as store:
        for key in (LONG_KEY, SHORT_KEY):
            await add_exchange(
                store, key, ChatMessage(Role.USER, "hi"), ChatMessage(Role.ASSISTANT, "hello")
            )


def widest(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


async def test_sessions_list_at_80_columns_shows_every_key_whole(herald: Herald) -> None:
    await two_sessions(herald)

    text = await narrow(herald, "sessions", "list")

    lines = [line.strip() for line in text.splitlines()]
    assert LONG_KEY in lines  # on a line of its own: copied with a triple click
    assert SHORT_KEY in lines
    assert "…" not in text


async def test_a_list_that_fits_80_columns_is_a_table(herald: Herald) -> None:
    async with Store.open(herald.database_url) as store:
        await add_exchange(
            store, SHORT_KEY, ChatMessage(Role.USER, "hi"), ChatMessage(Role.ASSISTANT, "hello")
        )

    text = await narrow(herald, "sessions", "list")

    assert text.splitlines()[0].split()[:3] == ["key", "conversation", "messages"]
    assert widest(text) <= 80
    assert SHORT_KEY in text.splitlines()[-2] + text.splitlines()[-1]


async def test_jobs_list_at_80_columns_keeps_the_time_zone_whole(herald: Herald) -> None:
    zone = "America/Argentina/Buenos_Aires"
    added = await herald.invoke(
        "jobs", "add", "--schedule", "0 9 * * 1-5", "--prompt", "summarise", "--tz", zone
    )
    assert added.exit_code == 0, added.output

    text = await narrow(herald, "jobs", "list")

    assert f"({zone})" in text
    assert "…" not in text
    assert widest(text) <= 80


@pytest.mark.parametrize(
    ("command", "field"),
    [
        pytest.param(["sessions", "list"], "key", id="sessions"),
        pytest.param(["deliveries", "list"], "status", id="deliveries"),
        pytest.param(["pairing", "list", "--all"], "code", id="pairing"),
        pytest.param(["users", "list"], "identities", id="users"),
        pytest.param(["instances"], "state", id="instances"),
        pytest.param(["jobs", "list"], "next_run_at", id="jobs"),
        pytest.param(["sessions", "search", "hi"], "snippet", id="search"),
    ],
)
async def test_every_list_speaks_json(herald: Herald, command: list[str], field: str) -> None:
    await two_sessions(herald)
    async with Store.open(herald.database_url) as store:
        await store.resolve_user("telegram", "1")
        await Membership(store, "herald-a", 15.0).register()
        await Outbox(store).enqueue(
            [Chunk("k1", Target("telegram", AccountId("default"), ChatId("1")), "hi")]
        )
        async with store.write() as conn:
            await conn.execute(
                insert(pairings).values(
                    code="ABCDEFGH",
                    platform="telegram",
                    account="default",
                    external_id="9",
                    chat_id="9",
                    display_name="Zed",
                    status="pending",
                    created_at=utcnow(),
                    expires_at=utcnow(),
                )
            )
    added = await herald.invoke("jobs", "add", "--schedule", "every 2h", "--prompt", "ping")
    assert added.exit_code == 0, added.output

    result = await herald.invoke(*command, "--json")

    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows, result.stdout
    assert all(field in row for row in rows)


async def test_jobs_runs_speaks_json(herald: Herald) -> None:
    added = await herald.invoke("jobs", "add", "--schedule", "every 2h", "--prompt", "ping")
    job_id = added.stdout.split()[2]
    assert (await herald.invoke("jobs", "run", job_id)).exit_code == 0

    result = await herald.invoke("jobs", "runs", job_id, "--json")

    assert result.exit_code == 0, result.output
    [run] = json.loads(result.stdout)
    assert (run["trigger"], run["status"], run["delivery_status"]) == ("manual", "queued", None)


@pytest.mark.parametrize("path", ["herald.yaml", "secrets/llm_api_key", "state/herald.db"])
def test_what_setup_writes_in_the_checkout_is_ignored_by_git(path: str) -> None:
    """The quick start runs `herald setup` in the checkout: its files must not reach git."""
    top = Path(__file__).resolve().parents[2]
    ignored = subprocess.run(
        ["git", "check-ignore", "--quiet", "--no-index", path],
        cwd=top,
        check=False,
    )
    assert ignored.returncode == 0, f"{path} is not ignored by .gitignore"
