"""Chat commands: they bypass the session's queue and act at once."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent_core.skills.invoke import menu as skills_menu
from agent_core.skills.service import Skills
from gateway.contracts.config import BusyMode


class Command(StrEnum):
    """The commands a chat user can send."""

    STOP = "stop"
    NEW = "new"
    RESET = "reset"
    QUEUE = "queue"
    STEER = "steer"
    INTERRUPT = "interrupt"
    MODE = "mode"
    STATUS = "status"
    SETHOME = "sethome"
    CRON = "cron"
    APPROVE = "approve"
    DENY = "deny"
    SKILLS = "skills"
    HELP = "help"


WITH_TEXT = frozenset({Command.QUEUE, Command.STEER, Command.INTERRUPT})
"""Commands that carry a message: it is queued, steered or interrupts, whatever the mode."""

HELP_TEXT = f"""Commands:
/stop — stop the current answer and clear the queue
/new or /reset — start a fresh conversation
/queue TEXT — answer TEXT after the current answer
/steer TEXT — add TEXT to the answer being written
/interrupt TEXT — stop the current answer and answer TEXT instead
/mode [{"|".join(BusyMode)}] — what happens to messages sent while I'm busy
/status — what I'm doing and what is waiting
/sethome — send scheduled reports to this chat (operators)
/cron — the scheduled jobs of this chat and yours
/approve [N] or /deny [N] — answer a tool's request for approval
/skills — the skills I can follow; /SKILL-NAME TEXT runs one
/help — this list"""


@dataclass(frozen=True, slots=True)
class ParsedCommand:
    """A command and the text after it ("" when none)."""

    command: Command
    arg: str = ""


def parse_command(text: str) -> ParsedCommand | None:
    """The command a message starts with, or None for ordinary text and unknown commands.

    Accepts `/cmd@botname` (how some platforms address commands to one bot in groups).
    """
    stripped = text.lstrip()
    if not stripped.startswith("/"):
        return None
    head, _, rest = stripped[1:].partition(" ")
    head, _, rest_nl = head.partition("\n")
    name = head.split("@", 1)[0].lower()
    try:
        command = Command(name)
    except ValueError:
        return None
    arg = (rest_nl + (" " + rest if rest else "")).strip() if rest_nl else rest.strip()
    return ParsedCommand(command, arg)


MENU = (
    ("new", "start a fresh conversation"),
    ("stop", "stop the current answer and clear the queue"),
    ("status", "what I'm doing and what is waiting"),
    ("skills", "the skills I can follow"),
    ("cron", "the scheduled jobs of this chat and yours"),
    ("help", "all commands"),
)
"""The built-in commands a platform's command menu shows."""


def chat_menu(skills: Skills | None) -> list[tuple[str, str]]:
    """A command menu: the built-in commands, then the shared skills (`/daily_briefing`
    runs the skill `daily-briefing`). Personal skills are never in a menu, which every
    person talking to the bot sees."""
    entries = list(MENU)
    taken = {name for name, _ in entries} | {str(c) for c in Command}
    if skills is not None:
        entries.extend((n, d) for n, d in skills_menu(skills) if n not in taken)
    return entries[:100]
