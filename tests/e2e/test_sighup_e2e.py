"""SIGHUP (a closed terminal, `kill -HUP`) drains like SIGTERM: the running reply finishes, the
process says so in its log and exits 0. It does not reload the configuration."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.daemon import running
from tests.e2e.test_api_e2e import client, settings
from tests.e2e.test_shutdown_e2e import read_stream
from tests.fakes.llm import FakeLLM, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def test_sighup_drains_and_exits_0(tmp_path: Path) -> None:
    async with FakeLLM() as llm:
        words = "one two three four"
        llm.script(Reply(text=words, chunks=4, chunk_delay=0.2), Reply(text="nothing to save"))
        async with running(tmp_path / "s", **settings(llm)) as daemon:
            async with client(daemon, "hup") as sdk:
                stream = await sdk.chat.completions.create(
                    model="herald", messages=[{"role": "user", "content": "count"}], stream=True
                )
                pieces: list[str] = []
                await read_stream(stream, pieces, lambda: daemon.signal(signal.SIGHUP))
            assert "".join(pieces) == words
            assert await daemon.wait() == 0
    output = daemon.output()
    assert "SIGHUP received: draining and stopping (SIGHUP does not reload)" in output
    assert "stopped" in output.splitlines()[-1]
