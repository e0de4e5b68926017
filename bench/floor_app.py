"""The floor of the API scenario: the same HTTP stack and model client, and nothing else.

One FastAPI route on uvicorn (uvloop, httptools: what `herald run` uses) that parses the
request, asks the fake LLM through Herald's own `OpenAIProvider`, and answers in the OpenAI
shape with the same `Server-Timing` header. No store, no sessions, no lanes. Whatever this
process cannot sustain on a machine, no gateway built on these libraries can; the API scenario
offers it the same load as Herald so the two can be read side by side.

`python -m bench.floor_app --port 8701 --llm http://127.0.0.1:8700/v1`
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from agent_core.config import LLMConfig
from agent_core.llm import OpenAIProvider
from gateway.cli.main import loop_factory
from gateway.contracts.history import ChatMessage, Role


def build(provider: OpenAIProvider) -> FastAPI:
    """The one-route application."""
    app = FastAPI()

    @app.get("/ready")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        arrived = time.perf_counter()
        body: dict[str, Any] = await request.json()
        messages = [ChatMessage(Role(m["role"]), str(m["content"])) for m in body["messages"]]
        asked = time.perf_counter()
        answer = await provider.complete(messages)
        llm = time.perf_counter() - asked
        own = time.perf_counter() - arrived - llm
        return JSONResponse(
            {
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": answer.content},
                        "finish_reason": "stop",
                    }
                ],
            },
            headers={"Server-Timing": f"herald;dur={own * 1000:.3f}, llm;dur={llm * 1000:.3f}"},
        )

    return app


async def serve(port: int, llm_url: str) -> None:
    """Serve on 127.0.0.1:`port` until SIGTERM / SIGINT."""
    provider = OpenAIProvider(
        LLMConfig(base_url=llm_url, api_key=SecretStr("sk-bench"), max_retries=0)
    )
    try:
        config = uvicorn.Config(
            build(provider), host="127.0.0.1", port=port, log_level="warning", access_log=False
        )
        await uvicorn.Server(config).serve()
    finally:
        await provider.aclose()


def main() -> None:
    """Parse the command line and serve."""
    parser = argparse.ArgumentParser(prog="python -m bench.floor_app", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--llm", required=True)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(args.port, args.llm))


if __name__ == "__main__":
    main()
