"""The `herald` command line as a newcomer meets it: version, help, tables, `--json`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gateway import __version__
from gateway.cli.main import app
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import SessionKey
from gateway.store import Store
from tests.unit.cli_harness import Herald
from tests.unit.test_cli import add_exchange

pytestmark = pytest.mark.usefixtures("clean_environment")


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
