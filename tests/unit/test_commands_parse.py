"""parse_command: which chat messages are commands, and the text they carry."""

from __future__ import annotations

import pytest

from gateway.commands import Command, ParsedCommand, parse_command

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("command", list(Command))
def test_every_command_is_recognised_bare(command: Command) -> None:
    assert parse_command(f"/{command}") == ParsedCommand(command, "")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("/stop", ParsedCommand(Command.STOP), id="plain"),
        pytest.param("/stop@herald_bot", ParsedCommand(Command.STOP), id="addressed"),
        pytest.param("/STOP", ParsedCommand(Command.STOP), id="uppercase"),
        pytest.param("/Stop@Herald_Bot", ParsedCommand(Command.STOP), id="mixed-case-addressed"),
        pytest.param("  /stop  ", ParsedCommand(Command.STOP), id="surrounding-blanks"),
        pytest.param("\n/new", ParsedCommand(Command.NEW), id="leading-newline"),
        pytest.param("/reset", ParsedCommand(Command.RESET), id="reset"),
        pytest.param("/mode steer", ParsedCommand(Command.MODE, "steer"), id="arg"),
        pytest.param("/mode   Steer  ", ParsedCommand(Command.MODE, "Steer"), id="arg-case-kept"),
        pytest.param(
            "/queue@herald_bot read this later",
            ParsedCommand(Command.QUEUE, "read this later"),
            id="addressed-with-arg",
        ),
        pytest.param(
            "/STEER mention the budget",
            ParsedCommand(Command.STEER, "mention the budget"),
            id="uppercase-with-arg",
        ),
    ],
)
def test_commands(text: str, expected: ParsedCommand) -> None:
    assert parse_command(text) == expected


@pytest.mark.parametrize(
    ("text", "arg"),
    [
        pytest.param("/queue first line\nsecond line", "first line\nsecond line", id="same-line"),
        pytest.param("/queue\nfirst line\nsecond line", "first line\nsecond line", id="next-line"),
        pytest.param("/queue\nline one two\nline three", "line one two\nline three", id="spaces"),
        pytest.param("/queue@bot\nfirst\n\nthird", "first\n\nthird", id="addressed-blank-line"),
        pytest.param("/queue  a  b \n c ", "a  b \n c", id="inner-spacing-kept"),
    ],
)
def test_multi_line_args_are_kept_verbatim(text: str, arg: str) -> None:
    assert parse_command(text) == ParsedCommand(Command.QUEUE, arg)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("stop", id="no-slash"),
        pytest.param("hello /stop", id="slash-later"),
        pytest.param("please\n/stop", id="slash-on-second-line"),
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("/", id="slash-only"),
        pytest.param("/ stop", id="space-after-slash"),
        pytest.param("/@herald_bot", id="only-bot-name"),
        pytest.param("/stopp", id="typo"),
        pytest.param("/stopnow", id="glued"),
        pytest.param("/quit", id="unknown"),
        pytest.param("/start", id="telegram-start"),
        pytest.param("/unknown with args", id="unknown-with-args"),
        pytest.param("//stop", id="double-slash"),
        pytest.param("/home/user/notes.txt is missing", id="a-path"),
    ],
)
def test_ordinary_text_and_unknown_commands_are_not_commands(text: str) -> None:
    assert parse_command(text) is None
