"""Publishing a new version: encode + cut-through upload of one or more parts, then the create-only manifest
and the history row.

There is one path. A single process publishes one part (:meth:`VersionPublisher.publish`); a sharded trainer
uploads one part per rank (:meth:`VersionPublisher.upload_part` on every rank) and one rank writes the
manifest from all of them (:meth:`VersionPublisher.publish_parts`). Both end in the same manifest builder.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aurora_store.codec.encoder import DeltaEncoder, Piece
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest
from aurora_store.codec.params import CodecParams
from aurora_store.codec.sharding import DeltaPart, merge_parts, track_spans
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import IntegrityError
from aurora_store.store import history
from aurora_store.store.pool import shared_pool
from aurora_store.store.transfer import SegmentCallback, UploadReport, upload_segments
from aurora_store.store.versions import DeltaStore

log = logging.getLogger("aurora.publish")
Signer = Callable[[DeltaManifest], DeltaManifest]


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class PublishReport:
    """A published version: its manifest and how long getting there took."""

    manifest: DeltaManifest
    encode_s: float  # CPU time spent encoding (the slowest part's, when several ranks encoded)
    upload_s: float  # from the first segment handed to a stream until the last one is durable (slowest part)
    total_s: float  # from the start of extraction until the manifest is durable
    first_segment_s: float  # when the first segment became durable, from the start

    @property
    def segments(self) -> int:
        return len(self.manifest.segments)

    @property
    def segment_bytes(self) -> int:
        return self.manifest.segment_bytes

    @property
    def manifest_bytes(self) -> int:
        return len(self.manifest.to_bytes())

    @property
    def total_bytes(self) -> int:
        return self.segment_bytes + self.manifest_bytes


@dataclass
class VersionPublisher:
    """Publishes successive versions of one model into one store."""

    store: DeltaStore
    layout: ModelLayout
    params: CodecParams = field(default_factory=CodecParams)
    streams: int | None = None
    producer: Mapping[str, Any] = field(default_factory=dict)
    sign: Signer | None = None
    record_history: bool = True

    def __post_init__(self) -> None:
        self.store.put_layout(self.layout)

    def publish(self, version: int, base_version: int, base_digest: WeightsDigest, pieces: Iterable[Piece], *,
                on_segment: SegmentCallback | None = None, cut_through: bool = True) -> PublishReport:
        """Publish ``version`` from one process: one part covering every tensor, then its manifest.

        ``on_segment`` runs after each segment is durable (e.g. to notify relays); ``cut_through=False``
        encodes everything before uploading (a benchmark baseline). If an upload fails, no manifest is written.
        """
        started = time.perf_counter()
        part, upload = self.upload_part(pieces, on_segment=on_segment, cut_through=cut_through)
        return self.publish_parts(version, base_version, base_digest, [part], encode_s=upload.encode_s,
                                  upload_s=upload.upload_s, started=started,
                                  first_segment_s=upload.first_segment_s)

    def upload_part(self, pieces: Iterable[Piece], *, on_segment: SegmentCallback | None = None,
                    cut_through: bool = True) -> tuple[DeltaPart, UploadReport]:
        """Encode and upload one part's pieces without writing a manifest.

        A sharded trainer calls this on every rank (each with its own upload streams); the returned
        :class:`DeltaPart` is small (segment refs, counts, digest contribution, covered ranges) and is what
        ranks send to the one that calls :meth:`publish_parts`.
        """
        spans: list[tuple[str, int, int]] = []
        upload = upload_segments(self.store, DeltaEncoder(self.layout, self.params), track_spans(pieces, spans),
                                 streams=self.streams, on_segment=on_segment, cut_through=cut_through)
        summary = upload.summary
        return DeltaPart(upload.refs, dict(summary.changed), summary.digest_delta, summary.elements,
                         tuple(spans)), upload

    def publish_parts(self, version: int, base_version: int, base_digest: WeightsDigest, parts: Sequence[DeltaPart],
                      *, encode_s: float = 0.0, upload_s: float = 0.0, started: float | None = None,
                      first_segment_s: float = 0.0) -> PublishReport:
        """Create the manifest of a delta whose segments were uploaded as ``parts`` (all already durable).

        Segments are listed part by part in the given order; the parts must cover every element exactly once
        (:func:`~aurora_store.codec.sharding.merge_parts`). ``encode_s``/``upload_s`` are the callers'
        figures (e.g. the slowest rank's) for the report and history; ``started`` is the
        ``time.perf_counter()`` at which extraction began.
        """
        t0 = time.perf_counter() if started is None else started
        merged = merge_parts(self.layout, parts)
        manifest = DeltaManifest(
            version=version, base_version=base_version, layout_fingerprint=self.layout.fingerprint,
            codec=self.params, segments=merged.segments, changed=dict(merged.changed), elements=self.layout.numel,
            base_weights_digest=str(base_digest), weights_digest=str(base_digest + merged.digest_delta),
            created_at=utc_now(), producer=dict(self.producer))
        if self.sign is not None:
            manifest = self.sign(manifest)
        self._check_segments_durable(manifest)
        self.store.publish_manifest(manifest)
        report = PublishReport(manifest=manifest, encode_s=encode_s, upload_s=upload_s,
                               total_s=time.perf_counter() - t0, first_segment_s=first_segment_s)
        self._published(report)
        return report

    def _check_segments_durable(self, manifest: DeltaManifest) -> None:
        """Right before the manifest is created, every segment it names must exist: segments are
        content-addressed, so one may have been uploaded long ago by another version and be deleted by a gc
        that planned before this version existed. Refusing here keeps "a listed manifest is complete" true."""
        refs = manifest.segments
        lanes = shared_pool().lanes(self.streams or self.store.settings.streams)
        present = [f.result() for f in [lanes.submit(self.store.has_segment, ref.digest) for ref in refs]]
        missing = [ref.digest for ref, ok in zip(refs, present) if not ok]
        if missing:
            raise IntegrityError(f"{len(missing)} segment(s) of version {manifest.version} vanished before its "
                                 f"manifest was created (e.g. {missing[0][:12]}…, a concurrent gc?); not publishing")

    def _published(self, report: PublishReport) -> None:
        """History row and log line of a version whose manifest was just created."""
        version = report.manifest.version
        if self.record_history:
            history.record(self.store, history.row_from_manifest(
                report.manifest, encode_s=report.encode_s, upload_s=report.upload_s, publish_s=report.total_s))
        log.info("published version %d", version, extra={
            "version": version, "base": report.manifest.base_version, "changed": report.manifest.changed_total,
            "density": round(report.manifest.density, 6), "delta_bytes": report.total_bytes,
            "segments": report.segments, "encode_s": round(report.encode_s, 3),
            "publish_s": round(report.total_s, 3)})
