"""Chats a tool may reach: the current chat of a session, and targets in the syntax of
scheduled jobs resolved through the platform registry. Shared by `send_message` and any tool
that delivers to a chat (files, pictures)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent_core.tools.base import ToolContext, ToolError
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import AccountId, ChatId, ThreadId
from gateway.cron.targets import (
    HOME_SETTING,
    TargetError,
    parse_target,
    resolve,
    session_chat,
)
from gateway.store import Store
from gateway.store.outbox import Target

HERE = ("here", "this chat", "current")
"""Names of the chat being answered."""


def session_target(key: str, sections: Mapping[tuple[str, str], PlatformSection]) -> Target | None:
    """The chat a session key names (`platform:account:chat[:thread]…`), or None for API,
    CLI and job sessions and for accounts not configured."""
    chat = session_chat(key)
    if chat is None:
        return None
    parts = key.split(":")
    account = parts[1].replace("%3D", "=").replace("%3A", ":").replace("%25", "%")
    try:
        address = parse_target(chat)  # the account is the key's
    except TargetError:
        return None
    if isinstance(address, str) or (address.platform, account) not in sections:
        return None
    thread = None if address.thread is None else ThreadId(address.thread)
    return Target(address.platform, AccountId(account), ChatId(address.chat), thread)


def describe(target: Target) -> str:
    """A target as people write it: `platform:chat[:thread]`."""
    return ":".join(p for p in (target.platform, target.chat_id, target.thread_id) if p)


class Places:
    """Resolves and checks the targets a tool names for the person acting."""

    def __init__(
        self,
        store: Store,
        sections: Mapping[tuple[str, str], PlatformSection],
        *,
        homes: Sequence[str],
        allowed: Sequence[str],
    ) -> None:
        self.store = store
        self.sections = dict(sections)
        self.homes = tuple(homes)
        self.allowed = tuple(allowed)

    def names(self) -> list[str]:
        """What the model may name: this chat, then the configured targets."""
        return ["here", *self.allowed]

    async def resolve(self, target: str, ctx: ToolContext) -> list[Target]:
        """The chats `target` names, if the person of `ctx` may reach them. Raises
        ToolError saying why not (unknown, unresolvable, not allowed)."""
        here = None if ctx.session is None else session_target(ctx.session.key, self.sections)
        wanted = target.strip()
        if wanted.lower() in HERE:
            if here is None:
                raise ToolError("this conversation is not a chat; name a target instead")
            return [here]
        try:
            parse_target(wanted, self.sections)
        except TargetError as err:
            raise ToolError(str(err)) from err
        sethome = await self.store.get_setting(HOME_SETTING)
        found = resolve([wanted], homes=self.homes, sethome=sethome, sections=self.sections)
        if found.problems:
            raise ToolError("; ".join(found.problems))
        if not found.targets:
            raise ToolError(f"{wanted!r} names no chat")
        outside = [t for t in found.targets if t != here]
        if not outside:
            return list(found.targets)
        if not ctx.operator:
            raise ToolError(
                f"you may send only to this chat; {wanted!r} is another chat, and only "
                "Herald's operators may have messages sent elsewhere"
            )
        permitted = resolve(
            self.allowed, homes=self.homes, sethome=sethome, sections=self.sections
        ).targets
        refused = [describe(t) for t in outside if t not in permitted]
        if refused:
            raise ToolError(
                f"{', '.join(refused)} is not among the allowed targets "
                f"(tools.send_message.targets: {', '.join(self.allowed) or 'none'})"
            )
        return list(found.targets)
