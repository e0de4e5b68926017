"""`herald run` without `api.key` serves only its own machine: a page whose DNS name rebinds to
127.0.0.1 (its `Host` and `Origin` carry the page's name), another site's page, or a proxy's
forwarded request gets 403 from the API before anything runs or is read."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.store import Store
from tests.e2e.daemon import running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
REBINDING = "rebind.attacker.example"


async def test_the_key_less_api_refuses_a_rebinding_page(tmp_path: Path) -> None:
    async with running(tmp_path / "s") as daemon:
        port = daemon.port
        recall = {"user": "cli-root", "messages": [{"role": "user", "content": "RECALL"}]}
        page = {"host": f"{REBINDING}:{port}", "origin": f"http://{REBINDING}:{port}"}
        elsewhere = [
            page,
            {"host": f"{REBINDING}:{port}"},
            {"origin": f"http://{REBINDING}:{port}"},
            {"origin": "http://localhost:3000"},
            {"origin": "null"},
            {"x-forwarded-for": "203.0.113.9"},
        ]
        async with httpx.AsyncClient(base_url=daemon.url, timeout=10, trust_env=False) as http:
            for headers in elsewhere:
                asked = await http.post("/v1/chat/completions", json=recall, headers=headers)
                assert asked.status_code == 403, (headers, asked.text)
                message = asked.json()["error"]["message"]
                assert "api.key" in message
                assert f"127.0.0.1:{port}" in message
                for path in ("/v1/models", "/api/jobs", "/metrics"):
                    assert (await http.get(path, headers=headers)).status_code == 403, path
            # Nothing ran, nothing was stored.
            async with Store.open(daemon.database_url, migrate=False) as store:
                assert await store.get_session("api:default:cli-root") is None
            # /health stays open to all; this machine, by its own name, is served.
            assert (await http.get("/health", headers=page)).status_code == 200
            for name in ("127.0.0.1", "localhost"):
                ok = await http.post(
                    "/v1/chat/completions", json=recall, headers={"host": f"{name}:{port}"}
                )
                assert ok.status_code == 200, ok.text
        assert await daemon.stop() == 0
