"""Driving a fake Bot API in another process, and serving one standalone (`main`)."""

from __future__ import annotations

import argparse
import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tests.fakes import standalone
from tests.fakes.control import (
    ControlClient,
)
from tests.fakes.standalone import until_signalled
from tests.fakes.telegram.records import (
    JSON,
    MAX_POLL_TIMEOUT,
    Injected,
)
from tests.fakes.telegram.server import (
    FakeTelegramServer,
)


class TelegramServerClient(ControlClient):
    """Drives a `FakeTelegramServer` in another process through its `/control/*` routes.

    `async with TelegramServerClient("http://127.0.0.1:8101") as tg:`; every method raises
    `httpx.HTTPStatusError` when the server refuses the request.
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        super().__init__(url, timeout=timeout, max_wait=MAX_POLL_TIMEOUT)

    @property
    def base_url(self) -> str:
        """`Bot(base_url=...)` for this server."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """`Bot(base_file_url=...)` for this server."""
        return f"{self.url}/file/bot"

    async def inject(
        self, chat_id: int, text: str = "", *, sender_id: int, **fields: Any
    ) -> Injected:
        """Like `FakeTelegramServer.inject_message`."""
        spec = {"chat_id": chat_id, "text": text, "sender_id": sender_id, **fields}
        return (await self.inject_many([spec]))[0]

    async def inject_many(self, specs: Iterable[Mapping[str, Any]]) -> list[Injected]:
        """Inject several messages in order (all or none, if the specs are invalid)."""
        body = await self._call("POST", "/control/inject", [dict(s) for s in specs])
        return [Injected(**made) for made in body["injected"]]

    async def inject_update(self, raw: Mapping[str, Any]) -> int:
        """Like `FakeTelegramServer.inject_update`; the update id."""
        body = await self._call("POST", "/control/inject", [{"update": dict(raw)}])
        update_id: int = body["injected"][0]["update_id"]
        return update_id

    async def add_file(self, content: bytes, **fields: str) -> str:
        """Like `FakeTelegramServer.add_file`; the file id."""
        spec = {"content_b64": base64.b64encode(content).decode(), **fields}
        file_id: str = (await self._call("POST", "/control/file", spec))["file_id"]
        return file_id

    async def fault(self, fault: str, **params: Any) -> None:
        """Switch a fault on: `fault("rate_limit", chat_id=5, count=2, retry_after=1)`.

        Names and parameters as `FakeTelegramServer`'s methods, plus `duplicate`
        (`update_id`) and `clear`.
        """
        await self._call("POST", "/control/fault", {"fault": fault, **params})

    async def duplicate(self, update_id: int) -> None:
        """Like `FakeTelegramServer.duplicate`."""
        await self.fault("duplicate", update_id=update_id)

    async def clear_faults(self) -> None:
        """Like `FakeTelegramServer.clear_faults`."""
        await self.fault("clear")

    async def wait(
        self,
        timeout: float = 10.0,
        *,
        min_sent: int = 0,
        min_edits: int = 0,
        min_actions: int = 0,
        min_polls: int = 0,
        max_pending: int | None = None,
        confirmed: Sequence[int] = (),
    ) -> JSON:
        """Wait until every condition holds; return the state. TimeoutError after `timeout`."""
        spec = {
            "timeout": timeout,
            "min_sent": min_sent,
            "min_edits": min_edits,
            "min_actions": min_actions,
            "min_polls": min_polls,
            "max_pending": max_pending,
            "confirmed": list(confirmed),
        }
        return await self._wait(spec, lambda error: f"telegram server: {error} for {spec}")


async def _main(port: int, token: str, bot_username: str) -> None:
    server = FakeTelegramServer(token, bot_username=bot_username, port=port, log_level="warning")
    async with server:
        print(f"telegram server serving {server.url}", flush=True)
        await until_signalled()


def main(argv: list[str] | None = None) -> None:
    """Serve on `--port` (0: any free port, printed) until SIGINT or SIGTERM."""
    parser = standalone.parser(
        "tests.fakes.telegram",
        __doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument("--token", default="123:abc")
    parser.add_argument("--bot-username", default="herald_bot")
    args = parser.parse_args(argv)
    standalone.run(_main(args.port, args.token, args.bot_username))
