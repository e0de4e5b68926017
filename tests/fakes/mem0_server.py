"""A fake Mem0 platform API for the `mem0ai` client (`AsyncMemoryClient`).

`Authorization: Token <key>` (401 otherwise). The endpoints the client calls:
- `GET  /v1/ping/` → {"status": "ok", "org_id", "project_id", "user_email"} (the client
  calls it, blocking, when it is built).
- `POST /v3/memories/add/` {"messages": [{role, content}], "user_id", "metadata"?} → {"results":
  [{"id", "memory", "event": "ADD"}]}: here each user message becomes one memory of that
  user (the real service extracts facts with a model).
- `POST /v3/memories/search/` {"query", "filters": {"user_id"}, "top_k"?} → {"results":
  [{"id", "memory", "user_id", "score"}]}: that user's memories only, best word overlap first;
  without a `user_id` filter, 400 (the platform needs an entity filter).
Faults: see `tests/fakes/memory_service.py`.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.memory_service import FakeMemoryService

JSON = dict[str, Any]
_WORD = re.compile(r"\w+")


@dataclass
class Memory:
    """One stored memory."""

    id: str
    user_id: str
    memory: str
    metadata: JSON


@dataclass
class FakeMem0(FakeMemoryService):
    """The fake service; `memories` is everything added, in order."""

    memories: list[Memory] = field(default_factory=list)
    adds: list[JSON] = field(default_factory=list)
    """Every accepted add request's body, in order."""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def of(self, user_id: str) -> list[str]:
        """The memories of `user_id`, in order."""
        return [m.memory for m in self.memories if m.user_id == user_id]

    def authorized(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Token {self.key}"

    def routes(self) -> list[Route]:
        return [
            Route("/v1/ping/", self._ping, methods=["GET"]),
            Route("/v3/memories/add/", self._add, methods=["POST"]),
            Route("/v3/memories/search/", self._search, methods=["POST"]),
        ]

    def _answer(self, request: Request, body: Any, payload: Any, status: int = 200) -> Response:
        self.record(request, body, status)
        return JSONResponse(payload, status_code=status)

    async def _ping(self, request: Request) -> Response:
        payload = {
            "status": "ok",
            "org_id": "org_1",
            "project_id": "proj_1",
            "user_email": "owner@example.org",
        }
        return self._answer(request, None, payload)

    async def _add(self, request: Request) -> Response:
        body: JSON = json.loads(await request.body())
        user = body.get("user_id")
        if not user:
            return self._answer(request, body, {"detail": "user_id is required"}, 400)
        self.adds.append(body)
        events = []
        for m in body.get("messages", []):
            if m.get("role") != "user":
                continue
            memory = Memory(
                f"mem_{next(self._ids)}", user, m["content"], body.get("metadata") or {}
            )
            self.memories.append(memory)
            events.append({"id": memory.id, "memory": memory.memory, "event": "ADD"})
        return self._answer(request, body, {"results": events})

    async def _search(self, request: Request) -> Response:
        body: JSON = json.loads(await request.body())
        user = (body.get("filters") or {}).get("user_id")
        if not user:
            return self._answer(request, body, {"detail": "filters need user_id"}, 400)
        words = {w.lower() for w in _WORD.findall(body.get("query", ""))}
        found = [
            (len(words & {w.lower() for w in _WORD.findall(m.memory)}), m)
            for m in self.memories
            if m.user_id == user
        ]
        found.sort(key=lambda pair: -pair[0])
        top = found[: int(body.get("top_k") or 10)]
        results = [
            {"id": m.id, "memory": m.memory, "user_id": m.user_id, "score": float(score)}
            for score, m in top
        ]
        return self._answer(request, body, {"results": results})
