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


class Surface(StrEnum):
    """Where a command is typed."""

    CHAT = "chat"
    """A platform chat (Telegram, Slack, Discord, email, SMS, WhatsApp)."""
    API = "api"
    """A named session of the HTTP API, and `herald chat` (which talks through it)."""


EVERYWHERE = frozenset(Surface)
CHAT_ONLY = frozenset({Surface.CHAT})


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One row of the command table: how it is written, what it does, where it applies."""

    usage: str
    summary: str
    surfaces: frozenset[Surface]
    elsewhere: str = ""
    """Why it does not apply on the other surfaces, and what to do there instead."""


_NO_QUEUE = "over the API each request waits for its answer (close the request to stop it)"
TABLE: dict[Command, CommandSpec] = {
    Command.STOP: CommandSpec(
        "/stop", "stop the current answer and clear the queue", CHAT_ONLY, _NO_QUEUE
    ),
    Command.NEW: CommandSpec("/new or /reset", "start a fresh conversation", EVERYWHERE),
    Command.QUEUE: CommandSpec(
        "/queue TEXT", "answer TEXT after the current answer", CHAT_ONLY, _NO_QUEUE
    ),
    Command.STEER: CommandSpec(
        "/steer TEXT", "add TEXT to the answer being written", CHAT_ONLY, _NO_QUEUE
    ),
    Command.INTERRUPT: CommandSpec(
        "/interrupt TEXT",
        "stop the current answer and answer TEXT instead",
        CHAT_ONLY,
        _NO_QUEUE,
    ),
    Command.MODE: CommandSpec(
        f"/mode [{'|'.join(BusyMode)}]",
        "what happens to messages sent while I'm busy",
        CHAT_ONLY,
        _NO_QUEUE,
    ),
    Command.STATUS: CommandSpec("/status", "what I'm doing and what is waiting", EVERYWHERE),
    Command.SETHOME: CommandSpec(
        "/sethome",
        "send scheduled reports to this chat (operators)",
        CHAT_ONLY,
        "scheduled reports go to a chat; choose one with `herald setup --home PLATFORM:CHAT`",
    ),
    Command.CRON: CommandSpec("/cron", "the scheduled jobs of this chat and yours", EVERYWHERE),
    Command.APPROVE: CommandSpec(
        "/approve [N] or /deny [N]",
        "answer a tool's request for approval",
        CHAT_ONLY,
        "an API session never waits for an approval (a tool that needs one does not run there "
        "unless api.allow_approval_tools is set)",
    ),
    Command.SKILLS: CommandSpec(
        "/skills", "the skills I can follow; /SKILL-NAME TEXT runs one", EVERYWHERE
    ),
    Command.HELP: CommandSpec("/help", "this list", EVERYWHERE),
}
"""Every command, once, for every surface: help texts and "not here" answers come from it."""
TABLE[Command.RESET] = TABLE[Command.NEW]
TABLE[Command.DENY] = TABLE[Command.APPROVE]

_SURFACE_NAMES = {
    Surface.CHAT: "in a platform chat",
    Surface.API: "over the API and in `herald chat`",
}
_NOT_NAMES = {
    Surface.CHAT: "in a platform chat",
    Surface.API: "over the API or in `herald chat`",
}


def applies(command: Command, surface: Surface) -> bool:
    """Whether `command` acts on `surface`."""
    return surface in TABLE[command].surfaces


def not_here(command: Command, surface: Surface) -> str:
    """The answer to a command typed where it does not apply: where it does, and why not here."""
    spec = TABLE[command]
    where = " and ".join(_SURFACE_NAMES[s] for s in Surface if s in spec.surfaces)
    because = f": {spec.elsewhere}" if spec.elsewhere else ""
    return f"/{command} works {where}, not {_NOT_NAMES[surface]}{because}. /help lists what does."


def help_text(surface: Surface) -> str:
    """The command list for `surface`, then the commands that act elsewhere."""
    seen: list[CommandSpec] = []
    for spec in TABLE.values():
        if spec not in seen:
            seen.append(spec)
    here = [f"{s.usage} — {s.summary}" for s in seen if surface in s.surfaces]
    other = [s.usage.split(" ")[0] for s in seen if surface not in s.surfaces]
    lines = ["Commands:", *here]
    if other:
        elsewhere = " and ".join(_SURFACE_NAMES[s] for s in Surface if s is not surface)
        lines.append(f"({', '.join(other)} work only {elsewhere}.)")
    return "\n".join(lines)


HELP_TEXT = help_text(Surface.CHAT)
"""The command list of a platform chat."""
API_HELP_TEXT = help_text(Surface.API)
"""The command list of an API session and `herald chat`."""


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
