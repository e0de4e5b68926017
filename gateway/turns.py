"""What a turn's end means: its status, and how a failure is told apart and worded.

Every caller that runs a turn (inbox turns, API turns, stateless answers, cron runs) maps
what the agent raised through `classify`, so a failure has one status, one wording and one
decision (retry later or give up) wherever it happened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from gateway.contracts.errors import LLMError, LLMRejected, LLMUnavailable
from gateway.store.health import connection_lost

logger = logging.getLogger(__name__)


class TurnStatus(StrEnum):
    """How a turn ended (the `turns.status` column)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    TIMED_OUT = "timed_out"


class FailureKind(StrEnum):
    """Why a turn failed; the label of `herald_model_failures` for the model's kinds."""

    UNREACHABLE = "unreachable"
    """The model could not be reached or was overloaded: retry later."""
    REJECTED = "rejected"
    """The model endpoint refused the key or the request: fix the configuration."""
    TIMEOUT = "timeout"
    """The turn ran past `sessions.turn_timeout`."""
    INTERNAL = "internal"
    """A bug or a store error inside the turn."""
    STORE = "store"
    """The database connection was lost or refused mid-turn (a restart, a killed backend):
    retry later."""


@dataclass(frozen=True, slots=True)
class TurnFailure:
    """A failed turn, as the person, the log and the caller see it."""

    kind: FailureKind
    status: TurnStatus
    error: str
    """One line saying what went wrong (no traceback, no secret)."""

    @property
    def transient(self) -> bool:
        """Whether the same turn may succeed if tried again later."""
        return self.kind in (FailureKind.UNREACHABLE, FailureKind.STORE)


def classify(err: BaseException, turn_timeout: float) -> TurnFailure:
    """The failure a turn that raised `err` ended with (never for CancelledError)."""
    if isinstance(err, TimeoutError):
        return TurnFailure(
            FailureKind.TIMEOUT,
            TurnStatus.TIMED_OUT,
            f"the answer took longer than {turn_timeout:g}s",
        )
    if isinstance(err, LLMUnavailable):
        return TurnFailure(FailureKind.UNREACHABLE, TurnStatus.FAILED, str(err))
    if isinstance(err, LLMRejected):
        return TurnFailure(FailureKind.REJECTED, TurnStatus.FAILED, str(err))
    if isinstance(err, LLMError):
        return TurnFailure(FailureKind.UNREACHABLE, TurnStatus.FAILED, str(err))
    if connection_lost(err):
        return TurnFailure(
            FailureKind.STORE,
            TurnStatus.FAILED,
            f"the database connection was lost: {type(err).__name__}",
        )
    return TurnFailure(
        FailureKind.INTERNAL, TurnStatus.FAILED, f"internal error: {type(err).__name__}"
    )


def log_failure(failure: TurnFailure, err: BaseException, what: str) -> None:
    """Log a failed turn once, at the level its kind deserves (a traceback for bugs only)."""
    if failure.kind is FailureKind.INTERNAL:
        logger.error("%s failed: %s", what, failure.error, exc_info=err)
    elif failure.kind is FailureKind.STORE:
        logger.warning("%s: %s; it is tried again", what, failure.error)
    elif failure.kind is FailureKind.UNREACHABLE:
        # The outage itself is logged once when it starts and ends (ModelHealth).
        logger.debug("%s: the model is unreachable: %s", what, failure.error)
    else:
        logger.warning("%s failed: %s", what, failure.error)


async def run_agent(
    work: Callable[[], Awaitable[object]],
    *,
    timeout: float | None,  # noqa: ASYNC109 - the turn's own limit, classified on expiry
    what: str,
    on_failure: Callable[[TurnFailure], None] = lambda _: None,
) -> TurnFailure | None:
    """Run one turn's agent work under the turn timeout: the one place where every turn
    (inbox, API, stateless, scheduled) meets its failure.

    Returns None when the work finished, else its failure, classified and logged once, and
    handed to `on_failure` (a metric). Only cancellation leaves it: whatever else the work
    raises is the turn's outcome, never its caller's problem.
    """
    try:
        async with asyncio.timeout(timeout):
            await work()
    except Exception as err:
        failure = classify(err, timeout or 0.0)
        log_failure(failure, err, what)
        on_failure(failure)
        return failure
    return None
