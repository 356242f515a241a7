"""Object storage is the transport: versioned, content-addressed deltas in local, memory, S3 or GCS buckets —
or any bucket registered under a URL scheme (:func:`register_bucket`, entry-point group ``aurora_store.buckets``)."""

from aurora_store.store.base import Bucket, Capabilities
from aurora_store.store.registry import BucketURL, register_bucket, registered_schemes
from aurora_store.store.url import open_bucket
from aurora_store.store.versions import DeltaStore

__all__ = ["Bucket", "BucketURL", "Capabilities", "DeltaStore", "open_bucket", "register_bucket",
           "registered_schemes"]
