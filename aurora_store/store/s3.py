"""An S3 (or S3-compatible) bucket over boto3: ``s3://bucket/prefix[?endpoint_url=…&region=…]``.

Create-only writes are ``PutObject`` with ``If-None-Match: *``: the server refuses with 412 if the key
exists, so exactly one of several racing writers wins. botocore retries transport errors itself
(standard mode); this module only translates the remaining failures into Aurora's typed errors, naming
the bucket, and marks the ones worth a semantic retry (409 conditional conflicts, 5xx) as
:class:`TransientStoreError`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

from aurora_store.config import TransferSettings
from aurora_store.errors import (
    BucketNotFoundError,
    ConfigError,
    ObjectExistsError,
    ObjectNotFoundError,
    StoreAuthError,
    StoreError,
    TransientStoreError,
)
from aurora_store.store.base import Bucket, Capabilities, check_key
from aurora_store.store.pool import DEFAULT_WORKERS
from aurora_store.store.registry import BucketURL

_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "AllAccessDisabled",
               "ExpiredToken", "InvalidToken"}
_MISSING_KEY_CODES = {"NoSuchKey", "404", "NotFound"}
_URL_OPTIONS = {"endpoint_url", "region"}
#: Bytes read from a response at once by :meth:`S3Bucket.read_into`: small enough to stay in cache for the
#: sink (a SHA-256), large enough that a call's overhead is noise.
READ_PIECE = 1 << 20


def from_url(url: BucketURL, *, create: bool, settings: TransferSettings | None) -> S3Bucket:
    """``s3://bucket/prefix[?endpoint_url=…&region=…]``. ``create`` is not honoured: S3 buckets are provisioned
    by infrastructure, and a missing one is :class:`BucketNotFoundError`."""
    unknown = set(url.query) - _URL_OPTIONS
    if unknown:
        raise ConfigError(f"unknown S3 URL options {sorted(unknown)} in {url.url}")
    if not url.netloc:
        raise ConfigError(f"S3 URL without a bucket name: {url.url}")
    return S3Bucket(url.netloc, url.path, endpoint_url=url.query.get("endpoint_url"), region=url.query.get("region"),
                    settings=settings)


class S3Bucket(Bucket):
    capabilities = Capabilities(atomic_create=True)

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, settings: TransferSettings | None = None,
                 check: bool = True, client: Any = None) -> None:
        settings = settings or TransferSettings()
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        query = f"?endpoint_url={endpoint_url}" if endpoint_url else ""
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/") + query
        self._client_lock = threading.Lock()
        self._client_kwargs = dict(
            endpoint_url=endpoint_url, region_name=region or "us-east-1",
            # One client per bucket, shared by every thread: its connection pool must hold a keep-alive
            # connection for each transfer thread that may use it at once, or connections are closed and
            # reopened (handshake, slow start) under load.
            config=Config(retries={"mode": "standard", "max_attempts": 3},
                          max_pool_connections=max(DEFAULT_WORKERS, 2 * settings.streams),
                          connect_timeout=settings.connect_timeout_s, read_timeout=settings.read_timeout_s),
        )
        self._shared_client = client
        if check:
            self._check_bucket()

    @property
    def client(self) -> Any:
        # One client for every thread (boto3 clients are thread-safe; only making one is not, hence the
        # lock): its pooled connections then outlive any thread and stay warm from one version to the next,
        # where a client per thread took its connections with it whenever a per-call pool's threads ended.
        client = self._shared_client
        if client is None:
            with self._client_lock:
                if self._shared_client is None:
                    self._shared_client = boto3.session.Session().client("s3", **self._client_kwargs)
                client = self._shared_client
        return client

    def fsspec_url(self) -> tuple[str, dict[str, Any]]:
        # s3fs finds credentials where boto3 does (AWS_* environment, profile, instance role).
        options: dict[str, Any] = {"client_kwargs": {"region_name": self._client_kwargs["region_name"]}}
        if self.endpoint_url:
            options["endpoint_url"] = self.endpoint_url
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/"), options

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _check_bucket(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as exc:
            raise self._translate(exc, "open bucket") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise StoreError(f"cannot reach S3 bucket {self.bucket!r} at "
                             f"{self.endpoint_url or 'AWS'}: {exc}") from None

    def _translate(self, exc: botocore.exceptions.ClientError, action: str, key: str | None = None) -> StoreError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        where = f"s3://{self.bucket}/{self._key(key)}" if key else f"S3 bucket {self.bucket!r}"
        message = f"{action} {where}: {code or status} {error.get('Message', '')}".strip()
        if code == "NoSuchBucket" or (key is None and status == 404):
            return BucketNotFoundError(f"S3 bucket {self.bucket!r} does not exist"
                                       f"{' at ' + self.endpoint_url if self.endpoint_url else ''}")
        if code in _AUTH_CODES or status == 403:
            return StoreAuthError(f"S3 rejected the credentials for bucket {self.bucket!r} ({code or status}); "
                                  f"check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the instance role")
        if code in _MISSING_KEY_CODES or status == 404:
            return ObjectNotFoundError(f"{where} does not exist")
        if code == "PreconditionFailed" or status == 412:
            return ObjectExistsError(f"{where} already exists")
        if code == "ConditionalRequestConflict" or status == 409 or status >= 500 or code in (
                "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"):
            return TransientStoreError(message)
        return StoreError(message)

    def _call(self, action: str, key: str | None, fn, **kwargs) -> Any:
        try:
            return fn(**kwargs)
        except botocore.exceptions.ClientError as exc:
            raise self._translate(exc, action, key) from None
        except (botocore.exceptions.ConnectionError, botocore.exceptions.ReadTimeoutError,
                botocore.exceptions.ConnectTimeoutError) as exc:
            raise TransientStoreError(f"{action} s3://{self.bucket}/{key or ''}: {exc}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise StoreError(f"{action} s3://{self.bucket}/{key or ''}: {exc}") from None

    def get(self, key: str, limit: int | None = None) -> bytes:
        # With a limit, a ranged GET: the server sends at most limit + 1 bytes, whatever the object's size.
        extra = {"Range": f"bytes=0-{limit}"} if limit is not None else {}
        try:
            response = self._call("read", key, self.client.get_object, Bucket=self.bucket, Key=self._key(key),
                                  **extra)
        except StoreError as exc:
            if limit is not None and "InvalidRange" in str(exc):  # an empty object has no byte 0
                return b""
            raise
        try:
            body = response["Body"]
            return body.read() if limit is None else body.read(limit + 1)
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            raise TransientStoreError(f"read s3://{self.bucket}/{self._key(key)}: {exc}") from None

    def read_into(self, key: str, buffer: memoryview, sink: Callable[[memoryview], None] | None = None) -> int:
        """A ranged GET streamed into ``buffer`` in :data:`READ_PIECE` pieces, each handed to ``sink`` while it
        is still in cache: no whole-object join of the body's chunks, and a hash needs no second read."""
        if len(buffer) < 1:
            raise ValueError("read_into needs a buffer of at least one byte")
        try:
            response = self._call("read", key, self.client.get_object, Bucket=self.bucket, Key=self._key(key),
                                  Range=f"bytes=0-{len(buffer) - 1}")
        except StoreError as exc:
            if "InvalidRange" in str(exc):  # an empty object has no byte 0
                return 0
            raise
        body = response["Body"]
        pos = 0
        try:
            while pos < len(buffer):
                got = body.readinto(buffer[pos: pos + READ_PIECE])
                if not got:
                    break
                if sink is not None:
                    sink(buffer[pos: pos + got])
                pos += got
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            raise TransientStoreError(f"read s3://{self.bucket}/{self._key(key)}: {exc}") from None
        finally:
            body.close()
        return pos

    def put(self, key: str, data: bytes) -> None:
        self._call("write", key, self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data)

    def create(self, key: str, data: bytes) -> None:
        self._call("create", key, self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data,
                   IfNoneMatch="*")

    def size(self, key: str) -> int:
        head = self._call("stat", key, self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        return int(head["ContentLength"])

    def modified(self, key: str) -> float | None:
        head = self._call("stat", key, self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        stamp = head.get("LastModified")
        return stamp.timestamp() if stamp is not None else None

    def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        full, strip = base + prefix, len(base)
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        extra = {"StartAfter": base + start_after} if start_after else {}
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full, **extra):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", ()))
        except botocore.exceptions.ClientError as exc:
            raise self._translate(exc, "list") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise TransientStoreError(f"list s3://{self.bucket}/{full}: {exc}") from None
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._call("delete", key, self.client.delete_object, Bucket=self.bucket, Key=self._key(key))
