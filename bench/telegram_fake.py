"""The fake Bot API as the benchmark serves it: the test suite's fake plus one cheap route,
`GET /control/sent_chats?since=N`, answering the chats of the messages sent after the first
`N` (and how many were sent in all).

The scenario used to poll `GET /control/state` every 20 ms; that answer holds every record
and each chat's texts, computed over every message sent (quadratic in the messages so far:
60 ms at 1000 messages, 200 ms at 2000), so the fake spent the step answering the watcher
and the bot's sends and long polls queued behind it. `python -m bench.telegram_fake`.
"""

from __future__ import annotations

import argparse

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes import standalone
from tests.fakes.standalone import until_signalled
from tests.fakes.telegram.server import FakeTelegramServer


class BenchTelegramServer(FakeTelegramServer):
    """`FakeTelegramServer` with `/control/sent_chats`; its cost is the messages it answers."""

    def _app(self) -> Starlette:
        app = super()._app()
        app.router.routes.append(Route("/control/sent_chats", self._sent_chats, methods=["GET"]))
        return app

    async def _sent_chats(self, request: Request) -> Response:
        try:
            since = int(request.query_params.get("since", "0"))
        except ValueError:
            return JSONResponse({"ok": False, "error": "since must be an integer"}, 400)
        chats = [sent.chat_id for sent in self.sent[since:]]
        return JSONResponse({"ok": True, "count": len(self.sent), "chat_ids": chats})


async def _main(port: int, token: str) -> None:
    server = BenchTelegramServer(token, port=port, log_level="warning")
    async with server:
        print(f"telegram server serving {server.url}", flush=True)
        await until_signalled()


def main(argv: list[str] | None = None) -> None:
    """Serve on `--port` until SIGINT or SIGTERM."""
    parser = standalone.parser("bench.telegram_fake", __doc__)
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument("--token", default="123:abc")
    args: argparse.Namespace = parser.parse_args(argv)
    standalone.run(_main(args.port, args.token))


if __name__ == "__main__":
    main()
