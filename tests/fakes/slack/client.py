"""Driving a fake Slack in another process, and serving one standalone (`main`)."""

from __future__ import annotations

import argparse
import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tests.fakes import standalone
from tests.fakes.control import (
    ControlClient,
)
from tests.fakes.slack.records import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    DEFAULT_SIGNING_SECRET,
    JSON,
    MAX_WAIT,
    Injected,
)
from tests.fakes.slack.server import FakeSlackServer
from tests.fakes.standalone import until_signalled


class SlackServerClient(ControlClient):
    """Drives a `FakeSlackServer` in another process through its `/control/*` routes.

    `async with SlackServerClient("http://127.0.0.1:8102") as slack:`; every method raises
    `httpx.HTTPStatusError` when the server refuses the request.
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        super().__init__(url, timeout=timeout, max_wait=MAX_WAIT)

    @property
    def base_url(self) -> str:
        """`AsyncWebClient(base_url=...)` for this server."""
        return f"{self.url}/api/"

    async def inject(self, kind: str = "message", **fields: Any) -> Injected:
        """Like the server's `inject_<kind>` methods: `inject("message", channel="D1", ...)`.

        Kinds: message, app_mention, edit, delete, bot_message, own_message, event; `files`
        are file ids of `add_file`.
        """
        return (await self.inject_many([{"kind": kind, **fields}]))[0]

    async def inject_message(self, channel: str, text: str = "", **fields: Any) -> Injected:
        """Like `FakeSlackServer.inject_message`."""
        return await self.inject("message", channel=channel, text=text, **fields)

    async def inject_many(self, specs: Iterable[Mapping[str, Any]]) -> list[Injected]:
        """Inject several in order (all or none, if the specs are invalid)."""
        body = await self._call("POST", "/control/inject", [dict(s) for s in specs])
        return [
            Injected(m["event_id"], m["ts"], m["channel"], tuple(m["event_ids"]))
            for m in body["injected"]
        ]

    async def add_file(
        self, content: bytes, name: str = "file.bin", mimetype: str = "application/octet-stream"
    ) -> JSON:
        """Like `FakeSlackServer.add_file`; the file object."""
        spec = {"content_b64": base64.b64encode(content).decode(), "name": name}
        spec["mimetype"] = mimetype
        file: JSON = (await self._call("POST", "/control/file", spec))["file"]
        return file

    async def fault(self, fault: str, **params: Any) -> int | None:
        """Switch a fault on: `fault("rate_limit", target="chat.postMessage", retry_after=1)`.

        Names and parameters as `FakeSlackServer`'s methods, plus `clear`. Returns how many
        sockets were affected for the socket faults.
        """
        affected: int | None = (
            await self._call("POST", "/control/fault", {"fault": fault, **params})
        )["affected"]
        return affected

    async def clear_faults(self) -> None:
        """Like `FakeSlackServer.clear_faults`."""
        await self.fault("clear")

    async def use_events_api(self, url: str | None) -> None:
        """Like `FakeSlackServer.use_events_api`."""
        await self._call("POST", "/control/mode", {"events_url": url})

    async def wait(
        self,
        timeout: float = 10.0,
        *,
        min_posted: int = 0,
        min_updates: int = 0,
        min_reactions: int = 0,
        min_uploads: int = 0,
        min_sockets_opened: int = 0,
        max_pending: int | None = None,
        acked: Sequence[str] = (),
        connected: bool | None = None,
    ) -> JSON:
        """Wait until every condition holds; return the state. TimeoutError after `timeout`."""
        spec = {
            "timeout": timeout,
            "min_posted": min_posted,
            "min_updates": min_updates,
            "min_reactions": min_reactions,
            "min_uploads": min_uploads,
            "min_sockets_opened": min_sockets_opened,
            "max_pending": max_pending,
            "acked": list(acked),
            "connected": connected,
        }
        return await self._wait(spec, lambda error: f"slack server: {error} for {spec}")


async def _main(args: argparse.Namespace) -> None:
    server = FakeSlackServer(
        args.bot_token,
        args.app_token,
        signing_secret=args.signing_secret,
        ack_timeout=args.ack_timeout,
        port=args.port,
        ws_port=args.ws_port,
        log_level="warning",
    )
    async with server:
        print(f"slack server serving {server.url}", flush=True)
        await until_signalled()


def main(argv: list[str] | None = None) -> None:
    """Serve on `--port` (0: any free port, printed) until SIGINT or SIGTERM."""
    parser = standalone.parser(
        "tests.fakes.slack",
        __doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8102)
    parser.add_argument("--ws-port", type=int, default=0, help="Socket Mode (0: any free port)")
    parser.add_argument("--bot-token", default=DEFAULT_BOT_TOKEN)
    parser.add_argument("--app-token", default=DEFAULT_APP_TOKEN)
    parser.add_argument("--signing-secret", default=DEFAULT_SIGNING_SECRET)
    parser.add_argument("--ack-timeout", type=float, default=DEFAULT_ACK_TIMEOUT)
    args = parser.parse_args(argv)
    standalone.run(_main(args))
