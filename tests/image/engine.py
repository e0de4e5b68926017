"""Building and running Herald's container image with podman, for `make image-test`.

The base image is made here from Debian's packages (no registry is needed): mmdebstrap
writes a root file system, `podman import` turns it into an image tagged by a hash of its
inputs, so a second run reuses it. The build gets the host's certificate bundle as the
`pip_cert` secret (what the host's pip trusts) and the host's network.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
ENGINE = os.environ.get("HERALD_IMAGE_ENGINE", "podman")
IMAGE = os.environ.get("HERALD_TEST_IMAGE", "localhost/herald:image-test")
BUILD_STAGE = "localhost/herald-test-build:latest"
"""The Containerfile's first stage, tagged to keep it as the next build's cache."""
PREFIX = "herald-it-"
"""Every container, volume and secret a test makes is named with this prefix."""
STOP_TIMEOUT = 10
"""What docker and podman wait after SIGTERM before SIGKILL, unless told otherwise."""

BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_OPTIONS = (
    "--variant=minbase",
    # No usrmerge (it pulls in perl); no documentation, manuals or translations.
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
)


def engine_env() -> dict[str, str]:
    """The environment for podman: this directory's containers.conf unless one is set."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(Path(__file__).with_name("containers.conf")))
    return env


def engine(*args: str, timeout: float = 60, check: bool = True) -> str:
    """Run the container engine and return its standard output; raises with its stderr."""
    done = subprocess.run(
        [ENGINE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=engine_env(),
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{ENGINE} {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done.stdout


async def aengine(*args: str, timeout: float = 60, check: bool = True) -> str:
    """`engine` without blocking the event loop (the fake model answers from it)."""
    return await asyncio.to_thread(engine, *args, timeout=timeout, check=check)


def base_image() -> str:
    """The local Debian base, built once per set of inputs."""
    key = hashlib.sha256(
        json.dumps([BASE_SUITE, BASE_PACKAGES, BASE_OPTIONS]).encode()
    ).hexdigest()[:12]
    tag = f"localhost/herald-test-base:{key}"
    if subprocess.run([ENGINE, "image", "exists", tag], env=engine_env(), check=False).returncode:
        with tempfile.TemporaryDirectory(prefix="herald-base-") as scratch:
            tarball = Path(scratch) / "rootfs.tar"
            subprocess.run(
                [
                    "mmdebstrap",
                    "--quiet",
                    *BASE_OPTIONS,
                    f"--include={','.join(BASE_PACKAGES)}",
                    BASE_SUITE,
                    str(tarball),
                ],
                check=True,
                timeout=900,
            )
            engine("import", str(tarball), tag, timeout=300)
    return tag


def pip_cert() -> Path | None:
    """The certificate bundle the host's pip trusts, when there is one to pass on."""
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("REQUESTS_CA_BUNDLE"),
        os.environ.get("SSL_CERT_FILE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_image(base: str) -> float:
    """Build the Containerfile on `base` as IMAGE; return the seconds it took.

    The first stage is tagged too (BUILD_STAGE), so that its layers, the next run's cache,
    are not dangling; the dangling layers of earlier builds are then removed.
    """
    args = ["build", "--network", "host", "--build-arg", f"BASE={base}"]
    if ENGINE == "podman":
        args += ["--format", "docker"]  # the OCI format drops HEALTHCHECK
    cert = pip_cert()
    if cert is not None:
        args += ["--secret", f"id=pip_cert,src={cert}"]
    args += ["-f", str(ROOT / "Containerfile")]
    began = time.monotonic()
    engine(*args, "--target", "build", "-t", BUILD_STAGE, str(ROOT), timeout=1200)
    engine(*args, "-t", IMAGE, str(ROOT), timeout=1200)
    took = time.monotonic() - began
    engine("image", "prune", "--force", "--filter", "label=io.herald.stage", timeout=300)
    return took


def image_size() -> int:
    """The image's size in bytes, unpacked."""
    return int(engine("image", "inspect", "--format", "{{.Size}}", IMAGE).strip())


def clean_up() -> None:
    """Remove every container, volume and secret a test left (names start with PREFIX)."""
    names = engine("ps", "-a", "--format", "{{.Names}}", check=False).split()
    ours = [n for n in names if n.startswith(PREFIX)]
    if ours:
        engine("rm", "--force", "--volumes", *ours, check=False)
    volumes = engine("volume", "ls", "--format", "{{.Name}}", check=False).split()
    ours = [v for v in volumes if v.startswith(PREFIX)]
    if ours:
        engine("volume", "rm", "--force", *ours, check=False)
    found = engine("secret", "ls", "--format", "{{.Name}}", check=False).split()
    ours = [s for s in found if s.startswith(PREFIX)]
    if ours:
        engine("secret", "rm", *ours, check=False)


def new_name(what: str) -> str:
    """A fresh name for a container, volume or secret of this run."""
    return f"{PREFIX}{what}-{secrets.token_hex(3)}"


@contextlib.contextmanager
def secret(value: str) -> Iterator[str]:
    """A podman secret holding `value`, removed afterwards; yields its name."""
    name = new_name("secret")
    with tempfile.NamedTemporaryFile("w", prefix="herald-secret-") as handle:
        handle.write(value)
        handle.flush()
        engine("secret", "create", name, handle.name)
    try:
        yield name
    finally:
        engine("secret", "rm", name, check=False)


@dataclass
class Container:
    """One `herald run` container on the host's network."""

    port: int
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    """Podman secret name -> file name under /run/secrets."""
    mounts: dict[Path, str] = field(default_factory=dict)
    """Host file -> path in the container, bind-mounted read-only (docker's way to secrets)."""
    volume: str | None = None
    config: Path | None = None
    """A config file mounted over the image's /etc/herald/herald.yaml."""
    read_only: bool = False
    """A read-only root file system. podman 4.3 cannot mount its `--secret`s into one: pass
    them in `mounts`."""
    init: bool = True
    """Start with `--init` (as README says); False: the image's entrypoint is PID 1."""
    name: str = field(default_factory=lambda: new_name("run"))
    ready_after: float | None = None
    """Seconds from `start` until `/ready` answered 200."""

    @property
    def url(self) -> str:
        """The API's base URL on the host."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Create and start the container (detached)."""
        args = ["run", "--detach", "--name", self.name, "--network", "host"]
        if self.init:
            args.append("--init")
        if self.read_only:
            args.append("--read-only")
        args += ["--health-interval", "disable"]  # no systemd timers here; run by hand
        for key, value in {"HERALD_API__PORT": str(self.port), **self.env}.items():
            args += ["--env", f"{key}={value}"]
        for source, target in self.secrets.items():
            args += ["--secret", f"{source},target={target}"]
        for host, target in self.mounts.items():
            args += ["--volume", f"{host}:{target}:ro"]
        if self.volume is not None:
            args += ["--volume", f"{self.volume}:/var/lib/herald"]
        if self.config is not None:
            args += ["--volume", f"{self.config}:/etc/herald/herald.yaml:ro"]
        await aengine(*args, IMAGE)

    async def state(self) -> dict[str, object]:
        """`.State` of `inspect`: Status, ExitCode, Health…"""
        out = await aengine("inspect", "--format", "{{json .State}}", self.name)
        found: dict[str, object] = json.loads(out)
        return found

    async def logs(self) -> str:
        """Everything Herald logged so far."""
        done = await asyncio.to_thread(
            subprocess.run,
            [ENGINE, "logs", self.name],
            capture_output=True,
            text=True,
            timeout=30,
            env=engine_env(),
            check=False,
        )
        return done.stdout + done.stderr

    async def wait_ready(self, timeout: float = 60) -> None:
        """Poll `/ready` until 200; fails at once (with the log) if the container exits."""
        began = time.monotonic()
        deadline = began + timeout
        async with httpx.AsyncClient(timeout=2) as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/ready")).status_code == 200:
                        self.ready_after = time.monotonic() - began
                        return
                if (await self.state()).get("Status") == "exited":
                    raise AssertionError(f"the container exited:\n{await self.logs()}")
                await asyncio.sleep(0.2)
        raise AssertionError(f"not ready after {timeout} s:\n{await self.logs()}")

    async def wait_exited(self, timeout: float = 30) -> int:
        """Wait until the container exits; return its exit code."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = await self.state()
            if state.get("Status") == "exited":
                code = state.get("ExitCode")
                assert isinstance(code, int)
                return code
            await asyncio.sleep(0.2)
        raise AssertionError(f"still running after {timeout} s:\n{await self.logs()}")

    async def stop(self) -> tuple[int, float]:
        """SIGTERM with the default stop timeout; return the exit code and the seconds."""
        began = time.monotonic()
        await aengine("stop", "--time", str(STOP_TIMEOUT), self.name, timeout=STOP_TIMEOUT + 30)
        elapsed = time.monotonic() - began
        state = await self.state()
        code = state.get("ExitCode")
        assert isinstance(code, int)
        return code, elapsed

    async def zombies(self) -> list[str]:
        """The pids of the container's processes that have ended and nobody reaped."""
        out = await aengine(
            "exec", self.name, "sh", "-c", "grep -l '^State:.*zombie' /proc/[0-9]*/status || true"
        )
        return [line.split("/")[2] for line in out.split()]

    async def remove(self) -> None:
        """Remove the container and its anonymous volumes."""
        await aengine("rm", "--force", "--volumes", self.name, check=False)

    async def processes(self) -> list[tuple[str, str]]:
        """(user, command line) of every process in the container."""
        out = await aengine("top", self.name, "user", "args")
        rows = [line.split(None, 1) for line in out.splitlines()[1:] if line.strip()]
        return [(row[0], row[1] if len(row) > 1 else "") for row in rows]


@contextlib.asynccontextmanager
async def running(container: Container) -> AsyncIterator[Container]:
    """Start `container`, wait until ready, and remove it afterwards whatever happens."""
    try:
        began = time.monotonic()
        await container.start()
        await container.wait_ready()
        container.ready_after = time.monotonic() - began
        yield container
    finally:
        await container.remove()


def available() -> str | None:
    """Why the image test cannot run here, or None when it can."""
    for tool in (ENGINE, "mmdebstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs it from Debian's packages)"
    return None
