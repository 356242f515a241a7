"""Publishing a new version: encode + cut-through upload + create-only manifest + history row."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aurora_store import history
from aurora_store.codec.digest import WeightsDigest
from aurora_store.codec.encoder import DeltaEncoder, EncodeSummary, Piece
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.sharding import DeltaPart, merge_parts, track_spans
from aurora_store.store.transfer import PublishReport, SegmentCallback, UploadReport, publish_delta, upload_segments
from aurora_store.store.versions import DeltaStore

log = logging.getLogger("aurora.publish")
Signer = Callable[[DeltaManifest], DeltaManifest]


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


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
        encoder = DeltaEncoder(self.layout, self.params)

        def make_manifest(summary: EncodeSummary, refs: tuple[SegmentRef, ...]) -> DeltaManifest:
            manifest = DeltaManifest(
                version=version, base_version=base_version, layout_fingerprint=self.layout.fingerprint,
                codec=self.params, segments=refs, changed=dict(summary.changed), elements=self.layout.numel,
                base_weights_digest=str(base_digest), weights_digest=str(base_digest + summary.digest_delta),
                created_at=utc_now(), producer=dict(self.producer))
            return self.sign(manifest) if self.sign is not None else manifest

        report = publish_delta(self.store, encoder, pieces, make_manifest, streams=self.streams,
                               on_segment=on_segment, cut_through=cut_through)
        self._published(report)
        return report

    def upload_part(self, pieces: Iterable[Piece], *,
                    on_segment: SegmentCallback | None = None) -> tuple[DeltaPart, UploadReport]:
        """Encode and upload one rank's pieces without writing a manifest.

        A sharded trainer calls this on every rank (each with its own upload streams); the returned
        :class:`DeltaPart` is small (segment refs, counts, digest contribution, covered ranges) and is what
        ranks send to the one that calls :meth:`publish_parts`.
        """
        spans: list[tuple[str, int, int]] = []
        upload = upload_segments(self.store, DeltaEncoder(self.layout, self.params), track_spans(pieces, spans),
                                 streams=self.streams, on_segment=on_segment)
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
        self.store.publish_manifest(manifest)
        report = PublishReport(manifest=manifest, segments=len(manifest.segments), segment_bytes=manifest.segment_bytes,
                               manifest_bytes=len(manifest.to_bytes()), encode_s=encode_s, upload_s=upload_s,
                               total_s=time.perf_counter() - t0, first_segment_s=first_segment_s)
        self._published(report)
        return report

    def _published(self, report: PublishReport) -> None:
        """History row, latest hint and log line of a version whose manifest was just created."""
        version = report.manifest.version
        if self.record_history:
            history.record(self.store, history.row_from_manifest(
                report.manifest, encode_s=report.encode_s, upload_s=report.upload_s, publish_s=report.total_s))
        self.store.set_latest_hint(version)
        log.info("published version %d", version, extra={
            "version": version, "base": report.manifest.base_version, "changed": report.manifest.changed_total,
            "density": round(report.manifest.density, 6), "delta_bytes": report.total_bytes,
            "segments": report.segments, "encode_s": round(report.encode_s, 3),
            "publish_s": round(report.total_s, 3)})
