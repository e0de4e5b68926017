"""A real Synapse homeserver for the Matrix tests, on 127.0.0.1 with SQLite.

`matrix-synapse` comes with the dev extra. Its config is written at test time (every rate
limit generous, bcrypt at its cheapest, no federation listener, no presence); people and the
bot are registered through the shared-secret admin API, each test its own, so one server
serves the whole run:

- `shared_synapse()` is the run's server: the first xdist worker to ask starts it, under a
  file lock in the temp dir named after the run (`PYTEST_XDIST_TESTRUNUID`); a small keeper
  process owns it and stops it once no worker that asked for it is alive.
- `private_synapse()` is a server of one test's own, for a test that restarts it.

Without `synapse` installed a test is skipped (failed under HERALD_REQUIRE_SERVICES=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import hmac
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.e2e.daemon import free_port
from tests.services import require_service

SERVICE = "Synapse (matrix-synapse, in the dev extra)"
SERVER_NAME = "herald.test"
START_TIMEOUT = 60.0
GENEROUS = {"per_second": 10_000, "burst_count": 10_000}


@dataclass(frozen=True, slots=True)
class Account:
    """A registered Matrix account: its id and access token."""

    user_id: str
    access_token: str
    device_id: str


@dataclass(frozen=True, slots=True)
class Synapse:
    """A running homeserver: its client API base and the shared registration secret."""

    url: str
    shared_secret: str

    async def register(self, prefix: str, *, admin: bool = False) -> Account:
        """A new account whose localpart starts with `prefix` (unique per call)."""
        name = f"{prefix}-{secrets.token_hex(4)}"
        password = secrets.token_hex(8)
        endpoint = f"{self.url}/_synapse/admin/v1/register"
        async with httpx.AsyncClient(timeout=20) as http:
            nonce = (await http.get(endpoint)).raise_for_status().json()["nonce"]
            mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
            mac.update(
                b"\x00".join(
                    [
                        nonce.encode(),
                        name.encode(),
                        password.encode(),
                        b"admin" if admin else b"notadmin",
                    ]
                )
            )
            body = {
                "nonce": nonce,
                "username": name,
                "password": password,
                "mac": mac.hexdigest(),
                "admin": admin,
            }
            answer = (await http.post(endpoint, json=body)).raise_for_status().json()
        return Account(answer["user_id"], answer["access_token"], answer["device_id"])


def synapse_installed() -> None:
    """Skip the test (fail it under HERALD_REQUIRE_SERVICES=1) without `synapse`."""
    if importlib.util.find_spec("synapse") is None:
        require_service(SERVICE, "the synapse package is not installed (pip install -e '.[dev]')")


def write_config(root: Path, port: int, secret: str) -> Path:
    """A homeserver.yaml (and its log config and signing key) in `root`; its path."""
    import yaml
    from signedjson.key import generate_signing_key, write_signing_keys

    root.mkdir(parents=True, exist_ok=True)
    key = root / "signing.key"
    if not key.exists():
        with key.open("w") as out:
            write_signing_keys(out, [generate_signing_key("a_herald")])
    log = {
        "version": 1,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "formatter": "plain",
                "filename": str(root / "homeserver.log"),
            }
        },
        "root": {"level": "WARNING", "handlers": ["file"]},
        "disable_existing_loggers": False,
    }
    (root / "log.yaml").write_text(yaml.safe_dump(log))
    config = {
        "server_name": SERVER_NAME,
        "pid_file": str(root / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(root / "homeserver.db")}},
        "log_config": str(root / "log.yaml"),
        "media_store_path": str(root / "media"),
        "registration_shared_secret": secret,
        "report_stats": False,
        "signing_key_path": str(key),
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "macaroon_secret_key": secret + "-macaroon",
        "form_secret": secret + "-form",
        "enable_metrics": False,
        "bcrypt_rounds": 4,
        "presence": {"enabled": False},
        "url_preview_enabled": False,
        "max_upload_size": "50M",
        "rc_message": GENEROUS,
        "rc_registration": GENEROUS,
        "rc_joins": {"local": GENEROUS, "remote": GENEROUS},
        "rc_joins_per_room": GENEROUS,
        "rc_invites": {"per_room": GENEROUS, "per_user": GENEROUS, "per_issuer": GENEROUS},
        "rc_login": {"address": GENEROUS, "account": GENEROUS, "failed_attempts": GENEROUS},
        "rc_admin_redaction": GENEROUS,
        "rc_room_creation": GENEROUS,
        "rc_media_create": GENEROUS,
    }
    path = root / "homeserver.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launch(root: Path, port: int, secret: str) -> subprocess.Popen[bytes]:
    """Start Synapse on `port` with its config under `root` (not waiting for it)."""
    config = write_config(root, port, secret)
    with (root / "stdout.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "synapse.app.homeserver", "-c", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=root,
        )


def answers(url: str) -> bool:
    """Whether the homeserver at `url` answers `/versions`."""
    try:
        return httpx.get(f"{url}/_matrix/client/versions", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_up(url: str, process: subprocess.Popen[bytes], root: Path) -> None:
    """Return once Synapse answers; RuntimeError when it exits or takes too long."""
    deadline = time.monotonic() + START_TIMEOUT
    while not answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            log = (root / "stdout.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"Synapse did not start (exit {process.poll()}): {log}")
        time.sleep(0.1)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# -- the run's shared server ---------------------------------------------------------------


def _run_dir() -> Path:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"solo-{os.getpid()}"
    return Path(tempfile.gettempdir()) / f"herald-synapse-{run}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def shared_synapse_blocking() -> Synapse:
    """The run's Synapse, started by the first caller (blocking; see `shared_synapse`)."""
    synapse_installed()
    root = _run_dir()
    root.mkdir(exist_ok=True)
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        users = root / "users"
        known = users.read_text().split() if users.exists() else []
        if str(os.getpid()) not in known:
            with users.open("a") as out:
                out.write(f"{os.getpid()}\n")
        state = root / "state.json"
        if state.exists():
            found = json.loads(state.read_text())
            if _alive(found["keeper"]) and answers(found["url"]):
                return Synapse(found["url"], found["secret"])
            state.unlink()
        # Spawned, not a Popen: it outlives this worker, and who started it does not wait.
        keeper = os.posix_spawn(
            sys.executable,
            [sys.executable, "-m", "tests.fakes.synapse", str(root)],
            {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            setsid=True,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (
                    os.POSIX_SPAWN_OPEN,
                    2,
                    str(root / "keeper.log"),
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                    0o644,
                ),
            ],
        )
        deadline = time.monotonic() + START_TIMEOUT + 5
        while not state.exists():
            ended, _ = os.waitpid(keeper, os.WNOHANG)
            if ended or time.monotonic() > deadline:
                log = (root / "keeper.log").read_text(errors="replace")[-2000:]
                require_service(SERVICE, f"it did not start: {log}")
            time.sleep(0.1)
        found = json.loads(state.read_text())
        return Synapse(found["url"], found["secret"])


