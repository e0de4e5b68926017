"""A real Dovecot IMAP server for the email tests, run in the foreground on 127.0.0.1.

Everything lives in a fresh directory under the system temp dir: the generated config, a
passwd-file with one user, the Maildir, Dovecot's base and state dirs, its log. Run as root
(a container, CI), Dovecot's own unprivileged users do the work (`dovenull` for logins,
`dovecot` for the rest and for the mail files); run as another user, that user does all of it.
Tests put mail into the mailbox with IMAP APPEND through their own client (the standard
library's imaplib, not the adapter's library) and read flags the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import imaplib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.e2e.daemon import free_port
from tests.services import require_service

USER = "herald@example.test"
PASSWORD = "mail-secret"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
SERVICE = "Dovecot (dovecot-imapd)"


def dovecot_binary() -> str:
    """The `dovecot` executable; skips the test (fails it in CI) when it is not installed."""
    found = shutil.which("dovecot") or next(
        (p for p in ("/usr/sbin/dovecot", "/sbin/dovecot") if os.access(p, os.X_OK)), None
    )
    if found is None:
        require_service(
            SERVICE, "the dovecot binary is not installed (apt-get install dovecot-imapd)"
        )
    return found


def dovecot_version(binary: str) -> tuple[int, int]:
    """(major, minor) of the installed Dovecot."""
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    match = re.match(r"(\d+)\.(\d+)", out.strip())
    if match is None:
        raise RuntimeError(f"cannot read the Dovecot version from {out!r}")
    return int(match.group(1)), int(match.group(2))


def _users() -> tuple[str, str, str]:
    """(login user, internal user, mail user)."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid()).pw_name
        return me, me, me
    return "dovenull", "dovecot", "dovecot"


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem) in `directory`."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    openssl = shutil.which("openssl")
    if openssl is None:
        require_service("openssl", "not installed (apt-get install openssl)")
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    key.chmod(0o644)  # read by Dovecot's own users too
    return cert, key


def _ssl(root: Path, tls: bool, version: tuple[int, int]) -> str:
    if not tls:
        return "ssl = no"
    if version >= (2, 4):
        files = f"ssl_server_cert_file = {root}/cert.pem\nssl_server_key_file = {root}/key.pem"
        return f"ssl = yes\n{files}"
    return f"ssl = yes\nssl_cert = <{root}/cert.pem\nssl_key = <{root}/key.pem"


def _config(root: Path, port: int, tls_port: int, version: tuple[int, int], *, tls: bool) -> str:
    login, internal, mail = _users()
    common = f"""
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
instance_name = herald-test-{port}
protocols = imap
listen = 127.0.0.1
{_ssl(root, tls, version)}
auth_mechanisms = plain login
default_internal_user = {internal}
default_internal_group = {internal}
default_login_user = {login}
mail_uid = {mail}
mail_gid = {mail}
first_valid_uid = 1
imap_idle_notify_interval = 1 mins
service imap-login {{
  inet_listener imap {{
    port = {port}
  }}
  inet_listener imaps {{
    port = {tls_port}
  }}
  chroot =
}}
service anvil {{
  chroot =
}}
"""
    if version >= (2, 4):
        return f"""dovecot_config_version = {version[0]}.{version[1]}.0
dovecot_storage_version = {version[0]}.{version[1]}.0
{common}
auth_allow_cleartext = yes
mail_driver = maildir
mail_path = {root}/mail/%{{user}}
passdb passwd-file {{
  passwd_file_path = {root}/passwd
}}
userdb static {{
  fields {{
    uid = {mail}
    gid = {mail}
    home = {root}/mail/%{{user}}
  }}
}}
"""
    return f"""{common}
disable_plaintext_auth = no
mail_location = maildir:{root}/mail/%u
passdb {{
  driver = passwd-file
  args = username_format=%u {root}/passwd
}}
userdb {{
  driver = static
  args = uid={mail} gid={mail} home={root}/mail/%u
}}
"""


