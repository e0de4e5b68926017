"""A newcomer's first conversation against a real `herald run`: `herald chat`, its commands,
short session names, the 401 hint, `jobs run` with and without a daemon, and the README's
OpenAI SDK examples with and without `api.key`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest
import yaml

from tests.e2e.daemon import HERALD, Daemon, running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

KEY = "e2e-newcomer-key"


async def cli(config: Path, *args: str, typed: str | None = None) -> tuple[int, str]:
    """`herald <args> --config <config>`: exit code and output (stdout and stderr); `typed`
    is what a person types into it (then end of input, as Ctrl-D)."""
    process = await asyncio.create_subprocess_exec(
        str(HERALD),
        *args,
        "--config",
        str(config),
        stdin=asyncio.subprocess.DEVNULL if typed is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(config.parent), "COLUMNS": "200"},
    )
    async with asyncio.timeout(60):
        out, _ = await process.communicate(None if typed is None else typed.encode())
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_chat_commands_and_the_short_session_name(tmp_path: Path) -> None:
    async with running(tmp_path / "state") as daemon:
        config = daemon.config_path
        code, out = await cli(config, "chat", "--session", "ada", "-m", "hello there")
        assert code == 0, out
        assert "echo: hello there" in out

        # The rest typed into one terminal session, as a person would.
        typed = "/status\n/new\nafter the reset\n/status\n/help\n/mode steer\n"
        code, out = await cli(config, "chat", "--session", "ada", typed=typed)
        assert code == 0, out
        answers = out.split("herald> ")[1:]
        assert len(answers) == 6, out
        status, new, echoed, status_after, helped, mode = answers
        assert "Session api:default:ada\nConversation #1, 2 messages" in status
        assert "Started a new conversation" in new
        assert "echo: after the reset" in echoed
        assert "Conversation #2, 2 messages" in status_after
        assert "/new or /reset" in helped
        assert "/mode works in a platform chat, not over the API or in `herald chat`" in mode

        code, out = await cli(config, "sessions", "show", "ada")
        assert code == 0, out
        assert "api:default:ada conversation #2, 2 messages" in out
        assert "after the reset" in out
        assert "hello there" not in out  # the model was never sent the commands either


async def test_chat_against_a_daemon_with_a_key_hints_at_the_config(tmp_path: Path) -> None:
    async with running(tmp_path / "state", api={"key": KEY}) as daemon:
        keyless = tmp_path / "keyless.yaml"
        settings = yaml.safe_load(daemon.config_path.read_text(encoding="utf-8"))
        del settings["api"]["key"]
        keyless.write_text(yaml.safe_dump(settings), encoding="utf-8")

        code, out = await cli(keyless, "chat", "-m", "hello")
        assert code == 1
        assert "error 401" in out
        assert "--config PATH, or set HERALD_CONFIG=PATH" in out.replace("\n", " ")

        code, out = await cli(daemon.config_path, "chat", "-m", "hello")
        assert code == 0, out
        assert "echo: hello" in out


async def test_the_readme_sdk_examples_with_and_without_a_key(tmp_path: Path) -> None:
    async with running(tmp_path / "plain") as daemon:
        client = openai.AsyncOpenAI(base_url=f"{daemon.url}/v1", api_key="anything")
        reply = await client.chat.completions.create(
            model="herald",
            messages=[{"role": "user", "content": "Remind me what we decided yesterday?"}],
            user="my-laptop",
        )
        await client.close()
        assert reply.choices[0].message.content == "echo: Remind me what we decided yesterday?"
    async with running(tmp_path / "keyed", api={"key": KEY}) as daemon:
        client = openai.AsyncOpenAI(base_url=f"{daemon.url}/v1", api_key=KEY)
        reply = await client.chat.completions.create(
            model="herald",
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"X-Herald-Session-Id": "my-laptop"},
        )
        await client.close()
        assert reply.choices[0].message.content == "echo: hello"


async def test_jobs_run_says_who_runs_it(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path / "state", {"instance_id": "herald-a"})
    daemon.write_config()
    config = daemon.config_path
    code, out = await cli(config, "jobs", "add", "--schedule", "every 2h", "--prompt", "ping")
    assert code == 0, out
    job_id = out.split()[2]

    code, out = await cli(config, "jobs", "run", job_id)
    assert code == 0, out
    assert "no Herald daemon is running: it runs when `herald run` starts" in out

    async with running(tmp_path / "state", instance_id="herald-a") as live:
        code, out = await cli(live.config_path, "jobs", "run", job_id)
        assert code == 0, out
        assert "the running daemon (herald-a) takes it within seconds" in out
