"""Tools of real MCP servers (FastMCP over stdio and streamable HTTP) called through the
scripted model's tool calls, in Herald's message path."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent_core.mcp.config import MCPServerConfig
from agent_core.mcp.server import MCPServer
from agent_core.mcp.status import ServerState
from gateway.store import Store
from tests.fakes.platform import inbound
from tests.integration.mcp_rig import SERVER_SCRIPT, mcp_rig, stdio_server, until
from tests.unit.agent.fakes import ScriptedProvider, answer, call, use_tools

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite only: the store's part (approval rows) has its own tests on both backends."""
    return f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}"


async def test_tools_are_offered_called_and_their_failures_reach_the_model(
    store: Store, tmp_path: Path
) -> None:
    llm = ScriptedProvider(
        use_tools(
            call("c1", "t__echo", {"text": "hi"}),
            call("c2", "t__boom"),
            call("c3", "t__hang"),
            call("c4", "t__big", {"n": 500}),
            call("c5", "t__nope"),
        ),
        answer("all done"),
    )
    servers = {"t": stdio_server(timeout=1, max_result_chars=100)}
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("use the tools", chat="c1"))
        assert "all done" in await rig.said("c1", "all done")

    offered = llm.calls[0].tool_names
    assert {"t__echo", "t__add", "t__boom", "t__hang", "t__grow"} <= set(offered)
    echo, boom, hang, big, nope = rig.tool_results()
    assert echo == "echo: hi"
    assert boom.startswith("error: ")
    assert "the boom tool exploded" in boom
    assert "did not answer within 1s" in hang
    assert big.startswith("x" * 100)
    assert "cut: the result had 500 characters" in big
    assert nope == "error: there is no tool named 't__nope'"


async def test_a_server_that_crashes_mid_call_is_restarted(store: Store, tmp_path: Path) -> None:
    llm = ScriptedProvider(
        use_tools(call("c1", "t__pid")),
        use_tools(call("c2", "t__crash")),
        answer("crashed"),
    )
    async with mcp_rig(store, tmp_path, llm, {"t": stdio_server()}) as rig:
        await rig.manager.accept(inbound("crash it", chat="c1"))
        await rig.said("c1", "crashed")
        first_pid, crash = rig.tool_results()
        assert "stopped during the call" in crash
        server = await rig.wait_ready()
        assert server.restarts >= 1
        assert server.status().state is ServerState.READY
        llm.add(use_tools(call("c3", "t__pid")), answer("back"))
        await rig.manager.accept(inbound("again", chat="c1"))
        await rig.said("c1", "back")
        assert rig.tool_results()[-1] != first_pid


async def test_a_server_that_is_down_reports_its_tools_unavailable(
    store: Store, tmp_path: Path
) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "t__crash")), answer("one"))
    servers = {"t": stdio_server()}
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        server = rig.server()
        server.restart_initial = 30.0  # stays down for the rest of the test
        await rig.manager.accept(inbound("crash", chat="c1"))
        await rig.said("c1", "one")
        await until(lambda: server.state is ServerState.RESTARTING)
        llm.add(use_tools(call("c2", "t__echo", {"text": "x"})), answer("two"))
        await rig.manager.accept(inbound("echo", chat="c1"))
        await rig.said("c1", "two")
    assert "is unavailable right now: restarting" in rig.tool_results()[-1]
    echo = next(t for t in llm.calls[-1].tools if t["function"]["name"] == "t__echo")
    assert "unavailable right now" in echo["function"]["description"]


