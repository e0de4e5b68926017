"""The image runs Herald as README's "Containers" says: health, an answer through the `openai`
SDK, a drain on SIGTERM within the stop timeout, a conversation kept across containers
(SQLite on the volume; PostgreSQL with nothing but a cache in the container), non-root."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from agent_core.agent import MEMORY_MARKER
from tests.conftest import PgServer
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, last_user_text, you_said
from tests.image import engine
from tests.image.conftest import FIGURES
from tests.image.engine import Container, running

pytestmark = pytest.mark.timeout(180, func_only=True)
KEY = "image-test-api-key"
SLOW = "take your time"
"""A message the fake model never answers (until the test ends)."""


def responder(body: dict[str, Any]) -> Reply:
    """Echo turns, save nothing in the memory pass, hang on SLOW."""
    if MEMORY_MARKER in str(body["messages"][0]["content"]):
        return Reply(text="nothing to save")
    if last_user_text(body) == SLOW:
        return Reply(hang=True)
    return you_said(body)


def turns(llm: FakeLLM) -> list[dict[str, Any]]:
    """The model calls of turns (not of the memory pass)."""
    return [r for r in llm.requests if MEMORY_MARKER not in str(r["messages"][0]["content"])]


async def waiting_on_the_model(llm: FakeLLM, text: str, timeout: float = 30) -> None:
    """Wait until the fake model has been asked `text`."""
    async with asyncio.timeout(timeout):
        while not any(last_user_text(r) == text for r in llm.requests):
            await asyncio.sleep(0.05)


def client(container: Container, session: str) -> openai.AsyncOpenAI:
    """The `openai` SDK against the container, in a named session."""
    return openai.AsyncOpenAI(
        base_url=f"{container.url}/v1",
        api_key=KEY,
        default_headers={"X-Herald-Session-Id": session},
        max_retries=0,
    )


async def ask(container: Container, session: str, text: str) -> str:
    """One message in `session`; the agent's answer."""
    async with client(container, session) as sdk:
        reply = await sdk.chat.completions.create(
            model="herald", messages=[{"role": "user", "content": text}]
        )
    return reply.choices[0].message.content or ""


@contextlib.contextmanager
def secrets_for(llm: FakeLLM, **more: str) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """Podman secrets for the API key, the model's key and `more`; the env naming them."""
    with contextlib.ExitStack() as stack:
        files = {"herald_api_key": KEY, "llm_api_key": "sk-fake", **more}
        names = {stack.enter_context(engine.secret(v)): k for k, v in files.items()}
        env = {
            "HERALD_API__KEY_FILE": "/run/secrets/herald_api_key",
            "HERALD_LLM__API_KEY_FILE": "/run/secrets/llm_api_key",
            "HERALD_LLM__BASE_URL": llm.base_url,
            "HERALD_LLM__MODEL": "fake-model",
        }
        yield names, env


