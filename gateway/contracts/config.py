"""Config building blocks shared by the gateway and the adapters' own config sections."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode

from gateway.contracts.messages import InboundMessage


class BusyMode(StrEnum):
    """What happens to a message for a session whose turn is still running."""

    QUEUE = "queue"
    COLLECT = "collect"
    STEER = "steer"
    INTERRUPT = "interrupt"


class VoiceReply(StrEnum):
    """When an answer on a platform is spoken (a voice note, through `speech`)."""

    NEVER = "never"
    WHEN_SPOKEN_TO = "when_spoken_to"
    """Answers to voice notes are spoken; the rest are text."""
    ALWAYS = "always"


class EditRule(StrEnum):
    """What an edit of a message already answered does. (An edit of a message still waiting
    replaces its text; one of the message being answered acts by the busy mode.)"""

    ANSWER = "answer"
    """Answered as a new message, marked as an edit of the earlier one."""
    IGNORE = "ignore"
    """Recorded (outcome `dropped`), not answered."""


def _edit_rule(value: Any) -> Any:
    return EditRule.ANSWER if value == "new" else value  # `new`: the name before 0.19


EditedMessages = Annotated[EditRule, BeforeValidator(_edit_rule)]
"""A platform's `edited_messages` key (`answer` or `ignore`; `new` is read as `answer`)."""


class ReactionRule(StrEnum):
    """What a reaction to one of the bot's messages does (on an approval question, 👍/✅
    approve and 👎/❌ deny unless `ignore`)."""

    NOTE = "note"
    """A short note in that session's history, read with its next turn (no turn of its own)."""
    TURN = "turn"
    """Answered like a message (`[reaction 👍 to: …]`)."""
    IGNORE = "ignore"
    """Nothing, not even on an approval question."""


class GroupSessions(StrEnum):
    """In group chats: one session per chat, or one per person in the chat."""

    CHAT = "chat"
    USER = "user"


def read_secret_files(data: Any) -> Any:
    """Replace every `<key>_file` entry by `<key>` holding the file's contents."""
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    for name in [k for k in out if isinstance(k, str) and k.endswith("_file")]:
        path = out.pop(name)
        key = name.removesuffix("_file")
        if path is None:
            continue
        try:
            out[key] = Path(str(path)).expanduser().read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as err:
            raise ValueError(f"{name}: cannot read {path}: {err.strerror}") from err
    return out


def _id_list(value: Any) -> Any:
    """Ids as people write them: numbers or strings, a list or one, or `a,b` from the env."""
    if isinstance(value, bool):
        return value  # refused by the str check, not read as 1 / 0
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, int | str):
        value = [value] if isinstance(value, int) else value.split(",")
        return tuple(str(v).strip() for v in value if str(v).strip())
    if isinstance(value, list | tuple):
        return tuple(str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value)
    return value


IdList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_id_list)]
"""Platform ids (users, roles, channels, chats): numbers are stored as strings; one id or a
comma-separated list is accepted where a list goes (`HERALD_…__ALLOWED_USERS=111,222`)."""


def not_empty(value: SecretStr | None) -> SecretStr | None:
    """A config validator: a secret that is set must not be blank."""
    if value is not None and not value.get_secret_value().strip():
        raise ValueError("must not be empty; leave the key out instead")
    return value


def http_url(value: str | None) -> str | None:
    """A config validator: an endpoint URL must be absolute `http(s)://host…`, so that a
    missing scheme is found by `herald config check`, not by the first request."""
    if value is None:
        return value
    parts = urlsplit(value)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() for c in value)
    ):
        raise ValueError(
            f"{value!r} is not an http(s) URL: write it with its scheme, e.g. "
            f"'http://{value.split('://')[-1]}'"
        )
    return value


class Section(BaseModel):
    """A frozen config section that rejects unknown keys and reads `<key>_file` secrets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _secret_files(cls, data: Any) -> Any:
        return read_secret_files(data)


class VoiceSection(Section):
    """A platform's voice replies (the endpoint is the top-level `speech` section)."""

    reply: VoiceReply = VoiceReply.WHEN_SPOKEN_TO

    @model_validator(mode="before")
    @classmethod
    def _a_section(cls, data: Any) -> Any:
        if isinstance(data, str | bool):  # `voice: always`, `voice: true`
            raise ValueError(
                f"a section, not {data!r}: write `voice: {{reply: always}}` (never, "
                "when_spoken_to or always)"
            )
        return data


ACCOUNT_FORBIDDEN = frozenset(":/\\?#%")
"""What an account's name may not hold (besides blanks): the separator of session keys
and targets, and what would make it more or less than one path segment."""


class PlatformSection(Section):
    """What every platform's config section has: access rules and session rules.

    Access is denied by default: only `allowed_users` (platform user ids, or `*` for anyone)
    and senders the operator approved with `herald pairing approve` may talk to the agent.
    """

    enabled: bool = True
    account: str = Field(default="default", min_length=1, max_length=128)
    """Names this account in session keys (`platform:account:chat`), in its files' directory
    (`files/<platform>/<account>/`) and its webhook path (`/webhooks/<platform>:<account>`):
    one path segment, no `:` nor blanks."""
    allowed_users: IdList = ()
    pairing: bool = True
    """Unknown senders in direct messages get a pairing code for the operator to approve."""
    busy_mode: BusyMode | None = None
    """Default busy mode of this platform's sessions; `sessions.busy_mode` when unset."""
    group_sessions: GroupSessions = GroupSessions.CHAT
    voice: VoiceSection = VoiceSection()
    """When answers are spoken: `voice.reply` is never, when_spoken_to (default) or always."""

    @field_validator("account")
    @classmethod
    def _account_name(cls, value: str) -> str:
        bad = sorted({c for c in value if c in ACCOUNT_FORBIDDEN or c.isspace()})
        if bad or value in (".", ".."):
            shown = ", ".join(repr(c) for c in bad) if bad else repr(value)
            raise ValueError(
                f"{value!r} cannot name an account ({shown}): it is a directory and a URL path "
                "segment; use letters, digits, '-', '_' or '.'"
            )
        return value

    @property
    def singleton(self) -> bool:
        """Whether only one instance at a time may receive for this account (a poller, a
        gateway connection); it then runs under a lease. Webhook receivers run everywhere."""
        return False

    @property
    def verified_senders(self) -> bool:
        """Whether a sender's id on this platform is vouched for by the platform (a chat
        account), not merely claimed by the sender (an unauthenticated mail's `From`). Only a
        vouched-for id may carry operator rights."""
        return True

    @property
    def identity(self) -> tuple[str, str] | None:
        """The credential that names the bot this section logs in as, `(key, value)`: two
        accounts of a platform with the same one would be one bot twice (a config error).
        By default its `token`, `bot_token` or `access_token`; None when it has none."""
        for key in ("token", "bot_token", "access_token"):
            value = getattr(self, key, None)
            if isinstance(value, SecretStr):
                return key, value.get_secret_value()
        return None

    def admits(self, message: InboundMessage) -> bool:
        """Whether the section's own rules let this sender in: listed in `allowed_users` by
        id, or a platform's rule on top (mail domains, server roles)."""
        return str(message.sender.id) in self.allowed_users

    def refusal(self, message: InboundMessage) -> str | None:
        """Why `message` is ignored whatever the allowlists say (loop protection), or None."""
        return None
