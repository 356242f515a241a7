"""Opening a bucket from a URL: the scheme picks the factory (:mod:`aurora_store.store.registry`)."""

from __future__ import annotations

from aurora_store.config import TransferSettings
from aurora_store.store.base import Bucket
from aurora_store.store.registry import open_url


def open_bucket(url: str, *, create: bool = False, settings: TransferSettings | None = None) -> Bucket:
    """Open the bucket at ``url``: a directory (bare path or ``file://``), ``memory://name``,
    ``s3://bucket/prefix``, ``gs://bucket/prefix``, or any scheme registered with
    :func:`~aurora_store.store.register_bucket` or the ``aurora_store.buckets`` entry-point group.

    ``create=True`` creates a missing local directory or memory bucket; cloud buckets are provisioned by
    infrastructure (Terraform), never created here, and a missing one raises :class:`BucketNotFoundError`.
    S3 URLs accept ``?endpoint_url=…&region=…`` (credentials come from the usual AWS environment).
    An unknown scheme is a :class:`~aurora_store.errors.ConfigError` that lists the known ones.
    """
    return open_url(url, create=create, settings=settings)
