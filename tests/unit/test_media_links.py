"""Signed media links (what Twilio fetches files by), pruning old files, and where files may
be sent (the platform's file limit; other targets only through the resolver)."""

from __future__ import annotations

import os
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
from gateway.contracts.messages import SendLimits
from gateway.media import ChatFileTargets, MediaLinks, prune_files


def staged(state: Path, name: str = "ab12-report final.pdf") -> Path:
    path = state / "files" / "outbox" / name
    path.parent.mkdir(parents=True)
    path.write_bytes(b"%PDF")
    return path


def parts(url: str, base: str) -> tuple[str, str, str]:
    expires, signature, path = url.removeprefix(f"{base}/files/").split("/", 2)
    return expires, signature, unquote(path)


def test_a_link_serves_its_file_until_it_expires(tmp_path: Path) -> None:
    path = staged(tmp_path)
    links = MediaLinks(tmp_path, ttl=60)
    url = links.link(path, "https://herald.example.com/")
    assert url.startswith("https://herald.example.com/files/")
    expires, signature, relative = parts(url, "https://herald.example.com")
    assert links.check(expires, signature, relative).path == path.resolve()
    assert links.check(expires, signature, relative, now=time.time() + 120).status == 410
    # Another instance on the same state directory reads the same secret.
    assert MediaLinks(tmp_path, ttl=60).check(expires, signature, relative).path is not None
    assert (tmp_path / "media-links.key").stat().st_mode & 0o777 == 0o600


def test_forged_links_are_refused(tmp_path: Path) -> None:
    path = staged(tmp_path)
    links = MediaLinks(tmp_path, ttl=60)
    expires, signature, relative = parts(links.link(path, "http://h"), "http://h")
    forged = signature[:-1] + ("B" if signature.endswith("A") else "A")
    assert links.check(expires, forged, relative).status == 403
    assert links.check(str(int(expires) + 999), signature, relative).status == 403
    assert links.check(expires, signature, "outbox/other.pdf").status == 403
    assert links.check("soon", signature, relative).status == 403
    other = MediaLinks(tmp_path / "elsewhere", ttl=60)
    assert other.check(expires, signature, relative).status == 403


def test_files_outside_the_state_directory_cannot_be_linked(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    links = MediaLinks(tmp_path / "state", ttl=60)
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    with pytest.raises(ValueError, match="is not in the subpath"):
        links.link(secret, "http://h")


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
