"""Triggers and their runs as plain data (the API, the CLI and the console show these)."""

from __future__ import annotations

from typing import Any

from gateway.store.triggers import TriggerRun
from gateway.triggers.config import TriggerConfig


def describe(name: str, cfg: TriggerConfig, waiting: int = 0) -> dict[str, Any]:
    """A trigger's definition without its secret."""
    return {
        "name": name,
        "path": f"/hooks/{name}",
        "enabled": cfg.enabled,
        "scheme": str(cfg.scheme),
        "owner": cfg.owner,
        "targets": list(cfg.targets),
        "tools": list(cfg.tools),
        "filter": {
            "headers": {k: list(v) for k, v in cfg.filter.headers.items()},
            "fields": {k: list(v) for k, v in cfg.filter.fields.items()},
        },
        "prompt": cfg.prompt,
        "limits": {
            "max_body_bytes": cfg.max_body_bytes,
            "rate_limit": cfg.rate_limit,
            "rate_window": cfg.rate_window,
            "max_queued": cfg.max_queued,
            "payload_budget": cfg.payload_budget,
        },
        "waiting": waiting,
    }


def run_view(run: TriggerRun) -> dict[str, Any]:
    """One run, without its payload (shown by `herald triggers show --payload` only)."""
    return {
        "id": run.id,
        "trigger": run.trigger,
        "delivery": run.delivery_id,
        "event": run.event,
        "status": str(run.status),
        "attempts": run.attempts,
        "received_at": run.received_at.isoformat(),
        "finished_at": None if run.finished_at is None else run.finished_at.isoformat(),
        "delivery_status": run.delivery_status,
        "error": run.error,
        "output": run.output,
    }
