"""`BlobBackend` in an S3-compatible bucket (`files.store: s3`), through aiobotocore.

Each blob is the object `<prefix><sha256>`. Small files go up in one PUT, larger ones as a
multipart upload of `PART` bytes a part (never a whole file in memory); reads stream the
object's body. Every failure becomes `FileStoreUnavailable` naming what to fix (the bucket,
the credentials, the endpoint) or `FileGone`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from gateway.config import S3Config
from gateway.contracts.errors import FileGone, FileStoreUnavailable

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

logger = logging.getLogger(__name__)

PART = 8 * 1024 * 1024
"""Bytes per part of a multipart upload (S3 takes at least 5 MiB but for the last)."""
READ = 256 * 1024
"""Bytes per read of an object's body."""

_NET = (BotoCoreError, aiohttp.ClientError, OSError, TimeoutError)
"""What a request that never got an answer raises."""
_GONE = {"NoSuchKey", "404", "NotFound"}
_WHY = {
    "NoSuchBucket": "the bucket {bucket!r} does not exist; create it or fix files.s3.bucket",
    "InvalidAccessKeyId": "S3 refused the access key; fix files.s3.access_key_id",
    "SignatureDoesNotMatch": "S3 refused the secret key; fix files.s3.secret_access_key",
    "AccessDenied": "S3 denied access to the bucket {bucket!r}; check the key's permissions",
    "403": "S3 denied access to the bucket {bucket!r}; check the credentials and permissions",
}


class S3Blobs:
    """The bucket of `config`, entered once (`async with`)."""

    name = "s3"

    def __init__(self, config: S3Config) -> None:
        self.config = config
        self._stack = contextlib.AsyncExitStack()
        self._client: S3Client | None = None

    async def __aenter__(self) -> Self:
        c = self.config
        session = get_session()
        options: dict[str, Any] = {
            "region_name": c.region,
            "config": AioConfig(
                connect_timeout=c.timeout,
                read_timeout=c.timeout,
                retries={"max_attempts": 2, "mode": "standard"},
                s3={"addressing_style": "path"} if c.endpoint_url else None,
            ),
        }
        if c.endpoint_url:
            options["endpoint_url"] = c.endpoint_url
        if c.access_key_id is not None and c.secret_access_key is not None:
            options["aws_access_key_id"] = c.access_key_id.get_secret_value()
            options["aws_secret_access_key"] = c.secret_access_key.get_secret_value()
        self._client = await self._stack.enter_async_context(session.create_client("s3", **options))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._client = None
        await self._stack.aclose()

    @property
    def client(self) -> S3Client:
        """The open client."""
        if self._client is None:
            raise RuntimeError("S3Blobs used outside `async with`")
        return self._client

    def _object(self, key: str) -> str:
        return f"{self.config.prefix}{key}"

    def _error(self, err: Exception, doing: str) -> FileStoreUnavailable:
        """What went wrong, said so the operator knows what to fix."""
        bucket = self.config.bucket
        if isinstance(err, ClientError):
            code = str(err.response.get("Error", {}).get("Code", ""))
            why = _WHY.get(code, "S3 answered {code}").format(bucket=bucket, code=code or "?")
        else:
            where = self.config.endpoint_url or f"AWS S3 ({self.config.region})"
            why = f"cannot reach {where}: {type(err).__name__}; check files.s3.endpoint_url"
        return FileStoreUnavailable(f"S3 {doing} failed: {why}")

    async def check(self) -> None:
        """Whether the bucket is there and the credentials work. Raises
        FileStoreUnavailable saying what to fix."""
        try:
            await self.client.head_bucket(Bucket=self.config.bucket)
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            if code in _GONE:
                err.response["Error"]["Code"] = "NoSuchBucket"
            raise self._error(err, "check") from err
        except _NET as err:
            raise self._error(err, "check") from err

    async def write(self, key: str, path: Path, size: int) -> None:
        """See `BlobBackend.write`."""
        try:
            if size <= PART:
                data = await asyncio.to_thread(path.read_bytes)
                await self.client.put_object(
                    Bucket=self.config.bucket, Key=self._object(key), Body=data
                )
                return
            await self._multipart(key, path)
        except ClientError as err:
            raise self._error(err, "upload") from err
        except _NET as err:
            raise self._error(err, "upload") from err

    async def _multipart(self, key: str, path: Path) -> None:
        bucket, name = self.config.bucket, self._object(key)
        started = await self.client.create_multipart_upload(Bucket=bucket, Key=name)
        upload = started["UploadId"]
        try:
            parts: list[dict[str, Any]] = []
            with await asyncio.to_thread(path.open, "rb") as f:
                number = 1
                while block := await asyncio.to_thread(f.read, PART):
                    sent = await self.client.upload_part(
                        Bucket=bucket, Key=name, UploadId=upload, PartNumber=number, Body=block
                    )
                    parts.append({"ETag": sent["ETag"], "PartNumber": number})
                    number += 1
            await self.client.complete_multipart_upload(
                Bucket=bucket,
                Key=name,
                UploadId=upload,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
            )
        except BaseException:
            with contextlib.suppress(ClientError, *_NET):
                await asyncio.shield(
                    self.client.abort_multipart_upload(Bucket=bucket, Key=name, UploadId=upload)
                )
            raise

    async def read(self, key: str) -> AsyncIterator[bytes]:
        """See `BlobBackend.read`."""
        try:
            got = await self.client.get_object(Bucket=self.config.bucket, Key=self._object(key))
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            if code in _GONE:
                raise FileGone("the file is no longer in the bucket") from err
            raise self._error(err, "download") from err
        except _NET as err:
            raise self._error(err, "download") from err
        body = got["Body"]
        try:
            while True:
                try:
                    block = await body.read(READ)
                except _NET as err:
                    raise self._error(err, "download") from err
                if not block:
                    return
                yield block
        finally:
            body.close()

    async def delete(self, key: str) -> None:
        """See `BlobBackend.delete`."""
        try:
            await self.client.delete_object(Bucket=self.config.bucket, Key=self._object(key))
        except ClientError as err:
            raise self._error(err, "delete") from err
        except _NET as err:
            raise self._error(err, "delete") from err
