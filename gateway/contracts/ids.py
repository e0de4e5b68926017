"""Identifier types: distinct NewTypes so a chat id and a user id cannot be swapped."""

from __future__ import annotations

from enum import StrEnum
from typing import NewType

AccountId = NewType("AccountId", str)
"""One configured account of a platform (a bot, a mailbox, a phone number)."""
ChatId = NewType("ChatId", str)
"""A conversation on a platform: a DM, a group, a channel, a mail thread."""
ThreadId = NewType("ThreadId", str)
"""A thread or forum topic inside a chat."""
ExternalUserId = NewType("ExternalUserId", str)
"""A person's id as the platform knows it."""
UserId = NewType("UserId", str)
"""Herald's own id for a person; several platform identities may link to one."""
PlatformMessageId = NewType("PlatformMessageId", str)
"""A message's id as the platform knows it; the inbox deduplicates on it."""
SessionKey = NewType("SessionKey", str)
"""`platform:account:chat[:thread]`; names one conversation with the agent."""
SessionId = NewType("SessionId", int)
TurnId = NewType("TurnId", int)
MessageId = NewType("MessageId", int)
InboxId = NewType("InboxId", int)


Platform = NewType("Platform", str)
"""A platform's name: a registered platform's (`gateway/platforms.py`) or an `Origin`."""


class Origin(StrEnum):
    """Where a turn comes from when no platform adapter brought it."""

    API = "api"
    CLI = "cli"
    CRON = "cron"
    TRIGGER = "trigger"


API_ACCOUNT = AccountId("default")
"""The account of every HTTP API session (`api:default:<name>`)."""


def session_key(
    platform: Platform | str,
    account: AccountId | str,
    chat: ChatId | str,
    thread: ThreadId | str | None = None,
) -> SessionKey:
    """Build the session key `platform:account:chat[:thread]`."""
    parts = [str(platform), str(account), str(chat)]
    if thread:
        parts.append(str(thread))
    return SessionKey(":".join(parts))
