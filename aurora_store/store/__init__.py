"""Object storage is the transport: versioned, content-addressed deltas in local, memory, S3 or GCS buckets."""

from aurora_store.store.base import Bucket, Capabilities
from aurora_store.store.url import open_bucket
from aurora_store.store.versions import DeltaStore

__all__ = ["Bucket", "Capabilities", "DeltaStore", "open_bucket"]
