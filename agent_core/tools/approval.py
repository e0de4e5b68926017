"""Asking the person for a yes before a tool runs: the protocol the gateway implements."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from agent_core.tools.base import ToolContext


class Verdict(StrEnum):
    """How an approval ended."""

    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One tool call waiting for a yes: the tool as the model knows it, and its arguments."""

    tool: str
    arguments: Mapping[str, Any]
    description: str = ""
    timeout: float = 600.0
    """Seconds to wait; no answer by then means no."""


@dataclass(frozen=True, slots=True)
class ApprovalOutcome:
    """The verdict, and who gave it (`platform:id`, or a note like `api`)."""

    verdict: Verdict
    by: str | None = None
    digest: str | None = None
    """`arguments_digest` of the arguments that were approved: the caller runs the tool only
    with arguments of the same digest."""


def canonical_arguments(arguments: Mapping[str, Any]) -> str:
    """One spelling of a call's arguments (sorted keys, no spaces): what is stored and hashed."""
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def arguments_digest(arguments: Mapping[str, Any] | str) -> str:
    """The SHA-256 of the canonical arguments (or of an already canonical string)."""
    text = arguments if isinstance(arguments, str) else canonical_arguments(arguments)
    return hashlib.sha256(text.encode()).hexdigest()


class Approvals(Protocol):
    """Asks the person of a session to approve a tool call and waits for the answer."""

    async def ask(self, ctx: ToolContext, request: ApprovalRequest) -> ApprovalOutcome:
        """Ask and wait (not blocking other sessions). Raise ToolError when nobody can be
        asked here (an API call, a scheduled job); cancellation withdraws the question."""
        ...
