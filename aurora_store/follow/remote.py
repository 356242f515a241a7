"""Targets whose own processes stage a version: an inference engine whose workers each read the version's
segments from the bucket themselves and keep their slice, so that activating it sends a version number, not
the changed elements.

The follower still stages every version itself first (verification and the digest check stay here); it then
asks such a target to stage the verified version on its side (:meth:`StagesRemotely.stage_remote`) and, at the
batch boundary, to write what it holds (:meth:`StagesRemotely.activate_held`). A target that cannot (its
processes cannot reach that bucket, a worker failed) says so and is written the usual way
(:func:`~aurora_store.codec.activate`, every changed element pushed to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from aurora_store.codec.decoder import StagedDelta
from aurora_store.codec.manifest import DeltaManifest
from aurora_store.follow.sources import SegmentSource
from aurora_store.store.versions import DeltaStore


@runtime_checkable
class StagesRemotely(Protocol):
    def stage_remote(self, manifest: DeltaManifest, store: DeltaStore, sources: Sequence[SegmentSource]) -> bool:
        """Have the engine stage ``manifest``'s version (verified by the caller, staged on the target's current
        weights) from ``store``, trying ``sources`` first; ``True`` once it holds it, checked; ``False`` when it
        cannot. Returns only when the engine holds it or gave up; never writes the weights."""
        ...

    def activate_held(self, staged: StagedDelta) -> bool:
        """Write ``staged`` from what the engine holds, advancing version and digest; ``False`` (nothing
        written) when it holds no such version on the current weights. Raises like
        :func:`~aurora_store.codec.activate` when the write fails."""
        ...
