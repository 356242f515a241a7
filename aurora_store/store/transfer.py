"""Streaming, multi-stream transfer of deltas.

Uploading is cut-through: each segment is handed to one of ``S`` upload streams the moment the encoder
yields it, while encoding continues (the manifest is written by :mod:`aurora_store.store.publisher` only
after every segment is durable).
Fetching downloads a version's segments over ``S`` streams and yields each as soon as it has arrived and
matched its digest (mismatches are re-fetched once, then raise).
Both run on the process's one long-lived transfer pool (:mod:`aurora_store.store.pool`), ``S`` calls at a
time, so the connections of one version are still open — past the handshake and slow start — for the next.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Protocol

from aurora_store.codec.encoder import DeltaEncoder, EncodeSummary, Piece, Segment
from aurora_store.codec.manifest import SegmentRef
from aurora_store.progress import Progress
from aurora_store.store.pool import TransferPool, shared_pool
from aurora_store.store.versions import DeltaStore

SegmentCallback = Callable[[SegmentRef], None]


@dataclass(frozen=True)
class UploadReport:
    """Segments encoded and made durable, without a manifest (see :func:`upload_segments`)."""

    refs: tuple[SegmentRef, ...]
    summary: EncodeSummary  # what the encoder produced, including its own CPU seconds
    upload_s: float  # from the first segment handed to a stream until the last one is durable
    total_s: float  # from the start of extraction until the last segment is durable
    first_segment_s: float  # when the first segment became durable, from the start

    @property
    def encode_s(self) -> float:
        """CPU time spent encoding (excluding waits for upload slots)."""
        return self.summary.encode_seconds

    @property
    def segment_bytes(self) -> int:
        return sum(r.size for r in self.refs)


def upload_segments(store: DeltaStore, encoder: DeltaEncoder, pieces: Iterable[Piece], *,
                    streams: int | None = None, on_segment: SegmentCallback | None = None,
                    cut_through: bool = True, pool: TransferPool | None = None) -> UploadReport:
    """Encode ``pieces`` and upload each segment over one of ``streams`` streams as soon as it exists.

    ``on_segment`` runs (on an upload thread) after each segment is durable — e.g. to notify relays.
    ``cut_through=False`` encodes everything first and uploads afterwards (the baseline benchmarks compare
    against). If any upload fails, encoding stops and the error propagates. Every publisher — one process or
    every rank of a sharded trainer — goes through here; the manifest is written afterwards
    (:meth:`~aurora_store.store.publisher.VersionPublisher.publish_parts`). ``pool`` defaults to the
    process's shared transfer pool.
    """
    streams = streams or store.settings.streams
    started = time.perf_counter()
    refs: list[SegmentRef] = []
    first_durable: list[float] = []
    upload_started: list[float] = []
    slots = threading.BoundedSemaphore(2 * streams)  # bound memory: the encoder runs ≤ 2S segments ahead

    def upload(segment: Segment) -> None:
        try:
            store.put_segment(segment.ref, segment.data)
            if not first_durable:
                first_durable.append(time.perf_counter() - started)
            if on_segment is not None:
                on_segment(segment.ref)
        finally:
            slots.release()

    lanes = (pool or shared_pool()).lanes(streams)
    pending: set[Future] = set()
    try:
        segments: Iterable[Segment] = encoder.segments(pieces)
        if not cut_through:
            segments = list(segments)
        for segment in segments:
            refs.append(segment.ref)
            slots.acquire()
            if not upload_started:
                upload_started.append(time.perf_counter())
            try:
                pending.add(lanes.submit(upload, segment))
            except BaseException:
                slots.release()
                raise
            done = {f for f in pending if f.done()}
            for future in done:
                future.result()  # fail fast: stop encoding once an upload has failed
            pending -= done
        for future in pending:
            future.result()
    finally:  # on failure: drop what has not started, wait for what has (it holds the segment's bytes)
        for future in pending:
            if future.cancel():
                slots.release()
        wait(pending)
    uploaded = time.perf_counter()
    return UploadReport(
        refs=tuple(refs), summary=encoder.summary,
        upload_s=(uploaded - upload_started[0]) if upload_started else 0.0, total_s=uploaded - started,
        first_segment_s=first_durable[0] if first_durable else uploaded - started)


class HeldSegments(Protocol):
    """Segments fetched ahead of their manifest (an actor's prefetcher): what a fetch takes before reading."""

    def claim(self, version: int, refs: Sequence[SegmentRef]) -> tuple[dict[str, bytes], dict[str, Future[bool]]]:
        """The bytes held for ``refs`` (taken), and fetches of them still in flight (``True`` once held)."""
        ...

    def take(self, digest: str) -> bytes | None:
        """A held segment's bytes (taken), or ``None``."""
        ...


def fetch_segments(store: DeltaStore, refs: Iterable[SegmentRef], *, streams: int | None = None,
                   read: Callable[[SegmentRef], bytes] | None = None,
                   held: HeldSegments | None = None, version: int | None = None,
                   progress: Progress | None = None,
                   on_fetched: Callable[[SegmentRef, int], None] | None = None,
                   pool: TransferPool | None = None) -> Iterator[tuple[SegmentRef, bytes]]:
    """Fetch segments over ``streams`` parallel streams; yield ``(ref, bytes)`` as each arrives verified.

    The one segment-fetch path of the project. ``read`` reads one segment, verified (default:
    ``store.get_segment``; a follower passes its relay cache → bucket reader). With ``held`` (and the
    ``version`` the refs belong to), segments fetched ahead are taken first, fetches of them still in flight
    are awaited here — never on a pool thread, never downloaded twice — and only the rest is read.
    ``on_fetched`` and ``progress`` see what is read, not what was held. ``pool`` defaults to the process's
    shared transfer pool. Closing the iterator early cancels the reads not yet started.
    """
    streams = streams or store.settings.streams
    read = read or store.get_segment
    refs = list(refs)
    if not refs:
        return
    by_digest = {ref.digest: ref for ref in refs}
    claimed, pending = held.claim(version if version is not None else -1, refs) if held is not None else ({}, {})
    for digest, data in claimed.items():
        yield by_digest[digest], data
    rest = [ref for ref in by_digest.values() if ref.digest not in claimed]
    if not rest:
        return
    lanes = (pool or shared_pool()).lanes(min(streams, len(rest)))
    reads: dict[Future, SegmentRef] = {}
    waits: dict[Future, SegmentRef] = {}
    for ref in rest:
        if ref.digest in pending:
            waits[pending[ref.digest]] = ref
        else:
            reads[lanes.submit(read, ref)] = ref
    try:
        while reads or waits:
            done, _ = wait(set(reads) | set(waits), return_when=FIRST_COMPLETED)
            for future in done:
                if future in waits:  # a prefetch finished: take its bytes, or read the segment after all
                    ref = waits.pop(future)
                    taken = held.take(ref.digest) if future.result() and held is not None else None
                    if taken is None:
                        reads[lanes.submit(read, ref)] = ref
                        continue
                    yield ref, taken
                    continue
                ref = reads.pop(future)
                data = future.result()
                if progress is not None:
                    progress.advance(len(data))
                if on_fetched is not None:
                    on_fetched(ref, len(data))
                yield ref, data
    finally:
        for future in reads:
            future.cancel()