async def test_the_tool_list_is_read_again_when_the_server_says_it_changed(
    store: Store, tmp_path: Path
) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "t__grow")), answer("grown"))
    async with mcp_rig(store, tmp_path, llm, {"t": stdio_server()}) as rig:
        await rig.manager.accept(inbound("grow", chat="c1"))
        await rig.said("c1", "grown")
        server = rig.server()
        await until(lambda: any(t.name == "extra" for t in server.tools))
        llm.add(use_tools(call("c2", "t__extra", {"word": "new"})), answer("used"))
        await rig.manager.accept(inbound("use it", chat="c1"))
        await rig.said("c1", "used")
    assert "t__extra" not in llm.calls[0].tool_names
    assert "t__extra" in llm.calls[-1].tool_names
    assert rig.tool_results()[-1] == "extra: new"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def http_server() -> Iterator[str]:
    """The fake server over streamable HTTP on 127.0.0.1; its endpoint URL."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-P", SERVER_SCRIPT, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        for _ in range(500):
            try:
                httpx.get(url, timeout=0.5, trust_env=False)
                break
            except httpx.TransportError:
                if process.poll() is not None:
                    raise RuntimeError("the MCP HTTP server did not start") from None
                time.sleep(0.02)
        yield url
    finally:
        process.terminate()
        process.wait(10)


async def test_a_remote_server_over_streamable_http_with_include_and_exclude(
    store: Store, tmp_path: Path, http_server: str
) -> None:
    llm = ScriptedProvider(
        use_tools(call("c1", "web__echo", {"text": "over http"})),
        answer("remote done"),
    )
    servers = {
        "remote": {
            "url": http_server,
            "headers": {"Authorization": "Bearer not-checked"},
            "prefix": "web",
            "include": ["echo", "ad*", "pid"],
            "exclude": ["pid"],
        }
    }
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("remote", chat="c1"))
        await rig.said("c1", "remote done")
        status = rig.hub.status()["remote"]
    assert sorted(n for n in llm.calls[0].tool_names if n.startswith("web__")) == [
        "web__add",
        "web__echo",
    ]
    assert rig.tool_results() == ["echo: over http"]
    assert (status.transport, status.state, status.tools) == ("http", ServerState.READY, 2)


async def test_allowlists_decide_who_is_offered_the_tools(store: Store, tmp_path: Path) -> None:
    llm = ScriptedProvider(
        answer("alice"),
        answer("bob"),
        use_tools(call("c1", "open__echo", {"text": "b"})),
        answer("bob again"),
    )
    servers = {
        "private": stdio_server(users=["test:alice"], include=["echo"]),
        "elsewhere": stdio_server(platforms=["telegram"], include=["echo"]),
        "open": stdio_server(platforms=["test"], include=["echo"]),
    }
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("hi", chat="alice"))
        await rig.said("alice", "alice")
        await rig.manager.accept(inbound("hi", chat="bob"))
        await rig.said("bob", "bob")
        await rig.manager.accept(inbound("call", chat="bob"))
        await rig.said("bob", "bob again")
    alice, bob = llm.calls[0].tool_names, llm.calls[1].tool_names
    assert {"private__echo", "open__echo"} <= set(alice)
    assert "private__echo" not in bob
    assert "open__echo" in bob
    assert not any(n.startswith("elsewhere__") for n in alice + bob)
    assert rig.tool_results() == ["echo: b"]


async def test_a_forbidden_tool_named_anyway_does_not_run(store: Store, tmp_path: Path) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "private__echo", {"text": "x"})), answer("no"))
    servers = {"private": stdio_server(users=["test:alice"])}
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("sneak", chat="bob"))
        await rig.said("bob", "no")
    assert rig.tool_results() == ["error: there is no tool named 'private__echo'"]
    await asyncio.sleep(0)


@pytest.mark.parametrize("command", ["no-such-mcp-server-on-path", "bin/no-such-mcp-server"])
async def test_a_command_that_does_not_exist_is_named_in_the_error(
    command: str, tmp_path: Path
) -> None:
    config = MCPServerConfig.model_validate({"command": command, "cwd": str(tmp_path)})
    server = MCPServer("gone", config, restart_initial=0.01, restart_max=0.01)
    status = await server.check(10)
    assert status.state is not ServerState.READY
    assert status.error is not None
    assert status.error.startswith(f"command not found: {command} (no such executable")
