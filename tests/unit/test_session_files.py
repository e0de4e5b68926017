"""Received files kept per session: the folder name comes from the session key alone, a
message's downloads are linked there (the originals dropped only once its row is stored), and
pruning covers the per-session folders and the older per-chat ones alike."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gateway.contracts.ids import SessionKey
from gateway.contracts.messages import Attachment
from gateway.media import adopt_files, drop_originals, prune_files, session_dir


def test_session_folders_are_safe_and_never_shared(tmp_path: Path) -> None:
    keys = [
        "telegram:default:-100:u=1",
        "telegram:default:-100:u=2",
        "telegram:default:-100:u=1/../../x",
        "telegram:default:-100:u%3D1",  # the same readable part as the first
        "telegram:default:-100:u_1",
        ":::",
    ]
    folders = [session_dir(tmp_path, SessionKey(k)) for k in keys]
    assert len(set(folders)) == len(keys)
    for folder in folders:
        assert folder.parent == tmp_path / "sessions"
        assert "/" not in folder.name
        assert not folder.name.startswith(".")


def test_downloads_move_to_the_session_folder(tmp_path: Path) -> None:
    key = SessionKey("slack:default:C1:u=U2")
    download = tmp_path / "slack" / "default" / "C1" / "17-0-notes.pdf"
    download.parent.mkdir(parents=True)
    download.write_bytes(b"%PDF")
    elsewhere = tmp_path.parent / "fixture.bin"
    given = (
        Attachment(download, "application/pdf", 4, "../../etc/passwd"),
        Attachment(elsewhere, "application/octet-stream", 1, "x"),
    )

    kept = adopt_files(given, tmp_path, key)

    assert kept[0].path == session_dir(tmp_path, key) / "17-0-notes.pdf"
    assert kept[0].path.read_bytes() == b"%PDF"
    assert kept[0].filename == "../../etc/passwd"  # a label only, never a path
    assert kept[1] == given[1]  # not under the files folder: left as it is
    assert download.exists()  # until the message is stored
    assert adopt_files(kept, tmp_path, key) == kept  # again (a redelivery): nothing moves
    drop_originals(given, kept)
    assert not download.exists()
    assert kept[0].path.read_bytes() == b"%PDF"


def test_prune_covers_per_session_and_per_chat_folders(tmp_path: Path) -> None:
    month_ago = time.time() - 31 * 86400
    old_chat = tmp_path / "telegram" / "default" / "42" / "1-0-photo.jpg"
    old_session = session_dir(tmp_path, SessionKey("telegram:default:42")) / "2-0-photo.jpg"
    new_session = session_dir(tmp_path, SessionKey("telegram:default:43")) / "3-0-photo.jpg"
    for path in (old_chat, old_session, new_session):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    for path in (old_chat, old_session):
        os.utime(path, (month_ago, month_ago))

    assert prune_files(tmp_path, 30 * 86400) == 2
    assert not old_chat.parent.exists()
    assert not old_session.parent.exists()
    assert new_session.exists()
