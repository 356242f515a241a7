"""What a follower fetches a manifest's segments with, for tests that stage by hand."""

from __future__ import annotations

from aurora_store.store import DeltaStore
from aurora_store.store.transfer import HeldSegments, fetch_segments


def staging_fetcher(store: DeltaStore, streams: int, held: HeldSegments | None = None, read=None):
    """Held segments first, then those still in flight (awaited), the rest read (default: from ``store``)."""
    def fetch(version, refs):
        return fetch_segments(store, refs, streams=streams, read=read, held=held, version=version)
    return fetch
