"""Schemathesis over the OpenAPI document Herald serves (the OpenAI-compatible API, the jobs
API, the webhooks, health, readiness and metrics), against a running `herald run` whose Slack,
Telegram and Twilio receive by webhook: no 5xx, every response as the document says (status,
content type, body schema), and a refused request writes nothing.

Examples are few per operation and unbounded in time per example (`deadline=None`: the
machine is shared), so the whole run takes seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import positive_data_acceptance

# Imported here, on the main thread, although loading a schema would import it lazily: the
# fuzzing runs in a worker thread, and a module first imported there is rewritten by pytest
# while the main thread compiles too, which CPython 3.11's parser does not survive
# ("AST constructor recursion depth mismatch").
from schemathesis.specs.openapi.schemas import OpenApiSchema  # noqa: F401

from tests.e2e.daemon import Daemon
from tests.fakes.llm import FakeLLM
from tests.fakes.slack import DEFAULT_BOT_TOKEN, DEFAULT_SIGNING_SECRET, FakeSlackServer
from tests.fakes.telegram import FakeTelegramServer
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    FakeTwilioServer,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

KEY = "fuzz-api-key"
TELEGRAM_TOKEN = "123456:fuzz-token"
WEBHOOK_SECRET = "fuzz-webhook-secret"
EXAMPLES = 10
"""Examples per operation."""
WEBHOOK_PARAMETERS = {
    "platform": ["telegram", "slack", "twilio", "discord", "nonesuch"],
    "path": ["events", "sms", "status", "interactive", "x/../../y"],
}
"""What the webhook paths take: the webhook platforms, one that receives otherwise and none;
their paths and others (the rest of the document is fuzzed as it is)."""

TABLES = {
    "webhooks": ("inbox", "pairings", "sessions"),
    "jobs": ("jobs",),
    "v1": ("sessions", "turns", "messages"),
}
"""What each part of the API could write: a refused request must leave it as it was."""


def fingerprint(database: Path, tables: tuple[str, ...]) -> str:
    """A digest of the rows of `tables` (the jobs without their scheduler bookkeeping)."""
    digest = hashlib.sha256()
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30) as conn:
        for table in tables:
            if table == "jobs":
                query = (
                    "SELECT id, name, prompt, schedule, timezone, targets, enabled, timeout "
                    "FROM jobs ORDER BY id"
                )
            else:
                query = f"SELECT count(*), max(id) FROM {table}"
            digest.update(json.dumps(conn.execute(query).fetchall(), default=str).encode())
    return digest.hexdigest()


def part_of(path: str) -> str:
    """Which part of the API a path belongs to ("" for the read-only operations)."""
    for part in TABLES:
        if path.startswith((f"/{part}", f"/api/{part}")):
            return part
    return ""


def fuzz(url: str, database: Path, seen: Counter[tuple[str, int]]) -> list[str]:
    """Run every operation of the served document; returns what failed, in words. `seen`
    counts the answers by (path, status)."""
    document = httpx.get(f"{url}/openapi.json", timeout=10).raise_for_status().json()
    for path, operations in document["paths"].items():
        if path.startswith("/webhooks/"):
            for operation in operations.values():
                for parameter in operation.get("parameters", []):
                    if parameter["name"] in WEBHOOK_PARAMETERS:
                        values = WEBHOOK_PARAMETERS[parameter["name"]]
                        parameter["schema"] = {"type": "string", "enum": values}
    schema = schemathesis.openapi.from_dict(document)
    failures: list[str] = []
    headers = {"Authorization": f"Bearer {KEY}"}
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            failures.append(f"an operation the document does not describe well: {result.err()}")
            continue
        operation = result.ok()
        tables = TABLES.get(part_of(operation.path), ())
        check = _checker(
            url, database=database, headers=headers, tables=tables, failures=failures, seen=seen
        )
        run = settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )(given(case=operation.as_strategy(), authorised=st.booleans())(check))
        run()
    return failures


def _checker(
    url: str,
    *,
    database: Path,
    headers: dict[str, str],
    tables: tuple[str, ...],
    failures: list[str],
    seen: Counter[tuple[str, int]],
) -> Callable[..., None]:
    def check(case: Any, authorised: bool) -> None:
        before = fingerprint(database, tables) if tables else ""
        response = case.call(base_url=url, headers=headers if authorised else {}, timeout=30)
        seen[case.path, response.status_code] += 1
        where = f"{case.method} {case.formatted_path} -> {response.status_code}"
        if response.status_code >= 500 and response.status_code != 503:
            failures.append(f"{where}: {response.text[:300]}")
            return
        try:
            case.validate_response(
                response,
                headers=headers if authorised else {},
                # Schedules, time zones, targets and chat roles are checked beyond what JSON
                # Schema says: a schema-valid body may be refused (400), and says why.
                excluded_checks=[positive_data_acceptance],
            )
        except FailureGroup as err:
            failures.extend(f"{where}: {str(e)[:400]}" for e in err.exceptions)
        if response.status_code >= 400 and tables:
            after = fingerprint(database, tables)
            if after != before:
                failures.append(f"{where}: a refused request changed {tables}")

    return check


async def test_every_operation_answers_as_documented_and_refusals_write_nothing(
    tmp_path: Path,
) -> None:
    async with (
        FakeLLM() as llm,
        FakeSlackServer() as slack,
        FakeTelegramServer(TELEGRAM_TOKEN) as tg,
        FakeTwilioServer() as twilio,
    ):
        daemon = Daemon(tmp_path / "state")
        (tmp_path / "state").mkdir()
        daemon.settings = {
            "log_level": "INFO",
            "api": {"key": KEY},
            "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
            "platforms": {
                "slack": {
                    "mode": "events",
                    "bot_token": DEFAULT_BOT_TOKEN,
                    "signing_secret": DEFAULT_SIGNING_SECRET,
                    "base_url": slack.base_url,
                    "allowed_users": ["*"],
                },
                "telegram": {
                    "token": TELEGRAM_TOKEN,
                    "base_url": tg.base_url,
                    "base_file_url": tg.base_file_url,
                    "mode": "webhook",
                    "webhook_url": f"{daemon.url}/webhooks/telegram",
                    "webhook_secret": WEBHOOK_SECRET,
                    "allowed_users": ["*"],
                },
                "twilio": {
                    "account_sid": DEFAULT_ACCOUNT_SID,
                    "auth_token": DEFAULT_AUTH_TOKEN,
                    "from_number": HERALD_NUMBER,
                    "base_url": twilio.base_url,
                    "public_url": daemon.url,
                    "allowed_numbers": ["*"],
                    "status_callbacks": False,
                },
            },
        }
        await daemon.start()
        try:
            seen: Counter[tuple[str, int]] = Counter()
            database = daemon.state_dir / "herald.db"
            failures = await asyncio.to_thread(fuzz, daemon.url, database, seen)
            assert not failures, "\n".join(failures[:20])
            # The adapters themselves refused unsigned webhooks; unknown platforms got 404.
            webhook = {status for (path, status) in seen if path.startswith("/webhooks/")}
            assert webhook & {401, 403}, seen
            assert 404 in webhook
            assert {status for (path, status) in seen if path == "/api/jobs"} & {400, 422}
            # And it still serves.
            async with httpx.AsyncClient() as http:
                assert (await http.get(f"{daemon.url}/ready")).status_code == 200
            assert await daemon.stop() == 0
        finally:
            if daemon.process is not None and daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()
        assert "Traceback" not in daemon.output()
