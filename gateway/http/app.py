"""The ASGI app: OpenAI-compatible API, health, readiness, metrics and the console."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from gateway import __version__
from gateway.http import api, files, health, hooks, jobs, webhooks
from gateway.http.console import SECTIONS
from gateway.http.console.routes import install as install_console
from gateway.http.deps import AppDeps
from gateway.http.errors import http_exception, validation_exception
from gateway.http.local import ServerNames
from gateway.http.middleware import Admission, BodyLimit, KeyGate, RequestMetrics

OFFLINE_WARNING = health.OFFLINE_WARNING


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
    api_config = deps.config.api
    names = ServerNames.of(api_config.host, api_config.port, api_config.public_names)
    app.state.names = names
    app.add_exception_handler(HTTPException, http_exception)
    app.add_exception_handler(RequestValidationError, validation_exception)
    app.include_router(api.router)
    app.include_router(jobs.router)
    app.include_router(webhooks.router)
    app.include_router(hooks.router)
    app.include_router(hooks.api)
    app.include_router(files.router)
    app.include_router(health.router)
    if deps.config.console.enabled:
        install_console(app, deps, SECTIONS)

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
    wrapped = KeyGate(wrapped, deps.config.api.key, names)
    wrapped = RequestMetrics(wrapped, deps.metrics)
    wrapped = BodyLimit(wrapped, deps.config.api.max_body_bytes)
    # FastAPI stays reachable (for openapi()) while the server runs the wrapped app.
    app.state.asgi = wrapped
    return app
