"""Mem0 through the official `mem0ai` client (`mem0.AsyncMemoryClient`), against the hosted
platform or a self-hosted Mem0 server.

After each turn its messages are added with the person's id (`user_id`, the Herald user id);
before a turn, the person's memories are searched with the new message and `user_id` as the
filter, so one person's memories never reach another's turn. An entry the agent writes to the
person's USER.md is added as their memory verbatim.

The SDK is made to stay local: its telemetry is switched off (`MEM0_TELEMETRY=false`, the
documented switch, read when it is imported) and its config folder is kept under Herald's
state directory (`MEM0_DIR`). Its client checks the key with a blocking request when it is
built; Herald builds it in a thread on first use, after a ping of its own that has a timeout.
The SDK itself is imported in a thread while Herald starts (it takes seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from agent_core.memory_providers.base import (
    MemoryProvider,
    MemoryRejected,
    MemoryUnavailable,
    Speaker,
    SyncedTurn,
)
from agent_core.memory_providers.config import Mem0Config
from gateway.contracts.ids import UserId

logger = logging.getLogger(__name__)


def import_client(state_dir: Path) -> Any:
    """`mem0.AsyncMemoryClient`, imported without telemetry and without touching `~/.mem0`.

    The environment is only defaulted: an operator's own `MEM0_TELEMETRY` / `MEM0_DIR` win.
    """
    os.environ.setdefault("MEM0_TELEMETRY", "false")
    os.environ.setdefault("MEM0_DIR", str(state_dir / "mem0"))
    # mem0 resets the process's DeprecationWarning filter when imported; keep ours.
    with warnings.catch_warnings():
        from mem0 import AsyncMemoryClient  # noqa: PLC0415 - after the environment is set
    # It logs every failed request at ERROR; Herald logs an outage once (MemoryHealth).
    logging.getLogger("mem0.client.utils").setLevel(logging.CRITICAL)
    return AsyncMemoryClient


class Mem0Provider(MemoryProvider):
    """Mem0 as Herald's external memory."""

    name = "mem0"

    def __init__(self, config: Mem0Config, state_dir: Path) -> None:
        if config.api_key is None:
            raise ValueError(
                "memory.mem0.api_key (or api_key_file) is required: the Mem0 client refuses "
                "to start without a key"
            )
        self.config = config
        self.state_dir = state_dir
        self._key = config.api_key.get_secret_value()
        self._client: Any = None
        self._sdk_class: asyncio.Future[Any] | None = None
        self._building = asyncio.Lock()
        self._pending: asyncio.Future[Any] | None = None
        self._http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Mem0Provider:
        # Importing mem0 takes seconds (it imports its vector stores): in a thread, while
        # Herald starts; the first recall or sync waits for it.
        loop = asyncio.get_running_loop()
        self._sdk_class = loop.run_in_executor(None, import_client, self.state_dir)
        self._http = httpx.AsyncClient(
            base_url=self.config.base_url,
            timeout=self.config.request_timeout,
            trust_env=False,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, self._client = self._client, None
        http, self._http = self._http, None
        pending, self._pending = self._pending, None
        imported = self._sdk_class
        if imported is not None and imported.done() and not imported.cancelled():
            imported.exception()  # retrieved, so a failed import is not reported at exit
        if client is None and pending is not None and pending.done() and not pending.cancelled():
            client = None if pending.exception() else pending.result()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.async_client.aclose()
        if http is not None:
            await http.aclose()

    async def ping(self) -> None:
        """`GET /v1/ping/` with the key, the request the SDK makes when it starts."""
        if self._http is None:
            raise RuntimeError("the Mem0 provider is not entered")
        try:
            response = await self._http.get(
                "/v1/ping/", headers={"Authorization": f"Token {self._key}"}
            )
        except httpx.HTTPError as err:
            raise MemoryUnavailable(f"Mem0 is unreachable: {err!r}") from err
        _check(response)

    async def prefetch(self, person: UserId, query: str, *, session_key: str) -> str:
        """The person's memories that match `query`, one per line."""
        client = await self._sdk()
        with _mapped():
            found = await client.search(query, filters={"user_id": person}, top_k=self.config.top_k)
        items = found.get("results", []) if isinstance(found, dict) else found
        lines = []
        for item in items or ():
            text = item.get("memory") if isinstance(item, dict) else None
            if isinstance(text, str) and text.strip():
                lines.append(f"- {text.strip()}")
        return "\n".join(lines)

    async def sync_turn(self, turn: SyncedTurn) -> None:
        """Add the turn's messages as the person's (`user_id`)."""
        messages = [
            {
                "role": "user" if m.speaker is Speaker.PERSON else "assistant",
                "content": m.content,
            }
            for m in turn.messages
            if m.content.strip()
        ]
        if not messages:
            return
        client = await self._sdk()
        with _mapped():
            await client.add(
                messages,
                user_id=turn.person,
                metadata={
                    "herald_agent": self.config.agent_id,
                    "herald_sync_id": turn.sync_id,
                    "herald_session_key": turn.session_key,
                    "herald_session_id": turn.session_id,
                },
            )

    async def on_memory_write(self, person: UserId, target: str, action: str, content: str) -> None:
        """An entry written to the person's USER.md is added as their memory, verbatim
        (`infer=False`); removals and MEMORY.md (the agent's own notes) are not mirrored."""
        if target != "user" or action == "remove":
            return
        client = await self._sdk()
        with _mapped():
            await client.add(
                [{"role": "user", "content": content}],
                user_id=person,
                infer=False,
                metadata={"herald_agent": self.config.agent_id, "herald_memory_file": "USER.md"},
            )

    async def _sdk(self) -> Any:
        """The SDK client, built on first use (its constructor blocks on a request)."""
        if self._client is not None:
            return self._client
        async with self._building:
            if self._client is None:
                self._client = await self._build()
        return self._client

    async def _build(self) -> Any:
        """Build the SDK client (one build at a time: under `_building`)."""
        if self._pending is None:
            await self.ping()  # fails fast, with a timeout, while Mem0 is away
            if self._sdk_class is None:
                raise RuntimeError("the Mem0 provider is not entered")
            cls = await asyncio.shield(self._sdk_class)
            build = functools.partial(cls, api_key=self._key, host=self.config.base_url)
            self._pending = asyncio.get_running_loop().run_in_executor(None, build)
        pending = self._pending
        try:
            # Shielded: a recall that times out meanwhile leaves the build to finish for
            # the next caller instead of throwing the client away.
            client = await asyncio.shield(pending)
        except ValueError as err:  # the SDK's key check failed
            raise MemoryUnavailable(f"Mem0 refused to start: {err}") from err
        except Exception as err:  # requests' connection errors
            raise MemoryUnavailable(f"Mem0 is unreachable: {err!r}") from err
        finally:
            if pending.done():
                self._pending = None
        client.async_client.timeout = httpx.Timeout(self.config.request_timeout)
        return client


def _check(response: httpx.Response) -> None:
    """Raise the contract's error for a failed answer."""
    if response.is_success:
        return
    status = response.status_code
    if status == 429:
        raise MemoryUnavailable("Mem0 is rate-limiting", _retry_after(response))
    if status >= 500 or status == 408:
        raise MemoryUnavailable(f"Mem0 failed: HTTP {status}")
    raise MemoryRejected(f"Mem0 refused the request: HTTP {status} {response.text[:200]}")


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """The SDK's errors as the contract's: retry later, or refused."""
    from mem0.exceptions import (  # noqa: PLC0415 - imported by `import_client` first
        AuthenticationError,
        MemoryNotFoundError,
        MemoryQuotaExceededError,
        NetworkError,
        RateLimitError,
        ValidationError,
    )
    from mem0.exceptions import MemoryError as Mem0Error  # noqa: PLC0415

    try:
        yield
    except RateLimitError as err:
        after = err.debug_info.get("retry_after")
        raise MemoryUnavailable(
            f"Mem0 is rate-limiting: {err.message}",
            float(after) if isinstance(after, int | float) else None,
        ) from err
    except NetworkError as err:
        raise MemoryUnavailable(f"Mem0 is unreachable: {err.message}") from err
    except (
        AuthenticationError,
        ValidationError,
        MemoryNotFoundError,
        MemoryQuotaExceededError,
    ) as err:
        raise MemoryRejected(f"Mem0 refused the request: {err.message}") from err
    except Mem0Error as err:
        raise MemoryUnavailable(f"Mem0 failed: {err.message}") from err
    except httpx.HTTPError as err:
        raise MemoryUnavailable(f"Mem0 is unreachable: {err!r}") from err
