"""Publishing a version from every rank at once.

Each rank diffs the bf16 cast of the rows it owns against the rows it published last, encodes them as
pieces of the fused inference layout and uploads its own segments over its own streams, all ranks in
parallel. Only the small per-rank metadata crosses ranks — segment refs in order, per-tensor changed
counts, the digest contribution, the flat ranges covered and timings (a :class:`DeltaPart`, a few KB) — to
rank 0, which writes the manifest (rank 0's segments first, then rank 1's, …) once every segment is
durable, then tells the others the new digest. No parameter is gathered on this path.

Every rank announces its own segments as each becomes durable (cut-through: each rank has a Redis
connection for ``segment`` events; everything else on Redis is rank 0's), so relays and prefetching actors
start copying rank 1's segments while rank 1 is still encoding, not after rank 0 has gathered the parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aurora_store.codec.manifest import SegmentRef
from aurora_store.codec.sharding import DeltaPart, LocalRows, row_pieces
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import AuroraError, RankAborted
from aurora_store.store.publisher import PublishReport, VersionPublisher
from workers.publish.ranks import Ranks


@dataclass(frozen=True)
class RankTiming:
    """One rank's share of a publish: what it encoded and how long extraction + upload took it."""

    rank: int
    changed: int
    segments: int
    segment_bytes: int
    encode_s: float
    upload_s: float
    total_s: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PublishOutcome:
    """What every rank learns from a publish; ``report`` and ``ranks`` only on rank 0."""

    digest: WeightsDigest
    report: PublishReport | None = None
    ranks: tuple[RankTiming, ...] = ()
    metadata_bytes: int = 0  # JSON bytes this rank saw cross ranks (gathered to rank 0, plus the acknowledgement)


class RankPublisher:
    """Runs :meth:`publish` on every rank, each announcing its own segments; rank 0 writes the manifest."""

    def __init__(self, ranks: Ranks, publisher: VersionPublisher,
                 announce: Callable[[SegmentRef], None] | None = None) -> None:
        self.ranks = ranks
        self.publisher = publisher
        self.announce = announce

    def publish(self, version: int, base_version: int, base_digest: WeightsDigest,
                old: Mapping[str, LocalRows], new: Mapping[str, LocalRows]) -> PublishOutcome:
        """Upload this rank's part of ``version`` (``old`` → ``new`` rows); rank 0 creates the manifest."""
        started = time.perf_counter()
        before = sum(self.ranks.traffic.values())
        part, upload = self.publisher.upload_part(row_pieces(self.publisher.layout, old, new),
                                                  on_segment=self.announce)
        timing = RankTiming(self.ranks.rank, sum(part.changed.values()), len(part.segments), upload.segment_bytes,
                            upload.encode_s, upload.upload_s, time.perf_counter() - started)
        gathered = self.ranks.gather({"part": part.to_json(), "timing": timing.to_json()}, "publish")
        report, failure = None, None
        timings: tuple[RankTiming, ...] = ()
        if gathered is not None:
            try:
                parts = [DeltaPart.from_json(doc["part"]) for doc in gathered]
                timings = tuple(RankTiming(**doc["timing"]) for doc in gathered)
                report = self.publisher.publish_parts(
                    version, base_version, base_digest, parts, started=started,
                    encode_s=max(t.encode_s for t in timings), upload_s=max(t.upload_s for t in timings),
                    first_segment_s=upload.first_segment_s)
            except AuroraError as exc:
                if not self.ranks.sharded:
                    raise
                failure = exc
        ack = self.ranks.broadcast({"digest": str(report.manifest.weights_digest) if report else None,
                                    "error": f"rank 0 could not publish version {version}: {failure}"
                                    if failure else None}, "publish_ack")
        if failure is not None:
            raise failure
        if ack["error"]:
            raise RankAborted(ack["error"])
        return PublishOutcome(WeightsDigest.parse(ack["digest"]), report, timings,
                              sum(self.ranks.traffic.values()) - before)