class Dovecot:
    """Dovecot serving IMAP on 127.0.0.1:`port` with one user, between enter and exit."""

    def __init__(self, *, extra_config: str = "", tls: bool = False) -> None:
        self.tls = tls
        """Also serve IMAPS on `tls_port` and offer STARTTLS (a self-signed certificate)."""
        self.extra_config = extra_config
        """Appended to the generated config (e.g. `imap_capability = …` to hide IDLE)."""
        self.binary = dovecot_binary()
        self.version = dovecot_version(self.binary)
        self.port = free_port()
        self.tls_port = free_port() if tls else 0
        self.root = Path(tempfile.mkdtemp(prefix="herald-dovecot-"))
        self.process: asyncio.subprocess.Process | None = None

    @property
    def config_path(self) -> Path:
        """The generated dovecot.conf."""
        return self.root / "dovecot.conf"

    def section(self, **changes: Any) -> dict[str, Any]:
        """A `platforms.email` section reading this server (SMTP and the rest from `changes`)."""
        section: dict[str, Any] = {
            "imap_host": "127.0.0.1",
            "imap_port": self.port,
            "imap_security": "none",
            "username": USER,
            "password": PASSWORD,
            "address": USER,
            "display_name": "Herald",
        }
        section.update(changes)
        return section

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Write the config and start Dovecot; return once it greets IMAP clients."""
        _, _, mail = _users()
        entry = pwd.getpwnam(mail)
        self.root.chmod(0o755)  # Dovecot's own users must reach their files in here
        for name in ("run", "state", "mail"):
            (self.root / name).mkdir(exist_ok=True)
        os.chown(self.root / "mail", entry.pw_uid, entry.pw_gid)
        (self.root / "passwd").write_text(f"{USER}:{{PLAIN}}{PASSWORD}\n", encoding="utf-8")
        if self.tls:
            make_certificate(self.root)
        config = _config(self.root, self.port, self.tls_port, self.version, tls=self.tls)
        config += self.extra_config + "\n"
        self.config_path.write_text(config, "utf-8")
        await self._spawn()

    async def _spawn(self) -> None:
        with (self.root / "stderr.log").open("ab") as stderr:
            self.process = await asyncio.create_subprocess_exec(
                self.binary,
                "-F",
                "-c",
                str(self.config_path),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while not await asyncio.to_thread(self._greets):
                    if self.process.returncode is not None:
                        raise RuntimeError(f"dovecot exited at start:\n{self.log()}")
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise RuntimeError(
                f"dovecot did not answer in {START_TIMEOUT}s:\n{self.log()}"
            ) from None

    def _greets(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                return sock.recv(200).startswith(b"* OK")
        except OSError:
            return False

    async def restart(self) -> None:
        """Stop Dovecot (every client connection is closed) and start it again."""
        await self._terminate()
        await self._spawn()

    async def _terminate(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
        # The master's children may linger a moment after it exits; the pid file goes last.
        async with asyncio.timeout(STOP_TIMEOUT):
            while (self.root / "run" / "master.pid").exists():
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Stop Dovecot and remove its directory."""
        try:
            await self._terminate()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        """Dovecot's log so far (for failure messages)."""
        parts = []
        for name in ("dovecot.log", "stderr.log"):
            with contextlib.suppress(OSError):
                parts.append((self.root / name).read_text("utf-8", "replace"))
        return "\n".join(parts)[-5000:]

    async def kick(self) -> None:
        """Disconnect every IMAP session of the user, as an administrator would."""
        doveadm = shutil.which("doveadm") or "/usr/bin/doveadm"
        process = await asyncio.create_subprocess_exec(
            doveadm,
            "-c",
            str(self.config_path),
            "kick",
            USER,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"doveadm kick failed: {out.decode(errors='replace')}")

    # -- the test's own IMAP client ------------------------------------------------------------

    def _client(self) -> imaplib.IMAP4:
        client = imaplib.IMAP4("127.0.0.1", self.port, timeout=10)
        client.login(USER, PASSWORD)
        return client

    async def append(self, mail: bytes, folder: str = "INBOX") -> int:
        """Put `mail` into `folder`; its UID."""

        def run() -> int:
            client = self._client()
            try:
                status, data = client.append(folder, "", None, mail)
                assert status == "OK", data
                match = re.search(rb"APPENDUID \d+ (\d+)", data[0] or b"")
                assert match is not None, data
                return int(match.group(1))
            finally:
                client.logout()

        return await asyncio.to_thread(run)

    async def create_folder(self, folder: str) -> None:
        """Create a folder in the user's mailbox."""

        def run() -> None:
            client = self._client()
            try:
                status, data = client.create(folder)
                assert status == "OK", data
            finally:
                client.logout()

        await asyncio.to_thread(run)

    async def flags(self, folder: str = "INBOX") -> dict[int, set[str]]:
        """UID → flags of every mail in `folder`."""

        def run() -> dict[int, set[str]]:
            client = self._client()
            try:
                status, _ = client.select(folder, readonly=True)
                assert status == "OK"
                status, data = client.uid("FETCH", "1:*", "(UID FLAGS)")
                out: dict[int, set[str]] = {}
                for line in data:
                    if not isinstance(line, bytes):
                        continue
                    match = re.search(rb"UID (\d+) FLAGS \(([^)]*)\)", line)
                    if match:
                        out[int(match.group(1))] = set(match.group(2).decode().split())
                return out
            finally:
                client.logout()

        return await asyncio.to_thread(run)
