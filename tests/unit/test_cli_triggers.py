"""`herald triggers …`: add and rm edit the config file (secret in a file of its own), list
and show read it, test sends a signed sample to a server that verifies it as Herald does."""

from __future__ import annotations

import re

import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.config import load_config
from gateway.contracts.messages import utcnow
from gateway.triggers.verify import Unverified, verify
from tests.fakes.serving import LocalServer
from tests.unit.cli_harness import Herald

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_environment")]


async def test_add_list_show_test_rm(herald: Herald) -> None:
    herald.configure(home={"targets": ["telegram:1"]})
    added = await herald.invoke(
        "triggers",
        "add",
        "gh",
        "--prompt",
        "Review {{ payload.pull_request.title }}",
        "--event",
        "pull_request",
        "--field",
        "action=opened",
    )
    assert added.exit_code == 0, added.output
    secret = re.search(r"secret: ([0-9a-f]{64})", added.output)
    assert secret is not None, added.output
    written = yaml.safe_load(herald.path.read_text(encoding="utf-8"))
    assert "secret" not in written["triggers"]["gh"]  # kept in its own file
    cfg = load_config(herald.path)
    gh = cfg.triggers["gh"]
    assert gh.secret.get_secret_value() == secret.group(1)
    assert gh.filter.headers == {"x-github-event": ("pull_request",)}
    assert gh.filter.fields == {"action": ("opened",)}

    again = await herald.invoke("triggers", "add", "gh", "--prompt", "x")
    assert again.exit_code == 1
    bad = await herald.invoke("triggers", "add", "x", "--prompt", "{{ a.b() }}")
    assert bad.exit_code == 2
    assert "not allowed" in bad.output

    listed = await herald.invoke("triggers", "list")
    assert listed.exit_code == 0, listed.output
    assert "/hooks/gh" in listed.output
    shown = await herald.invoke("triggers", "show", "gh")
    assert shown.exit_code == 0, shown.output
    assert secret.group(1) not in shown.output

    seen: list[int] = []

    async def hook(request: Request) -> JSONResponse:
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            verify(gh, headers, body, utcnow())
        except Unverified as err:
            return JSONResponse({"error": str(err)}, status_code=401)
        seen.append(len(body))
        return JSONResponse({"status": "queued"}, status_code=202)

    server = LocalServer(Starlette(routes=[Route("/hooks/gh", hook, methods=["POST"])]))
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        tested = await herald.invoke("triggers", "test", "gh", "--url", url)
    finally:
        await server.stop()
    assert tested.exit_code == 0, tested.output
    assert tested.output.startswith("202")
    assert len(seen) == 1

    removed = await herald.invoke("triggers", "rm", "gh")
    assert removed.exit_code == 0, removed.output
    assert load_config(herald.path).triggers == {}
