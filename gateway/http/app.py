"""The ASGI app: OpenAI-compatible API, health, readiness, metrics and the console."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from gateway import __version__
from gateway.contracts.adapter import AdapterState
from gateway.http import api, files, jobs, webhooks
from gateway.http.console import SECTIONS
from gateway.http.console.routes import install as install_console
from gateway.http.deps import AppDeps
from gateway.http.errors import http_exception, validation_exception
from gateway.http.middleware import Admission, BodyLimit, RequestMetrics

OFFLINE_WARNING = "no LLM configured: replies come from the offline echo provider"


def create_app(deps: AppDeps) -> FastAPI:
    """Build the app around the daemon's parts."""
    app = FastAPI(
        title="Herald",
        version=__version__,
        summary="An always-on messaging gateway for an LLM agent",
        docs_url=None,
        redoc_url=None,
    )
    app.state.deps = deps
    app.add_exception_handler(HTTPException, http_exception)
    app.add_exception_handler(RequestValidationError, validation_exception)
    app.include_router(api.router)
    app.include_router(jobs.router)
    app.include_router(webhooks.router)
    app.include_router(files.router)
    if deps.config.console.enabled:
        install_console(app, deps, SECTIONS)

    @app.get("/health", tags=["operations"])
    async def health() -> dict[str, Any]:
        """Liveness: the process answers. Lists each adapter's state and the LLM's (a model
        outage degrades answers, not the gateway: the status stays `ok`); `degraded` while
        the database refuses writes (disk full, read-only)."""
        adapters = {name: str(state) for name, state in deps.adapters().items()}
        store_ok = deps.store.health.degraded is None
        body: dict[str, Any] = {
            "status": "draining" if deps.state.draining else "ok" if store_ok else "degraded",
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
            "adapters": adapters,
            "turns": {"active": deps.manager.active_turns},
            "cluster": dict(deps.cluster()),
            "mcp": {name: dict(status) for name, status in deps.mcp().items()},
            "memory": dict(deps.memory()),
        }
        if deps.llm_provider == "echo":
            body["llm"]["warning"] = OFFLINE_WARNING
        return body

    @app.get("/ready", tags=["operations"], responses={503: {"description": "Not ready"}})
    async def ready() -> JSONResponse:
        """200 when serving, every enabled adapter is receiving and the database takes writes
        (messages can be accepted); 503 otherwise."""
        adapters = deps.adapters()
        waiting = sorted(
            n
            for n, s in adapters.items()
            if s not in (AdapterState.RECEIVING, AdapterState.STANDBY)
        )
        store_ok = deps.store.health.degraded is None
        ok = deps.state.serving and not deps.state.draining and not waiting and store_ok
        body = {
            "ready": ok,
            "serving": deps.state.serving,
            "draining": deps.state.draining,
            "not_receiving": waiting,
            "store": deps.store.health.describe(),
            "mcp": {name: dict(status) for name, status in deps.mcp().items()},
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get(
        "/metrics",
        tags=["operations"],
        response_class=Response,
        responses={
            200: {"description": "Prometheus text format", "content": {"text/plain": {}}},
            401: {"description": "Missing or wrong API key"},
        },
    )
    async def metrics(request: Request) -> Response:
        """Prometheus metrics (behind the API key when one is configured)."""
        api.require_key(request)
        return Response(deps.metrics.render(), media_type=deps.metrics.content_type)

    wrapped: Any = Admission(app, deps.manager.admit)
    wrapped = RequestMetrics(wrapped, deps.metrics)
    wrapped = BodyLimit(wrapped, deps.config.api.max_body_bytes)
    # FastAPI stays reachable (for openapi()) while the server runs the wrapped app.
    app.state.asgi = wrapped
    return app
