"""Each way the bucket fails (unreachable, wrong credentials, no such bucket) is a clear error
on every path that uses it; in a running daemon a received file becomes a note, `send_file`
an error the model reads, and the turn is answered and the daemon stays ready."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.blobs import Blobs, DatabaseBlobs
from gateway.contracts.errors import FileStoreUnavailable
from gateway.contracts.messages import Attachment
from gateway.media import StoredFiles
from gateway.s3 import S3Blobs
from gateway.store import Store
from gateway.store.blobs import BlobRecords
from gateway.store.inbox import Inbox
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.platform import inbound
from tests.fakes.s3 import MotoS3, moto_server
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import running_daemon
from tests.integration.telegram_rig import ANN, BOT_USERNAME, TOKEN

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def moto_auth() -> Iterator[MotoS3]:
    """A moto server that checks credentials: it knows no key, so every request is refused."""
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as server:
        yield server


@pytest.fixture
async def store(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Store]:
    shutil.copyfile(sqlite_template, tmp_path / "herald.db")
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}") as opened:
        yield opened


@pytest.mark.parametrize(
    ("failure", "says"),
    [
        ("unreachable", "cannot reach http://127.0.0.1:"),
        ("credentials", "S3 refused the access key; fix files.s3.access_key_id"),
        ("bucket", "the bucket 'herald-missing' does not exist; create it or fix files.s3.bucket"),
    ],
)
async def test_each_way_the_bucket_fails_is_a_clear_error(
    failure: str, says: str, tmp_path: Path, store: Store, request: pytest.FixtureRequest
) -> None:
    if failure == "unreachable":
        config = MotoS3(f"http://127.0.0.1:{free_port()}").config("herald-missing", timeout=2)
    elif failure == "credentials":
        config = request.getfixturevalue("moto_auth").config("herald-missing")
    else:
        config = request.getfixturevalue("moto_s3").config("herald-missing")
    records = BlobRecords(store)
    async with S3Blobs(config) as bucket:
        with pytest.raises(FileStoreUnavailable):
            await bucket.check()
        blobs = Blobs(records, bucket, tmp_path / "cache", max_bytes=10_000)
        files = StoredFiles(Inbox(store), blobs)
        with pytest.raises(FileStoreUnavailable, match=says.replace("(", r"\(")):
            await blobs.put_bytes(b"report", "text/plain", tmp_path)
        download = tmp_path / "dl" / "1-0-report.txt"
        download.parent.mkdir()
        download.write_bytes(b"report")
        message = replace(
            inbound("here"), attachments=(Attachment(download, "text/plain", 6, "report.txt"),)
        )
        kept = await files.keep_received(message)
        assert kept.attachments == ()
        assert "[file report.txt unavailable: the file store failed" in kept.text
        assert says in kept.text
        assert "ask the person to send it again" in kept.text
        # A file kept earlier in the database stays readable while the bucket fails.
        database = Blobs(records, DatabaseBlobs(records), tmp_path / "cache", max_bytes=10_000)
        key, _ = await database.put_bytes(b"older", "text/plain", tmp_path)
        both = Blobs(
            records, bucket, tmp_path / "cache2", max_bytes=10_000, others=[database.backend]
        )
        assert (await both.local(key)).read_bytes() == b"older"


def tool_outputs(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m.get("role") == "tool"]


async def test_a_daemon_whose_bucket_is_missing_answers_and_stays_ready(
    tmp_path: Path, moto_s3: MotoS3
) -> None:
    s3 = moto_s3.config("herald-missing").model_dump(mode="json")
    for secret in ("access_key_id", "secret_access_key"):
        s3[secret] = getattr(moto_s3.config("herald-missing"), secret).get_secret_value()
    async with (
        FakeTelegramServer(TOKEN, bot_username=BOT_USERNAME) as tg,
        FakeLLM() as llm,
    ):
        section = {
            "token": TOKEN,
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "allowed_users": [str(ANN)],
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
        }
        extra = {"files": {"store": "s3", "s3": s3}}
        async with running_daemon(tmp_path / "s3", llm, "telegram", section, extra=extra) as h:
            llm.script(
                Reply(tool_calls=[("send_file", {"content": "a,b\n", "filename": "t.csv"})]),
                Reply(text="the store is down, sorry"),
            )
            doc = tg.add_file(b"my notes", file_name="notes.txt", mime_type="text/plain")
            tg.inject_message(ANN, "keep this", sender_id=ANN, document=doc)
            requests = await llm.wait_for_requests(2, timeout=30)
            assert "[file notes.txt unavailable: the file store failed" in str(
                requests[0]["messages"]
            )
            [refused] = tool_outputs(requests[1])
            assert "the file cannot be stored right now" in refused
            assert "herald-missing" in refused
            await tg.wait_for_sent(lambda s: s.chat_id == ANN and "sorry" in s.plain_text, 30)
            assert await h.ready() == 200
