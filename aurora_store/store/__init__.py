"""Object storage is the transport: versioned, content-addressed deltas in local, memory, S3 or GCS buckets."""

from aurora_store.store.base import Bucket, Capabilities
from aurora_store.store.catchup import CatchUpPlan, plan_catch_up
from aurora_store.store.registry import BucketURL, register_bucket, registered_schemes
from aurora_store.store.url import open_bucket
from aurora_store.store.versions import DeltaStore

__all__ = ["Bucket", "BucketURL", "Capabilities", "CatchUpPlan", "DeltaStore", "open_bucket", "plan_catch_up",
           "register_bucket", "registered_schemes"]
