"""A lean OpenAI-compatible fake LLM for benchmarks, on aiohttp, with a configurable latency.

It answers every chat completion (streamed or not) with a short text after `--latency`
seconds and records, per request, when it arrived and when its answer was complete, on the
machine-wide monotonic clock (`time.monotonic()` is CLOCK_MONOTONIC: comparable across
processes). A request is named by the `[bench:<id>]` tag in its last user message.

`python -m bench.fake_llm --port 8700 --latency 0` serves until SIGTERM / SIGINT;
`GET /bench/timings` returns and forgets the timings recorded so far.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import time
from typing import Any

from aiohttp import web

_TAG = re.compile(r"\[bench:([^\]]+)\]")
ANSWER = "Noted. Here is a short answer from the benchmark model."


class FakeLLM:
    """The server's state: the latency and the timings recorded since the last read."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.timings: dict[str, tuple[float, float]] = {}
        self.requests = 0

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/bench/timings", self.read_timings)
        app.router.add_post("/bench/latency", self.set_latency)
        return app

    async def models(self, request: web.Request) -> web.Response:
        """The one model."""
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def read_timings(self, request: web.Request) -> web.Response:
        """Return and forget the timings: `{id: [arrived, answered]}`."""
        timings, self.timings = self.timings, {}
        return web.json_response({"requests": self.requests, "timings": timings})

    async def set_latency(self, request: web.Request) -> web.Response:
        """Change the latency: body `{"latency": seconds}`."""
        self.latency = float((await request.json())["latency"])
        return web.json_response({"latency": self.latency})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """Answer after the latency; streamed as SSE when the request asks for it."""
        arrived = time.monotonic()
        self.requests += 1
        body: dict[str, Any] = await request.json()
        tag = _tag(body)
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        usage = {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62}
        if not body.get("stream"):
            response = web.json_response(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "bench"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": ANSWER},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
            )
            if tag:
                self.timings[tag] = (arrived, time.monotonic())
            return response
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0}
        base["model"] = body.get("model", "bench")
        events = [
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ANSWER}}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {**base, "choices": [], "usage": usage},
        ]
        payload = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        await stream.write(payload + b"data: [DONE]\n\n")
        await stream.write_eof()
        if tag:
            self.timings[tag] = (arrived, time.monotonic())
        return stream


def _tag(body: dict[str, Any]) -> str | None:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            match = _TAG.search(str(message.get("content") or ""))
            return match.group(1) if match else None
    return None


async def serve(port: int, latency: float) -> None:
    """Serve on 127.0.0.1:`port` until SIGTERM / SIGINT."""
    runner = web.AppRunner(FakeLLM(latency).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    print(f"fake LLM serving http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    """`python -m bench.fake_llm --port P --latency S`."""
    parser = argparse.ArgumentParser(prog="python -m bench.fake_llm", description=__doc__)
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.latency))


if __name__ == "__main__":
    main()
