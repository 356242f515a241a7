"""Opening a bucket from a URL: bare paths, ``file://``, ``memory://``, ``s3://``, ``gs://``."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

from aurora_store.config import TransferSettings
from aurora_store.errors import ConfigError
from aurora_store.store.base import Bucket


def open_bucket(url: str, *, create: bool = False, settings: TransferSettings | None = None) -> Bucket:
    """Open the bucket at ``url``.

    ``create=True`` creates a missing local directory or memory bucket; cloud buckets are provisioned by
    infrastructure (Terraform), never created here, and a missing one raises :class:`BucketNotFoundError`.
    S3 URLs accept ``?endpoint_url=…&region=…`` (credentials come from the usual AWS environment).
    """
    if not url:
        raise ConfigError("empty bucket URL")
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and url[1:3] in (":\\", ":/")):
        from aurora_store.store.local import LocalBucket

        path = parsed.path if scheme == "file" else url
        if scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"file URLs must be local: {url}")
        return LocalBucket(path, create=create)
    if scheme == "memory":
        from aurora_store.store.memory import MemoryBucket

        return MemoryBucket((parsed.netloc + parsed.path).strip("/") or "default", create=create)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    if scheme == "s3":
        from aurora_store.store.s3 import S3Bucket

        unknown = set(query) - {"endpoint_url", "region"}
        if unknown:
            raise ConfigError(f"unknown S3 URL options {sorted(unknown)} in {url}")
        if not parsed.netloc:
            raise ConfigError(f"S3 URL without a bucket name: {url}")
        return S3Bucket(parsed.netloc, parsed.path, endpoint_url=query.get("endpoint_url"),
                        region=query.get("region"), settings=settings)
    if scheme in ("gs", "gcs"):
        from aurora_store.store.gcs import GCSBucket

        if not parsed.netloc:
            raise ConfigError(f"GCS URL without a bucket name: {url}")
        options: dict[str, Any] = query  # passed through to gcsfs as given (strings)
        return GCSBucket(parsed.netloc, parsed.path, **options)
    raise ConfigError(f"unsupported bucket URL scheme {scheme!r} in {url}")
