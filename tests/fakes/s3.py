"""moto's standalone S3 server (`python -m moto.server`) on 127.0.0.1, one process per test
worker, each test with buckets of its own; `moto_auth` is a second one that checks
credentials (every key is unknown to it, so any request is refused as a wrong key)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiobotocore.session import get_session

from gateway.config import S3Config
from tests.e2e.daemon import free_port

START_TIMEOUT = 30.0
ACCESS_KEY = "AKIAHERALDTEST000000"
SECRET_KEY = "herald-test-secret-key"


@dataclass(frozen=True, slots=True)
class MotoS3:
    """A running moto server."""

    url: str

    def config(self, bucket: str, **more: Any) -> S3Config:
        """`files.s3` pointing at this server's `bucket`."""
        return S3Config.model_validate(
            {
                "bucket": bucket,
                "endpoint_url": self.url,
                "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY,
                "timeout": 5,
                **more,
            }
        )

    async def new_bucket(self) -> str:
        """A new, empty bucket's name."""
        name = f"herald-{secrets.token_hex(6)}"
        async with _client(self.url) as client:
            await client.create_bucket(Bucket=name)
        return name

    async def objects(self, bucket: str) -> dict[str, int]:
        """Object name → size in `bucket`."""
        async with _client(self.url) as client:
            listed = await client.list_objects_v2(Bucket=bucket)
        return {str(o["Key"]): int(o["Size"]) for o in listed.get("Contents", [])}

    async def put(self, bucket: str, name: str, data: bytes) -> None:
        """Overwrite object `name` (a test tampering with the bucket)."""
        async with _client(self.url) as client:
            await client.put_object(Bucket=bucket, Key=name, Body=data)


def _client(url: str) -> Any:
    return get_session().create_client(
        "s3",
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )


@contextlib.contextmanager
def moto_server(env: dict[str, str] | None = None) -> Iterator[MotoS3]:
    """A moto server process for as long as the block runs."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto.server exited with {process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("moto.server did not listen within 30 s")
            time.sleep(0.05)
        yield MotoS3(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
