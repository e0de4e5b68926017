"""Honcho through the official `honcho-ai` SDK (its async API, `Honcho.aio`).

One Honcho peer per person (the Herald user id) and one for the agent; one Honcho session per
Herald session (`herald-<session id>`, with both peers in it); after each turn its messages are
added to that session; before a turn, the person's context (representation and peer card,
searched by the new message) or the dialectic `chat` answer is recalled. An entry the agent
writes to the person's USER.md is added as the agent peer's conclusion about them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from types import TracebackType
from typing import Any

from honcho import Honcho, MessageCreateParams
from honcho.http.exceptions import APIError, HonchoError, RateLimitError

from agent_core.memory_providers.base import (
    MemoryProvider,
    MemoryRejected,
    MemoryUnavailable,
    Speaker,
    SyncedTurn,
)
from agent_core.memory_providers.config import HonchoConfig
from gateway.contracts.ids import UserId

logger = logging.getLogger(__name__)

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def peer_id(person: UserId) -> str:
    """The Honcho peer id of a person: the user id when Honcho accepts it as is, else a
    readable prefix and a hash (ids are `[A-Za-z0-9_-]`)."""
    if _SAFE_ID.match(person):
        return person
    digest = hashlib.sha256(person.encode()).hexdigest()[:16]
    prefix = re.sub(r"[^A-Za-z0-9_-]", "-", person)[:40]
    return f"{prefix}-{digest}"


def session_id(herald_session: int) -> str:
    """The Honcho session of a Herald session."""
    return f"herald-{herald_session}"


class HonchoProvider(MemoryProvider):
    """Honcho as Herald's external memory."""

    name = "honcho"

    def __init__(self, config: HonchoConfig) -> None:
        self.config = config
        self._client: Any = None
        self._sessions: dict[str, Any] = {}
        """Honcho sessions known to exist with both peers in them (this process)."""
        self._peers: dict[str, Any] = {}
        """Peers known to exist (this process): a recall then costs one request."""

    async def __aenter__(self) -> HonchoProvider:
        key = self.config.api_key
        # No network here: the SDK makes its first request on the first call. Herald retries
        # (the sync queue), so the SDK's own retries would only stretch a turn's recall.
        self._client = Honcho(
            api_key=key.get_secret_value() if key else None,
            base_url=self.config.base_url,
            workspace_id=self.config.workspace,
            timeout=self.config.request_timeout,
            max_retries=0,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        # The SDK has no public close; its HTTP clients do.
        with contextlib.suppress(Exception):
            await client._async_http_client.close()
        with contextlib.suppress(Exception):
            client._http.close()

    @property
    def client(self) -> Any:
        """The SDK client; RuntimeError before `async with`."""
        if self._client is None:
            raise RuntimeError("the Honcho provider is not entered")
        return self._client

    async def prefetch(self, person: UserId, query: str, *, session_key: str) -> str:
        """The person's context (or the dialectic answer) for `query`."""
        with _mapped():
            peer = await self._peer(peer_id(person))
            if self.config.recall == "dialectic":
                answer = await peer.aio.chat(query)
                return str(answer or "").strip()
            context = await peer.aio.context(search_query=query)
        parts: list[str] = []
        if context.peer_card:
            parts.append("\n".join(f"- {line}" for line in context.peer_card))
        if context.representation and context.representation.strip():
            parts.append(context.representation.strip())
        return "\n\n".join(parts)

    async def sync_turn(self, turn: SyncedTurn) -> None:
        """Add the turn's messages to the Honcho session of its Herald session."""
        person = peer_id(turn.person)
        agent = self.config.agent_peer
        with _mapped():
            session = await self._session(turn.session_id, person, agent, turn.session_key)
            if turn.resent and await self._stored(session, turn.sync_id):
                return  # an earlier try got through before Herald could record it
            metadata = {"herald_sync_id": turn.sync_id, "herald_session_key": turn.session_key}
            messages = [
                MessageCreateParams(
                    content=m.content,
                    peer_id=person if m.speaker is Speaker.PERSON else agent,
                    metadata=metadata,
                )
                for m in turn.messages
                if m.content.strip()
            ]
            if messages:
                await session.aio.add_messages(messages)

    async def on_memory_write(self, person: UserId, target: str, action: str, content: str) -> None:
        """An entry written to the person's USER.md becomes the agent's conclusion about
        them (removals and MEMORY.md, the agent's own notes, are not mirrored)."""
        if target != "user" or action == "remove":
            return
        with _mapped():
            agent = await self._peer(self.config.agent_peer)
            await agent.conclusions_of(peer_id(person)).aio.create([{"content": content}])

    async def ping(self) -> None:
        """Get (or create) the agent's peer: the workspace answers and takes the key."""
        with _mapped():
            await self.client.aio.peer(self.config.agent_peer)

    @staticmethod
    async def _stored(session: Any, sync_id: int) -> bool:
        """Whether the session holds the messages of sync `sync_id` already."""
        page = await session.aio.messages(filters={"metadata": {"herald_sync_id": sync_id}})
        return len(page) > 0

    async def _peer(self, pid: str) -> Any:
        peer = self._peers.get(pid)
        if peer is None:
            peer = self._peers[pid] = await self.client.aio.peer(pid)
        return peer

    async def _session(self, herald_session: int, person: str, agent: str, key: str) -> Any:
        sid = session_id(herald_session)
        session = self._sessions.get(sid)
        if session is None:
            session = await self.client.aio.session(
                sid, metadata={"herald_session_key": key}, peers=[person, agent]
            )
            self._sessions[sid] = session
        return session


@contextlib.contextmanager
def _mapped() -> Any:
    """The SDK's errors as the contract's: retry later, or refused."""
    try:
        yield
    except RateLimitError as err:
        raise MemoryUnavailable(f"Honcho is rate-limiting: {err}", err.retry_after) from err
    except APIError as err:
        if err.status >= 500 or err.status in (408, 409):
            raise MemoryUnavailable(f"Honcho failed: {err}") from err
        raise MemoryRejected(f"Honcho refused the request: {err}") from err
    except HonchoError as err:  # timeouts, connection errors
        raise MemoryUnavailable(f"Honcho is unreachable: {err}") from err
    except ValueError as err:  # an answer the SDK could not read (pydantic errors too)
        raise MemoryUnavailable(f"Honcho answered something unexpected: {err}") from err
