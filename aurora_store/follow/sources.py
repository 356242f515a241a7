"""Where a follower reads one segment from: any number of :class:`SegmentSource` (a relay's hot cache) before
the bucket, each answer checked against the segment's SHA-256 by whoever produced it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from aurora_store.codec.manifest import SegmentRef
from aurora_store.store.versions import DeltaStore


class SegmentSource(Protocol):
    """A place that may hold a segment's bytes before (or besides) the bucket."""

    label: str  # what served a read, in counters and logs ("relay_cache", …)

    def get(self, ref: SegmentRef) -> bytes | None:
        """The segment's bytes, verified against ``ref`` (size and SHA-256); ``None`` on a miss, an error, a
        timeout or wrong bytes — never raises for those: the bucket is read instead."""
        ...


#: The sources to try before ``store`` for one read (e.g. none when ``store`` is the source bucket).
SourcesFor = Callable[[DeltaStore], Sequence[SegmentSource]]
#: Told of every segment read: ``(label, bytes)``, label ``"bucket"`` or a source's.
OnRead = Callable[[str, int], None]


class SegmentReader:
    """Reads one verified segment: each source of ``sources_for(store)`` in turn, then ``store`` itself (whose
    failures raise: the caller falls back to another bucket). Counts bytes by what served them."""

    def __init__(self, sources_for: SourcesFor | None = None, on_read: OnRead | None = None) -> None:
        self._sources_for = sources_for
        self._on_read = on_read
        self._lock = threading.Lock()
        self.bytes_by_source: dict[str, int] = {"bucket": 0}

    def sources(self, store: DeltaStore) -> Sequence[SegmentSource]:
        """The sources tried before ``store`` for a read now."""
        return self._sources_for(store) if self._sources_for is not None else ()

    def read(self, store: DeltaStore, ref: SegmentRef) -> bytes:
        for source in self.sources(store):
            data = source.get(ref)
            if data is not None:
                self._count(source.label, len(data))
                return data
        data = store.get_segment(ref)
        self._count("bucket", len(data))
        return data

    def _count(self, label: str, nbytes: int) -> None:
        with self._lock:  # segments are read on several threads at once
            self.bytes_by_source[label] = self.bytes_by_source.get(label, 0) + nbytes
        if self._on_read is not None:
            self._on_read(label, nbytes)
