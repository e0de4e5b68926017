"""The config file as `herald setup` edits it: read and written with ruamel.yaml's round
trip (comments, key order and the keys it does not touch stay as they were), secrets in
files of their own (mode 0600) named by `<key>_file`, every file replaced atomically.

Nothing is written until `commit`; an interrupted run leaves every file as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from gateway.config import load_config
from gateway.contracts.errors import ConfigError

HEADER = (
    "Herald's configuration, written by `herald setup` (edit freely: a new run keeps your\n"
    "comments and other keys). Secrets live in the files named by the *_file keys.\n"
    "Every key: README.md, Configuration."
)


def _yaml() -> YAML:
    yaml = YAML()  # round trip
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096  # long values (paths, URLs) stay on one line
    return yaml


class ConfigFile:
    """A config file being edited: `data` is its YAML document (a new one when the file
    does not exist yet); `secrets` the secret files to write with it."""

    def __init__(self, path: Path, secrets_dir: Path | None = None) -> None:
        self.path = path
        self.secrets_dir = secrets_dir or path.parent / "secrets"
        self.secrets: dict[Path, str] = {}
        self.existed = path.exists()
        if self.existed:
            try:
                loaded = _yaml().load(path.read_text(encoding="utf-8"))
            except OSError as err:
                raise ConfigError(f"cannot read {path}: {err.strerror}") from err
            except YAMLError as err:
                raise ConfigError(f"{path} is not valid YAML: {err}; fix it first") from err
            if loaded is None:
                loaded = CommentedMap()
            if not isinstance(loaded, CommentedMap):
                raise ConfigError(f"{path} must hold a mapping at the top level")
            self.data: CommentedMap = loaded
        else:
            self.data = CommentedMap()
            self.data.yaml_set_start_comment(HEADER)

    # -- reading ------------------------------------------------------------------------

    def section(self, *path: str) -> Mapping[str, Any]:
        """The mapping at `path` (empty when absent)."""
        node: Any = self.data
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        return node if isinstance(node, Mapping) else {}

    def get(self, *path: str) -> Any:
        """The value at `path`, or None."""
        return self.section(*path[:-1]).get(path[-1])

    def secret(self, *path: str) -> str | None:
        """The current secret at `path`: pending, written inline, or in its `_file`."""
        *parent, key = path
        pending = self.secrets.get(self.secret_path(*path))
        if pending is not None:
            return pending
        node = self.section(*parent)
        if node.get(key) is not None:
            return str(node[key])
        named = node.get(f"{key}_file")
        if named is None:
            return None
        try:
            return Path(str(named)).expanduser().read_text(encoding="utf-8").rstrip("\r\n")
        except OSError:
            return None

    def plain(self, *path: str) -> dict[str, Any]:
        """The mapping at `path` as plain data, secrets read (for validation)."""
        data: dict[str, Any] = _plain(self.section(*path), self.secrets)
        return data

    # -- editing ------------------------------------------------------------------------

    def _parent(self, path: tuple[str, ...]) -> CommentedMap:
        node = self.data
        for key in path:
            child = node.get(key)
            if not isinstance(child, CommentedMap):
                child = CommentedMap()
                node[key] = child
            node = child
        return node

    def set(self, *path: str, value: Any) -> None:
        """Set the value at `path` (None removes the key), keeping everything else."""
        *parent, key = path
        node = self._parent(tuple(parent))
        if value is None:
            node.pop(key, None)
        elif node.get(key) != value:
            node[key] = value

    def to_accounts(self, platform: str, account: str) -> None:
        """Rewrite `platforms.<platform>`, a single section, as `accounts: {<account>: …}`
        (its keys, comments and secret files kept), so that another account can be added."""
        platforms = self._parent(("platforms",))
        body = platforms.get(platform)
        if not isinstance(body, CommentedMap):
            body = CommentedMap()
        body.pop("account", None)
        accounts = CommentedMap()
        accounts[account] = body
        entry = CommentedMap()
        entry["accounts"] = accounts
        platforms[platform] = entry

    def secret_path(self, *path: str) -> Path:
        """Where the secret at `path` is kept: `<secrets dir>/<dotted path>`."""
        return (self.secrets_dir / ".".join(p for p in path if p != "platforms")).absolute()

    def set_secret(self, *path: str, value: str) -> None:
        """Keep the secret at `path` in a file of its own, named by `<key>_file`."""
        *parent, key = path
        target = self.secret_path(*path)
        self.secrets[target] = value
        node = self._parent(tuple(parent))
        node.pop(key, None)
        node[f"{key}_file"] = str(target)

    # -- writing ------------------------------------------------------------------------

    def render(self) -> str:
        """The document as it would be written."""
        stream = _Text()
        _yaml().dump(self.data, stream)
        return stream.text

    def validate(self) -> None:
        """Check the configuration as it would be written (pending secrets included).
        Raises ConfigError naming each bad key; writes nothing that stays."""
        data = _plain(self.data, self.secrets)
        with tempfile.TemporaryDirectory(prefix="herald-setup-") as scratch:
            candidate = Path(scratch) / "herald.yaml"
            candidate.write_text(json.dumps(data, default=str), encoding="utf-8")
            load_config(candidate)

    def commit(self) -> None:
        """Write the secret files (0600, in a 0700 directory) and then the config, each
        replaced atomically; Ctrl-C is held off until both are done."""
        with _no_interrupt():
            if self.secrets:
                self.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            for target, value in self.secrets.items():
                _atomic_write(target, value + "\n", mode=0o600)
            mode = self.path.stat().st_mode & 0o777 if self.existed else 0o600
            _atomic_write(self.path, self.render(), mode=mode)


class _Text:
    """A write-only text stream ruamel dumps into."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str | bytes) -> None:
        self.parts.append(text.decode() if isinstance(text, bytes) else text)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _plain(value: Any, pending: Mapping[Path, str]) -> Any:
    """`value` as plain data; a `<key>_file` becomes `<key>` with the secret (a pending one,
    or the file's contents)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and key.endswith("_file") and item is not None:
                named = Path(str(item)).expanduser()
                secret = pending.get(named.absolute())
                if secret is None:
                    try:
                        secret = named.read_text(encoding="utf-8").rstrip("\r\n")
                    except OSError:
                        out[key] = str(item)  # validation names the file it cannot read
                        continue
                out[key.removesuffix("_file")] = secret
            else:
                out[str(key)] = _plain(item, pending)
        return out
    if isinstance(value, list):
        return [_plain(v, pending) for v in value]
    return value


def _atomic_write(path: Path, text: str, *, mode: int) -> None:
    """Replace `path` by `text`: a temporary file beside it, synced, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), mode)
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def _no_interrupt() -> Iterator[None]:
    """Ignore SIGINT for the duration (in the main thread; elsewhere, do nothing)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
