"""The console shows no configured secret: a dead letter's error and a transcript quoting one
are shown with `***` (in-process through httpx's ASGI transport)."""

from __future__ import annotations

import pytest

from gateway.contracts.history import ChatMessage, Role, TurnResult
from gateway.redact import Redactor
from gateway.sessions import SessionManager
from gateway.store import Store
from gateway.store.outbox import Outbox
from tests.fakes.platform import inbound
from tests.integration.test_console import _no_snapshot, dead_letter, make_rig, manager
from tests.turns import finish_turn, start_turn

pytestmark = pytest.mark.timeout(60)

SECRET = "xoxb-console-secret-token-0123456789"

__all__ = ["manager"]  # the fixture


async def test_pages_show_no_configured_secret(store: Store, manager: SessionManager) -> None:
    rig = make_rig(store, manager, {}, redactor=Redactor([SECRET]))
    row_id = await dead_letter(store, f"the token is {SECRET}")
    await Outbox(store).dead(row_id, f"401 for https://chat.example/api?auth={SECRET}")
    message = inbound(f"my token is {SECRET}", name="Ann")
    session = await store.open_session(
        message.session_key, platform="test", user_id=None, snapshot=_no_snapshot
    )
    turn, _ = await start_turn(store, session.id, ChatMessage(Role.USER, message.text))
    answer = (ChatMessage(Role.ASSISTANT, f"You said: {SECRET}"),)
    await finish_turn(store, session.id, turn, TurnResult("completed", answer))

    async with rig.client() as http:
        pages = [
            await http.get("/console/deliveries", params={"status": "dead"}),
            await http.get("/console/sessions/view", params={"key": str(message.session_key)}),
        ]
    for page in pages:
        assert page.status_code == 200, page.text
        assert SECRET not in page.text
        assert "***" in page.text