async def test_serves_drains_and_keeps_the_conversation_on_its_volume(
    image: str, tmp_path: Path
) -> None:
    config = tmp_path / "herald.yaml"
    config.write_text(yaml.safe_dump({"api": {"model_name": "herald-in-a-box"}}))
    config.chmod(0o644)
    volume = engine.new_name("state")
    await engine.aengine("volume", "create", volume)
    try:
        async with FakeLLM() as llm:
            llm.responder = responder
            with secrets_for(llm) as (names, env):
                first = Container(free_port(), env=env, secrets=names, volume=volume, config=config)
                async with running(first):
                    FIGURES["run → /ready (new volume, SQLite)"] = f"{first.ready_after:.1f} s"
                    async with httpx.AsyncClient(base_url=first.url, timeout=5) as http:
                        health = (await http.get("/health")).json()
                        assert health["status"] == "ok", health
                        assert (await http.get("/ready")).status_code == 200
                        # The API listens on 0.0.0.0 and wants the key.
                        assert (await http.get("/v1/models")).status_code == 401
                        # The mounted config file is read.
                        models = await http.get(
                            "/v1/models", headers={"Authorization": f"Bearer {KEY}"}
                        )
                        assert [m["id"] for m in models.json()["data"]] == ["herald-in-a-box"]
                    await engine.aengine("healthcheck", "run", first.name)

                    processes = await first.processes()
                    assert any("herald run" in args for _, args in processes), processes
                    assert {user for user, _ in processes} == {"herald"}, processes

                    answer = await ask(first, "alpha", "my name is Ada")
                    assert answer == "You said: my name is Ada"

                    # SIGTERM while a turn waits on the model: the drain cuts it off, exit 0.
                    slow = asyncio.create_task(ask(first, "beta", SLOW))
                    try:
                        await waiting_on_the_model(llm, SLOW)
                        code, seconds = await first.stop()
                    finally:
                        slow.cancel()
                        with contextlib.suppress(asyncio.CancelledError, openai.OpenAIError):
                            await slow
                    FIGURES["SIGTERM with a turn running → exit"] = f"{seconds:.1f} s"
                    assert code == 0, await first.logs()
                    assert seconds < engine.STOP_TIMEOUT

                # A new container on the same volume goes on with the conversation.
                second = Container(free_port(), env=env, secrets=names, volume=volume)
                async with running(second):
                    answer = await ask(second, "alpha", "what is my name?")
                    assert answer == "You said: what is my name?"
                    history = str(turns(llm)[-1]["messages"])
                    assert "my name is Ada" in history
                    code, _ = await second.stop()
                    assert code == 0, await second.logs()
    finally:
        await engine.aengine("volume", "rm", "--force", volume, check=False)


async def test_postgresql_keeps_the_conversation_without_a_volume(
    image: str, pg_server: PgServer
) -> None:
    database = pg_server.create_database()
    try:
        async with FakeLLM() as llm:
            llm.responder = responder
            url = pg_server.url(database)
            with secrets_for(llm, database_url=url) as (names, common):
                env = {**common, "HERALD_DATABASE_URL_FILE": "/run/secrets/database_url"}
                for text in ("my name is Ada", "what is my name?"):
                    # A fresh container each time: its state directory starts empty.
                    container = Container(free_port(), env=env, secrets=names)
                    async with running(container):
                        assert await ask(container, "alpha", text) == f"You said: {text}"
                        code, _ = await container.stop()
                        assert code == 0, await container.logs()
                assert "my name is Ada" in str(turns(llm)[-1]["messages"])
    finally:
        pg_server.drop_database(database)


async def test_refuses_to_listen_on_every_address_without_a_key(image: str) -> None:
    container = Container(free_port())
    try:
        await container.start()
        assert await container.wait_exited() == 2
        assert "api.key is required" in await container.logs()
    finally:
        await container.remove()


