"""Two daemons with different state directories on one PostgreSQL share only the database
and the blob store: a file received by one is viewed and sent back by a turn on the other,
after the first one stopped and its state directory was deleted; the second one's cache is
deleted between turns too. Once with `files.store: database`, once with `s3` (moto)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.store.blobs import BlobRecords
from tests.conftest import PgServer
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.s3 import MotoS3
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import Herald, running_daemon
from tests.integration.telegram_rig import ANN, BOB, BOT_USERNAME, TOKEN

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

NOTES = b"Ann's shopping list: bread, apples, 4711 eau de cologne\n"


def tool_outputs(body: dict[str, Any]) -> list[str]:
    """The tool results of a chat-completions request, in order."""
    return [str(m["content"]) for m in body["messages"] if m.get("role") == "tool"]


def section(tg: FakeTelegramServer) -> dict[str, Any]:
    return {
        "token": TOKEN,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": [str(ANN), str(BOB)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
    }


@contextlib.asynccontextmanager
async def instance(
    tmp: Path, name: str, tg: FakeTelegramServer, llm: FakeLLM, *, url: str, files: dict[str, Any]
) -> Any:
    extra = {
        "database_url": url,
        "instance_id": name,
        "cluster": {"lease_ttl": 3, "heartbeat_interval": 0.5, "scan_interval": 0.2},
        "files": files,
    }
    async with running_daemon(tmp / name, llm, "telegram", section(tg), extra=extra) as herald:
        yield herald


async def polling(herald: Herald) -> None:
    """Wait until `herald` holds the Telegram poller's lease."""
    lease = herald.supervisor.receiver_leases[("telegram", "default")]
    await herald.until(lease.held, timeout=30)


@pytest.mark.parametrize("store", ["database", "s3"])
async def test_a_file_received_on_one_instance_is_viewed_and_sent_on_the_other(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: PgServer = request.getfixturevalue("pg_server")
    database: str = request.getfixturevalue("pg_database")
    server.copy_database(database, request.getfixturevalue("pg_template"))  # migrated
    url = server.url(database)
    files: dict[str, Any] = {"store": store}
    if store == "s3":
        moto: MotoS3 = request.getfixturevalue("moto_s3")
        bucket = await moto.new_bucket()
        files["s3"] = moto.config(bucket, prefix="team/").model_dump(mode="json")
        for secret in ("access_key_id", "secret_access_key"):
            files["s3"][secret] = getattr(moto.config(bucket), secret).get_secret_value()
    async with (
        FakeTelegramServer(TOKEN, bot_username=BOT_USERNAME) as tg,
        FakeLLM() as llm,
    ):
        first = contextlib.AsyncExitStack()
        a = await first.enter_async_context(instance(tmp_path, "a", tg, llm, url=url, files=files))
        await polling(a)
        async with instance(tmp_path, "b", tg, llm, url=url, files=files) as b:
            llm.script(Reply(text="noted"))
            doc = tg.add_file(NOTES, file_name="list.txt", mime_type="text/plain")
            tg.inject_message(ANN, "keep my list", sender_id=ANN, document=doc)
            await tg.wait_for_sent(lambda s: s.chat_id == ANN and "noted" in s.plain_text, 30)

            # A stops and its state directory goes: the file lives on in the store.
            await first.aclose()
            await asyncio.to_thread(shutil.rmtree, tmp_path / "a")
            await polling(b)
            llm.script(
                Reply(
                    tool_calls=[
                        ("view_attachment", {"file": "list.txt"}),
                        ("send_file", {"path": "list.txt", "caption": "your list"}),
                    ]
                ),
                Reply(text="here it is"),
            )
            tg.inject_message(ANN, "send me my list back", sender_id=ANN)
            [sent] = await tg.wait_for_sent(
                lambda s: s.chat_id == ANN and s.upload is not None, timeout=30
            )
            assert sent.upload is not None
            assert sent.upload.content == NOTES
            requests = await llm.wait_for_requests(3, timeout=30)
            viewed, queued = tool_outputs(requests[2])
            assert NOTES.decode().strip() in viewed
            assert "will be sent" in queued

            # B's cache goes too: the next turn still reads the file.
            await asyncio.to_thread(shutil.rmtree, tmp_path / "b" / "state" / "cache")
            llm.script(
                Reply(tool_calls=[("view_attachment", {"file": "list.txt"})]),
                Reply(text="still there"),
            )
            tg.inject_message(ANN, "read it again", sender_id=ANN)
            requests = await llm.wait_for_requests(5, timeout=30)
            assert NOTES.decode().strip() in tool_outputs(requests[4])[0]
            await tg.wait_for_sent(lambda s: s.chat_id == ANN and "still there" in s.plain_text, 30)

            key = hashlib.sha256(NOTES).hexdigest()
            row = await BlobRecords(b.store).get(key)
            assert row is not None
            assert row.store == store
            if store == "s3":
                assert f"team/{key}" in await moto.objects(bucket)
