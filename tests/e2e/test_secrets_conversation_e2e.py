"""Secrets stay secret through a whole conversation: one `herald run` at DEBUG with every
platform against its fake (the soak's drivers), each person answered, some sends failing on
the way; then no token, key, password or signing secret appears in the log, `/health`,
`/metrics`, `herald config check`, or the error answers of the API and the webhooks
(`herald doctor` is checked per platform in test_secrets_e2e.py)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.soak import DRIVERS, Driver, Plan, settings
from gateway.store import Store
from tests.e2e.daemon import HERALD, Daemon
from tests.fakes.dovecot import dovecot_binary
from tests.fakes.llm import FakeLLM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

LLM_KEY = "sk-conversation-secret-llm-key-0123456789"
API_KEY = "conversation-secret-api-key-0123456789"
SLACK_SIGNING_SECRET = "conversation-slack-signing-secret-0123456789"
SECRET_FIELDS = ("token", "secret", "password", "key", "auth")


def secrets_of(section: dict[str, Any]) -> list[str]:
    """The values of a section's secret fields (by name), and a token's part after a colon."""
    found = []
    for name, value in section.items():
        if isinstance(value, str) and any(word in name for word in SECRET_FIELDS):
            found.append(value)
            if ":" in value:  # a Telegram token: the bot id stays visible, the rest must not
                found.append(value.split(":", 1)[1])
    return [s for s in found if len(s) >= 8]


async def command(config: Path, *args: str) -> str:
    """What `herald <args> --config <config>` prints (stdout and stderr)."""
    process = await asyncio.create_subprocess_exec(
        str(HERALD),
        *args,
        "--config",
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(config.parent)},
    )
    out, _ = await process.communicate()
    return out.decode("utf-8", "replace")


async def error_answers(daemon: Daemon) -> str:
    """The bodies of refused requests: wrong API key, a bad job, unsigned webhooks."""
    bodies = []
    async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as http:
        wrong = {"Authorization": "Bearer not-the-key"}
        key = {"Authorization": f"Bearer {API_KEY}"}
        answers = [
            await http.post("/v1/chat/completions", headers=wrong, json={"messages": []}),
            await http.post("/api/jobs", headers=key, json={"prompt": "x", "schedule": "never"}),
            await http.post("/webhooks/twilio/sms", data={"From": "+1555", "Body": "hi"}),
            await http.post("/webhooks/slack/events", json={"type": "event_callback"}),
            await http.post("/webhooks/telegram", json={"update_id": 1}),
            await http.get("/metrics"),
        ]
        for answer in answers:
            assert answer.status_code >= 400, answer.text
            bodies.append(f"{answer.status_code} {answer.headers} {answer.text}")
        bodies.append((await http.get("/health")).text)
        bodies.append((await http.get("/metrics", headers=key)).text)
    return "\n".join(bodies)


async def test_a_conversation_on_every_platform_leaks_no_secret(tmp_path: Path) -> None:
    dovecot_binary()
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        drivers: list[Driver] = [cls(6, 1, 7, 120) for cls in DRIVERS.values()]
        for d in drivers:
            await d.start(stack)
        config = settings(Plan(), llm, drivers, "")
        config.pop("database_url")
        config["log_level"] = "DEBUG"
        config["api"] = {"key": API_KEY}
        config["llm"]["api_key"] = LLM_KEY
        config["platforms"]["slack"]["signing_secret"] = SLACK_SIGNING_SECRET
        # A silenced Discord connection is found by asking for channel activity: soon, here,
        # instead of after a minute (its replacement is logged too).
        config["platforms"]["discord"]["activity_check_interval"] = 2.0
        (tmp_path / "state").mkdir()
        daemon = Daemon(tmp_path / "state", config)
        stack.push_async_callback(_kill_leftover, daemon)
        for d in sorted(drivers, key=lambda d: d.name != "twilio"):  # twilio's url first
            await d.scenario.before(daemon)
        await daemon.start()
        # Some sends fail on the way (their errors are logged at DEBUG and up).
        for d in drivers:
            d.inject_faults(1.0)
        await asyncio.gather(*(d.scenario.burst(0) for d in drivers))
        async with Store.open(daemon.database_url, migrate=False) as store:
            for d in drivers:
                await d.scenario.settle(store, daemon)
        answers = await error_answers(daemon)
        assert await daemon.stop() == 0
        checked = await command(daemon.config_path, "config", "check")

    secrets = [LLM_KEY, API_KEY, SLACK_SIGNING_SECRET]
    for section in config["platforms"].values():
        secrets += secrets_of(section)
    assert len(secrets) >= 10, secrets  # every platform's credentials are looked for
    log = daemon.output()
    assert " DEBUG " in log
    assert "You said: message" in "".join(t for d in drivers for _, t, _ in d.received())
    for where, text in [
        ("the log", log),
        ("the answers", answers),
        ("config check", checked),
    ]:
        for secret in secrets:
            at = text.find(secret)
            assert at < 0, f"{secret!r} in {where}: …{text[max(0, at - 200) : at + 50]}…"
    assert "***" in checked  # masked, not left out


async def _kill_leftover(daemon: Daemon) -> None:
    if daemon.process is not None and daemon.process.returncode is None:
        daemon.process.kill()
        await daemon.process.wait()
