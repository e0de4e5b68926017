"""What every adapter's inbound path shares: skipped updates, message keys, file references."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gateway.contracts.ids import PlatformMessageId
from gateway.contracts.messages import InboundMessage

RefT = TypeVar("RefT")


@dataclass(frozen=True, slots=True)
class Skipped:
    """An update, event or message that does not reach the agent, and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file of an inbound message to download from its URL."""

    url: str
    mime_type: str
    size: int | None
    filename: str


@dataclass(frozen=True, slots=True)
class Incoming(Generic[RefT]):
    """An inbound message without its attachments, and the files to download for it."""

    message: InboundMessage
    files: tuple[RefT, ...] = ()


def message_key(container: int | str, message: int | str) -> PlatformMessageId:
    """Herald's id of a platform message: `<chat or channel id>:<message id>`."""
    return PlatformMessageId(f"{container}:{message}")


class FileRules(Protocol):
    """The attachment keys of a platform section."""

    @property
    def attachment_types(self) -> tuple[str, ...]: ...
    @property
    def attachment_max_bytes(self) -> int: ...


def file_refusal(name: str, mime: str, size: int | None, rules: FileRules) -> str | None:
    """The note for the agent about a file that is not downloaded (type not allowed, larger
    than the limit), or None when it may be downloaded."""
    if not any(fnmatch.fnmatch(mime, p) for p in rules.attachment_types):
        return f"[file {name} ({mime}) not downloaded: type not allowed]"
    if size is not None and size > rules.attachment_max_bytes:
        return (
            f"[file {name} ({size} bytes) not downloaded: larger than "
            f"{rules.attachment_max_bytes} bytes]"
        )
    return None


def log_skipped(
    logger: logging.Logger, what: str, skipped: Skipped, *, quiet: Collection[str] = ()
) -> None:
    """Log why `what` (`telegram: update 7`) was skipped: at DEBUG for a `quiet` reason
    (routine, like group chatter not addressed to the bot), at INFO otherwise."""
    level = logging.DEBUG if skipped.reason in quiet else logging.INFO
    logger.log(level, "%s skipped: %s", what, skipped.reason)
