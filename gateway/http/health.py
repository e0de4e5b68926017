"""`GET /health` and `GET /ready`: liveness and readiness, for probes and operators.

Anyone may ask; only the key holder (or, without `api.key`, a request made on this machine)
sees why. Anyone else gets the status alone (`status` / `ready`): the details name the model
endpoint, adapters and services, and their errors quote what those services answered.
Every body passes the daemon's redactor, so a configured secret echoed by a service never
leaves in it.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway import __version__
from gateway.contracts.adapter import AdapterState
from gateway.http.deps import AppDeps
from gateway.http.local import ServerNames

OFFLINE_WARNING = "no LLM configured: replies come from the offline echo provider"

router = APIRouter(tags=["operations"])


def may_see_details(request: Request, deps: AppDeps) -> bool:
    """Whether `request` may read the details: it carries `Authorization: Bearer <api.key>`
    (compared in constant time), or no key is configured and the request is local (see
    `gateway.http.local`: not forwarded, naming this server)."""
    key = deps.config.api.key
    if key is None:
        names: ServerNames | None = getattr(request.app.state, "names", None)
        return names is None or names.is_local(request.scope)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = key.get_secret_value().encode()
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    """Liveness: the process answers. Lists each adapter's state and the LLM's (a model
    outage degrades answers, not the gateway: the status stays `ok`); `degraded` while
    the database refuses writes (disk full, read-only). With `api.key` set, the details
    need the key; without it, the status alone."""
    deps: AppDeps = request.app.state.deps
    store_ok = deps.store.health.degraded is None
    status = "draining" if deps.state.draining else "ok" if store_ok else "degraded"
    if not may_see_details(request, deps):
        return {"status": status}
    body: dict[str, Any] = {
        "status": status,
        "version": __version__,
        "instance": deps.config.effective_instance_id,
        "database": deps.store.dialect,
        "store": deps.store.health.describe(),
        "llm": {
            "provider": deps.llm_provider,
            "model": deps.llm_model,
            "state": str(deps.llm_health.state),
            "detail": deps.llm_health.describe(),
            "since": None
            if deps.llm_health.since is None
            else deps.llm_health.since.isoformat(timespec="seconds"),
            "error": deps.llm_health.error,
        },
        "adapters": {name: str(state) for name, state in deps.adapters().items()},
        "turns": {"active": deps.manager.active_turns},
        "cluster": dict(deps.cluster()),
        "mcp": {name: dict(status) for name, status in deps.mcp().items()},
        "memory": dict(deps.memory()),
    }
    if deps.profile_models:  # each profile's own model, apart from the default's
        body["llm"]["profiles"] = {
            name: {
                "model": model,
                "state": str(state.state),
                "detail": state.describe(),
                "error": state.error,
            }
            for name, (model, state) in deps.profile_models.items()
        }
    if deps.llm_provider == "echo":
        body["llm"]["warning"] = OFFLINE_WARNING
    redacted: dict[str, Any] = deps.redactor.data(body)
    return redacted


@router.get("/ready", responses={503: {"description": "Not ready"}})
async def ready(request: Request) -> JSONResponse:
    """200 when serving, every enabled adapter is receiving and the database takes writes
    (messages can be accepted); 503 otherwise. With `api.key` set, why it is not ready
    needs the key; without it, `ready` alone."""
    deps: AppDeps = request.app.state.deps
    waiting = sorted(
        n
        for n, s in deps.adapters().items()
        if s not in (AdapterState.RECEIVING, AdapterState.STANDBY)
    )
    store_ok = deps.store.health.degraded is None
    ok = deps.state.serving and not deps.state.draining and not waiting and store_ok
    code = 200 if ok else 503
    if not may_see_details(request, deps):
        return JSONResponse({"ready": ok}, status_code=code)
    body = {
        "ready": ok,
        "serving": deps.state.serving,
        "draining": deps.state.draining,
        "not_receiving": waiting,
        "store": deps.store.health.describe(),
        "mcp": {name: dict(status) for name, status in deps.mcp().items()},
    }
    return JSONResponse(deps.redactor.data(body), status_code=code)
