"""Signed media links (what Twilio fetches files by), pruning old files, and where files may
be sent (the platform's file limit; other targets only through the resolver)."""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pytest

from agent_core.media import Destination
from agent_core.tools.base import ToolContext, ToolError
from gateway.channels import Channels
from gateway.contracts.history import SessionInfo
from gateway.contracts.ids import SessionId, SessionKey
from gateway.contracts.messages import Attachment, SendLimits
from gateway.media import ChatFileTargets, MediaLinks, prune_files
from gateway.store import Store

BLOB = "ab" * 32


def staged(name: str = "report final.pdf", blob: str | None = BLOB) -> Attachment:
    return Attachment(Path("/anywhere") / name, "application/pdf", 4, name, blob=blob)


def parts(url: str, base: str) -> tuple[str, str, str]:
    expires, signature, path = url.removeprefix(f"{base}/files/").split("/", 2)
    return expires, signature, unquote(path)


async def test_a_link_names_its_blob_until_it_expires_on_every_instance(
    tmp_path: Path, sqlite_template: Path
) -> None:
    legacy = tmp_path / "media-links.key"
    legacy.write_text("11" * 32)
    shutil.copyfile(sqlite_template, tmp_path / "herald.db")
    url_db = f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}"
    async with Store.open(url_db) as store:
        links = await MediaLinks.open(store, 60, legacy)
        url = links.link(staged(), "https://herald.example.com/")
        assert url.startswith("https://herald.example.com/files/")
        expires, signature, relative = parts(url, "https://herald.example.com")
        checked = links.check(expires, signature, relative)
        assert (checked.blob, checked.name) == (BLOB, "report final.pdf")
        assert links.check(expires, signature, relative, now=time.time() + 120).status == 410
        # Another instance (no key file of its own) reads the same key from the database:
        # the older install's key, so the links it signed stay valid.
        other = await MediaLinks.open(store, 60, tmp_path / "elsewhere" / "none.key")
        assert other.check(expires, signature, relative).blob == BLOB
        assert links._key == bytes.fromhex("11" * 32)


def test_forged_links_are_refused() -> None:
    links = MediaLinks(b"k" * 32, ttl=60)
    expires, signature, relative = parts(links.link(staged(), "http://h"), "http://h")
    forged = signature[:-1] + ("B" if signature.endswith("A") else "A")
    assert links.check(expires, forged, relative).status == 403
    assert links.check(str(int(expires) + 999), signature, relative).status == 403
    assert links.check(expires, signature, f"{'cd' * 32}/report final.pdf").status == 403
    assert links.check("soon", signature, relative).status == 403
    other = MediaLinks(b"o" * 32, ttl=60)
    assert other.check(expires, signature, relative).status == 403


def test_only_files_in_the_blob_store_can_be_linked() -> None:
    links = MediaLinks(b"k" * 32, ttl=60)
    with pytest.raises(ValueError, match="only files in the blob store"):
        links.link(staged(blob=None), "http://h")
    with pytest.raises(ValueError, match="only files in the blob store"):
        links.link(staged(blob="../../etc/passwd"), "http://h")
    url = links.link(staged("../../x/../secret.txt"), "http://h")
    assert url.endswith(f"/{BLOB}/secret.txt")


def test_prune_deletes_old_files_and_empty_folders(tmp_path: Path) -> None:
    old = tmp_path / "telegram" / "default" / "42" / "1-0-photo.jpg"
    new = tmp_path / "telegram" / "default" / "43" / "2-0-photo.jpg"
    for path in (old, new):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
    month_ago = time.time() - 31 * 86400
    os.utime(old, (month_ago, month_ago))
    assert prune_files(tmp_path, 30 * 86400) == 1
    assert not old.parent.exists()
    assert new.exists()
    assert prune_files(tmp_path / "missing", 1) == 0


def ctx(key: str) -> ToolContext:
    now = datetime.now(UTC)
    info = SessionInfo(
        SessionId(1), SessionKey(key), 0, key.split(":", 1)[0], None, None, "", "", now, now, 0
    )
    return ToolContext(session=info, user_id=None)


async def test_file_targets_follow_the_platforms_limits() -> None:
    channels = Channels()
    channels.register("telegram", "default", SendLimits(max_file_bytes=50), lambda: None)
    channels.register("sms", "main", SendLimits(), lambda: None)

    async def resolve(target: str, _: ToolContext) -> Destination:
        return Destination("telegram", "default", target)

    targets = ChatFileTargets(channels, resolve)
    assert targets.max_bytes_here(ctx("telegram:default:42")) == 50
    assert (await targets.resolve("77", ctx("telegram:default:42"))).max_bytes == 50
    with pytest.raises(ToolError, match="cannot carry files"):
        targets.max_bytes_here(ctx("sms:main:+155512345"))
    with pytest.raises(ToolError, match="not allowed here"):
        await ChatFileTargets(channels).resolve("home", ctx("telegram:default:42"))