async def test_without_init_the_entrypoint_reaps_orphans_and_passes_sigterm_on(
    image: str, tmp_path: Path
) -> None:
    """Started without `--init` (Kubernetes has none), nothing but the entrypoint can reap
    what a tool or an MCP server leaves behind, nor receive SIGTERM as PID 1. The root file
    system is read-only too: Herald writes only to its volume."""
    mounts = {}
    for name, value in {"herald_api_key": KEY, "llm_api_key": "sk-fake"}.items():
        (tmp_path / name).write_text(value + "\n")
        (tmp_path / name).chmod(0o644)
        mounts[tmp_path / name] = f"/run/secrets/{name}"
    async with FakeLLM() as llm, contextlib.AsyncExitStack() as stack:
        _, env = stack.enter_context(secrets_for(llm))
        container = Container(free_port(), env=env, mounts=mounts, init=False, read_only=True)
        await stack.enter_async_context(running(container))
        assert await ask(container, "gamma", "hello") == "You said: hello"
        # Orphans: the shell exits at once, its two children end a moment later under PID 1.
        await engine.aengine("exec", container.name, "sh", "-c", "sleep 0.2 & sleep 0.2 & exit 0")
        deadline = asyncio.get_running_loop().time() + 10
        while (zombies := await container.zombies()) and (
            asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(0.2)
        assert not zombies, f"unreaped: {zombies}"
        processes = await container.processes()
        assert any("herald run" in args for _, args in processes), processes
        code, seconds = await container.stop()
        assert code == 0, await container.logs()
        assert seconds < engine.STOP_TIMEOUT


async def test_a_state_directory_it_cannot_write_is_one_clear_error(
    image: str, tmp_path: Path
) -> None:
    """An operator's bind mount still owned by root: exit 2, saying whom to chown it to."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    async with FakeLLM() as llm:
        with secrets_for(llm) as (names, env):
            container = Container(free_port(), env=env, secrets=names, volume=str(state))
            try:
                await container.start()
                assert await container.wait_exited() == 2
                logs = await container.logs()
                assert "the state directory /var/lib/herald is not writable" in logs, logs
                assert "uid 10001" in logs, logs
            finally:
                await container.remove()


DIGEST = """
import hashlib, json, pathlib, sysconfig
root = pathlib.Path(sysconfig.get_paths()["purelib"])
print(json.dumps({
    str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
    for package in ("gateway", "agent_core", "adapters")
    for p in sorted((root / package).rglob("*.py"))
}))
"""


async def test_the_image_holds_this_checkout(image: str) -> None:
    """A layer cache that missed a change would test yesterday's code."""
    out = await engine.aengine("run", "--rm", "--entrypoint", "python3", image, "-I", "-c", DIGEST)
    inside: dict[str, str] = json.loads(out)
    here = {
        str(p.relative_to(engine.ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
        for package in ("gateway", "agent_core", "adapters")
        for p in sorted((engine.ROOT / package).rglob("*.py"))
    }
    assert inside == here


def test_image_size_is_reported(image: str) -> None:
    size = engine.image_size()
    assert size < 800e6, f"{size / 1e6:.0f} MB"  # a regression guard; README has the figure


def test_compose_file_describes_two_instances_on_postgresql_behind_one_port() -> None:
    compose = yaml.safe_load((engine.ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    heralds = {name: s for name, s in services.items() if name.startswith("herald-")}
    assert len(heralds) == 2
    ids = {s["environment"]["HERALD_INSTANCE_ID"] for s in heralds.values()}
    assert len(ids) == 2
    for service in heralds.values():
        assert service["environment"]["HERALD_DATABASE_URL_FILE"].startswith("/run/secrets/")
        assert "ports" not in service  # reached through the proxy only
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    migrate = services["migrate"]
    assert migrate["entrypoint"] == ["herald", "db", "upgrade"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert len(published) == 1
    proxy = next(s for s in services.values() if s.get("ports"))
    assert set(proxy["depends_on"]) == set(heralds)
    for name in compose.get("secrets", {}):
        assert "file" in compose["secrets"][name]


def test_compose_proxy_resolves_under_docker_and_podman_and_keeps_the_host() -> None:
    """nginx asks the container's own DNS server (docker's 127.0.0.11 is not podman's) and
    passes the Host with its port, which Herald's console checks."""
    compose = yaml.safe_load((engine.ROOT / "deploy" / "compose.yaml").read_text())
    proxy = compose["services"]["proxy"]
    assert proxy["environment"]["NGINX_ENTRYPOINT_LOCAL_RESOLVERS"]
    source, target, *_ = next(v for v in proxy["volumes"] if "nginx.conf" in v).split(":")
    assert target.startswith("/etc/nginx/templates/")
    assert target.endswith(".conf.template")
    text = (engine.ROOT / "deploy" / source.removeprefix("./")).read_text()
    # The image's entrypoint substitutes only variables that are set: nginx's own stay.
    rendered = text.replace("${NGINX_LOCAL_RESOLVERS}", "10.89.0.1 ")
    assert "${" not in rendered
    assert "resolver 10.89.0.1  valid=" in rendered
    assert "proxy_set_header Host $http_host;" in rendered