async def shared_synapse() -> Synapse:
    """The run's Synapse (one for every worker of the run), started on first use."""
    return await asyncio.to_thread(shared_synapse_blocking)


def keep(root: Path) -> None:
    """The keeper: run Synapse until no worker that asked for it is alive."""
    port, secret = free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    process = launch(root / "server", port, secret)
    try:
        wait_up(url, process, root / "server")
        tmp = root / "state.json.part"
        tmp.write_text(json.dumps({"url": url, "secret": secret, "keeper": os.getpid()}))
        tmp.replace(root / "state.json")
        while process.poll() is None:
            time.sleep(0.5)
            with (root / "lock").open("w") as lock:
                # Under the lock: a worker arriving now either sees the server or starts anew.
                fcntl.flock(lock, fcntl.LOCK_EX)
                pids = [int(p) for p in (root / "users").read_text().split() if p.isdigit()]
                if not any(_alive(p) for p in pids):
                    (root / "state.json").unlink()
                    (root / "users").unlink()
                    break
    finally:
        stop(process)
        with contextlib.suppress(FileNotFoundError):
            (root / "state.json").unlink()
        shutil.rmtree(root / "server", ignore_errors=True)


# -- a server of one test's own ------------------------------------------------------------


class PrivateSynapse:
    """A homeserver of one test's own, which the test may restart."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.secret = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = Synapse(self.url, self.secret)
        self._process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        """Start it (again, on the same port and database) and wait until it answers."""
        self._process = launch(self.root, self.port, self.secret)
        process = self._process
        await asyncio.to_thread(wait_up, self.url, process, self.root)

    async def stop(self) -> None:
        """Stop it (SIGTERM)."""
        if self._process is not None:
            await asyncio.to_thread(stop, self._process)


@contextlib.asynccontextmanager
async def private_synapse(root: Path) -> AsyncIterator[PrivateSynapse]:
    """A started Synapse of the caller's own under `root`, stopped at the end."""
    synapse_installed()
    server = PrivateSynapse(root)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


if __name__ == "__main__":
    keep(Path(sys.argv[1]))
