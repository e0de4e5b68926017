"""A fake Honcho (API v3) for the `honcho-ai` SDK: the endpoints Herald's provider calls.

Bearer auth (`Authorization: Bearer <key>`; 401 otherwise). Get-or-create semantics, as
Honcho answers them:
- `POST /v3/workspaces` {"id"} → the workspace.
- `POST /v3/workspaces/{ws}/peers` {"id", "metadata"?} → the peer.
- `POST /v3/workspaces/{ws}/sessions` {"id", "metadata"?, "peers"?: {peer: config}} → the
  session (peers added).
- `POST /v3/workspaces/{ws}/sessions/{sid}/messages` {"messages": [{content, peer_id,
  metadata}]} → the created messages (a peer not in the session is 404).
- `GET  /v3/workspaces/{ws}/peers/{pid}/context?search_query=` → {peer_id, target_id,
  representation, peer_card}: the representation here is what the peer itself said, one line
  each (the real service derives conclusions; one peer's never includes another's words).
- `POST /v3/workspaces/{ws}/peers/{pid}/chat` {"query"} → {"content"}: the dialectic answer,
  here the representation prefixed by "Dialectic:".
- `POST /v3/workspaces/{ws}/sessions/{sid}/messages/list` {"filters": {"metadata": {…}}} → a
  page {"items", "page", "size", "total", "pages"} of the session's matching messages.
- `POST /v3/workspaces/{ws}/conclusions` {"conclusions": [{observer_id, observed_id,
  content}]} → the created conclusions (they join the observed peer's representation).
Faults: see `tests/fakes/memory_service.py`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.memory_service import FakeMemoryService

JSON = dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Message:
    """A message Honcho stored."""

    id: str
    workspace: str
    session: str
    peer: str
    content: str
    metadata: JSON


@dataclass
class FakeHoncho(FakeMemoryService):
    """The fake service; `messages` is everything added, in order."""

    workspaces: set[str] = field(default_factory=set)
    peers: dict[tuple[str, str], JSON] = field(default_factory=dict)
    sessions: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    conclusions: list[JSON] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def said_by(self, peer: str) -> list[str]:
        """What `peer` said, in order (any workspace, any session)."""
        return [m.content for m in self.messages if m.peer == peer]

    def authorized(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {self.key}"

    def routes(self) -> list[Route]:
        base = "/v3/workspaces"
        return [
            Route(base, self._workspace, methods=["POST"]),
            Route(base + "/{ws}/peers", self._peer, methods=["POST"]),
            Route(base + "/{ws}/sessions", self._session, methods=["POST"]),
            Route(base + "/{ws}/sessions/{sid}/messages", self._messages, methods=["POST"]),
            Route(base + "/{ws}/sessions/{sid}/messages/list", self._list, methods=["POST"]),
            Route(base + "/{ws}/peers/{pid}/context", self._context, methods=["GET"]),
            Route(base + "/{ws}/peers/{pid}/chat", self._chat, methods=["POST"]),
            Route(base + "/{ws}/conclusions", self._conclusions, methods=["POST"]),
        ]

    async def _body(self, request: Request) -> JSON:
        raw = await request.body()
        body: JSON = json.loads(raw) if raw else {}
        return body

    def _answer(self, request: Request, body: Any, payload: Any, status: int = 200) -> Response:
        self.record(request, body, status)
        return JSONResponse(payload, status_code=status)

    async def _workspace(self, request: Request) -> Response:
        body = await self._body(request)
        self.workspaces.add(body["id"])
        payload = {"id": body["id"], "metadata": {}, "configuration": {}, "created_at": _now()}
        return self._answer(request, body, payload)

    async def _peer(self, request: Request) -> Response:
        ws = request.path_params["ws"]
        body = await self._body(request)
        if ws not in self.workspaces:
            return self._answer(request, body, {"detail": "workspace not found"}, 404)
        self.peers.setdefault((ws, body["id"]), body.get("metadata") or {})
        return self._answer(request, body, self._peer_json(ws, body["id"]))

    def _peer_json(self, ws: str, pid: str) -> JSON:
        return {
            "id": pid,
            "workspace_id": ws,
            "created_at": _now(),
            "metadata": self.peers[(ws, pid)],
            "configuration": {},
        }

    async def _session(self, request: Request) -> Response:
        ws = request.path_params["ws"]
        body = await self._body(request)
        members = self.sessions.setdefault((ws, body["id"]), set())
        for pid in body.get("peers") or {}:
            self.peers.setdefault((ws, pid), {})
            members.add(pid)
        payload = {
            "id": body["id"],
            "is_active": True,
            "workspace_id": ws,
            "metadata": body.get("metadata") or {},
            "configuration": {},
            "created_at": _now(),
        }
        return self._answer(request, body, payload)

    async def _messages(self, request: Request) -> Response:
        ws, sid = request.path_params["ws"], request.path_params["sid"]
        body = await self._body(request)
        members = self.sessions.get((ws, sid))
        if members is None:
            return self._answer(request, body, {"detail": "session not found"}, 404)
        created: list[JSON] = []
        for m in body["messages"]:
            if m["peer_id"] not in members:
                return self._answer(request, body, {"detail": "peer not in session"}, 404)
        for m in body["messages"]:
            message = Message(
                f"msg_{next(self._ids)}",
                ws,
                sid,
                m["peer_id"],
                m["content"],
                m.get("metadata") or {},
            )
            self.messages.append(message)
            created.append(self._message_json(message))
        return self._answer(request, body, created)

    async def _list(self, request: Request) -> Response:
        ws, sid = request.path_params["ws"], request.path_params["sid"]
        body = await self._body(request)
        wanted: JSON = (body.get("filters") or {}).get("metadata") or {}
        found = [
            self._message_json(m)
            for m in self.messages
            if (m.workspace, m.session) == (ws, sid)
            and all(m.metadata.get(k) == v for k, v in wanted.items())
        ]
        size = int(request.query_params.get("size", 50))
        page = {"items": found[:size], "page": 1, "size": size, "total": len(found), "pages": 1}
        return self._answer(request, body, page)

    def _message_json(self, m: Message) -> JSON:
        return {
            "id": m.id,
            "content": m.content,
            "peer_id": m.peer,
            "session_id": m.session,
            "metadata": m.metadata,
            "created_at": _now(),
            "workspace_id": m.workspace,
            "token_count": len(m.content.split()),
        }

    async def _conclusions(self, request: Request) -> Response:
        ws = request.path_params["ws"]
        body = await self._body(request)
        created = []
        for c in body["conclusions"]:
            item = {
                "id": f"con_{next(self._ids)}",
                "content": c["content"],
                "observer_id": c["observer_id"],
                "observed_id": c["observed_id"],
                "session_id": c.get("session_id"),
                "created_at": _now(),
            }
            self.conclusions.append({**item, "workspace": ws})
            created.append(item)
        return self._answer(request, body, created)

    def _representation(self, ws: str, pid: str) -> str:
        said = [
            f"{pid} said: {m.content}" for m in self.messages if m.workspace == ws and m.peer == pid
        ]
        noted = [
            f"{c['observer_id']} concluded: {c['content']}"
            for c in self.conclusions
            if c["workspace"] == ws and c["observed_id"] == pid
        ]
        return "\n".join([*noted, *said])

    async def _context(self, request: Request) -> Response:
        ws, pid = request.path_params["ws"], request.path_params["pid"]
        query = dict(request.query_params)
        if (ws, pid) not in self.peers:
            return self._answer(request, query, {"detail": "peer not found"}, 404)
        payload = {
            "peer_id": pid,
            "target_id": query.get("target", pid),
            "representation": self._representation(ws, pid) or None,
            "peer_card": None,
        }
        return self._answer(request, query, payload)

    async def _chat(self, request: Request) -> Response:
        ws, pid = request.path_params["ws"], request.path_params["pid"]
        body = await self._body(request)
        text = self._representation(ws, pid)
        return self._answer(request, body, {"content": f"Dialectic: {text}" if text else None})
