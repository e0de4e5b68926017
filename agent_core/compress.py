"""Compression: replacing the older part of a long conversation by a structured summary."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent_core.context import estimate_tokens
from agent_core.llm import LLMProvider, Usage
from gateway.contracts.errors import LLMError
from gateway.contracts.history import ChatMessage, History, Role, SessionInfo, TranscriptStore

logger = logging.getLogger(__name__)

MARKER = "[herald:compress]"
KEEP_RECENT = 6
PAGE = 200
MAX_UNLOADED = 2_000
"""Most messages outside the window read for one compression (a bound on its cost)."""
MAX_MESSAGE_CHARS = 4_000
"""Longer messages are cut for the summarizer."""
"""Messages kept verbatim after a compression (at least; the cut lands on a user message)."""

PROMPT = f"""{MARKER} You compress conversations. Write a summary of the conversation below that \
lets the assistant continue it without the full transcript. Use exactly these headings:

## Goal
## Constraints
## Decisions
## Open questions
## Next steps

Under each, short bullet points ("- none" when empty). Keep names, numbers, dates, file names and \
commitments exactly. Merge the earlier summary, if any, into the new one."""


def needs_compression(
    history: History,
    *,
    incoming_chars: int,
    last_usage: Usage | None,
    context_window: int,
    threshold: float,
    window: int,
) -> bool:
    """True when the next context would pass `threshold` of the window, or the window is full.

    Before the model has reported usage the size is estimated as characters / 4; after, the
    last turn's reported prompt and completion tokens stand for the history so far.
    """
    if len(history.messages) <= KEEP_RECENT:
        return False
    if len(history.messages) >= window:
        return True
    if last_usage is not None:
        size = last_usage.prompt_tokens + last_usage.completion_tokens + incoming_chars // 4
    else:
        size = estimate_tokens(history.messages) + len(history.summary or "") // 4
    return size > threshold * context_window


def split_point(messages: Sequence[ChatMessage]) -> int:
    """Index where the kept part starts: a user message, leaving at least KEEP_RECENT."""
    cut = len(messages) - KEEP_RECENT
    while cut > 0 and messages[cut].role is not Role.USER:
        cut -= 1
    return cut


async def compress(
    provider: LLMProvider, store: TranscriptStore, session: SessionInfo, history: History
) -> bool:
    """Summarize the older part of `history` and store it. False when nothing was done.

    A model failure is logged and leaves the history as it was; the turn goes on.
    """
    cut = split_point(history.messages)
    if cut <= 0:
        return False
    older = [*await _unloaded(store, session, history), *history.messages[:cut]]
    upto = older[-1].id
    if upto is None:
        return False
    transcript = "\n".join(
        f"{m.role}: {_excerpt(m.content)}"
        for m in older
        if m.role is Role.USER or (m.role is Role.ASSISTANT and m.content)
    )
    earlier = f"Earlier summary:\n{history.summary}\n\n" if history.summary else ""
    request = [
        ChatMessage(Role.SYSTEM, PROMPT),
        ChatMessage(Role.USER, f"{earlier}Conversation:\n{transcript}"),
    ]
    try:
        completion = await provider.complete(request)
    except LLMError as err:
        logger.warning("compression of session %s failed: %s", session.key, err)
        return False
    summary = completion.content.strip()
    if not summary:
        return False
    await store.save_summary(session.id, upto, summary)
    logger.info("compressed %d messages of session %s", len(older), session.key)
    return True


async def _unloaded(
    store: TranscriptStore, session: SessionInfo, history: History
) -> list[ChatMessage]:
    """The messages after the latest summary that the window did not load, oldest first.

    The new summary covers everything up to its `upto`, so the model must see these too.
    """
    first = history.messages[0].id if history.messages else None
    out: list[ChatMessage] = []
    while first is not None and len(out) < MAX_UNLOADED:
        page = await store.transcript(session.id, limit=PAGE, before=first)
        fresh = [
            m
            for m in page
            if history.summary_upto is None or (m.id is not None and m.id > history.summary_upto)
        ]
        out[:0] = fresh
        if len(fresh) < PAGE:
            break
        first = page[0].id
    return out


def _excerpt(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"
