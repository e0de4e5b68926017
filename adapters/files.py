"""Storing files that arrive with inbound messages (shared by the adapters)."""

from __future__ import annotations

import re
from pathlib import Path


def safe_name(name: str) -> str:
    """A file name part without path separators, leading dots or odd characters."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".")[:100]
    return cleaned or "file"


def attachment_path(files_dir: Path, key: str, index: int, filename: str) -> Path:
    """Where file `index` of message `key` (`<chat>:<id>`) is kept: `<chat>/<id>-<index>-<name>`."""
    chat, _, number = key.partition(":")
    return files_dir / safe_name(chat) / f"{safe_name(number)}-{index}-{safe_name(filename)}"


def save_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (a reader never sees half a file). Blocking."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(path)
