"""Following a run: the one library entry that keeps a set of weights on a published run.

:class:`Follower` owns the sequence every reader needs — sizing, the replay-vs-snapshot plan, fetching on the
process's transfer pool (relay cache and prefetched bytes through :class:`SegmentSource` /
:class:`Prefetcher`), decode-ahead, staging, and activation at the caller's boundary — over a
:class:`BucketChain` (regional bucket, source bucket). No other module sequences those steps.
"""

from aurora_store.follow.ahead import DecodeAhead
from aurora_store.follow.cache import RelayCache
from aurora_store.follow.chain import BAD_COPY_ERRORS, BucketChain
from aurora_store.follow.follower import Bootstrap, Follower, FollowReport, Step
from aurora_store.follow.plan import CatchUpPlan, plan_catch_up
from aurora_store.follow.prefetch import Prefetcher
from aurora_store.follow.sources import SegmentReader, SegmentSource

__all__ = ["BAD_COPY_ERRORS", "Bootstrap", "BucketChain", "CatchUpPlan", "DecodeAhead", "FollowReport", "Follower",
           "Prefetcher", "RelayCache", "SegmentReader", "SegmentSource", "Step", "follow", "plan_catch_up"]


def follow(store, target, goal: int, **kwargs) -> FollowReport:
    """Bring ``target`` (declaring its version and digest) to ``goal`` from ``store`` in one call: the
    shortest form of :meth:`Follower.follow_to` (``verify=``, ``streams=``, ``snapshots=`` pass through)."""
    snapshots = kwargs.pop("snapshots", True)
    follower = Follower(BucketChain(store), **kwargs)
    follower.attach(target)
    return follower.follow_to(goal, snapshots=snapshots)
