"""Publishing a new version: encode + cut-through upload + create-only manifest + history row."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aurora_store import history
from aurora_store.codec.digest import WeightsDigest
from aurora_store.codec.encoder import DeltaEncoder, EncodeSummary, Piece
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.store.transfer import PublishReport, SegmentCallback, publish_delta
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
        if self.record_history:
            history.record(self.store, history.row_from_manifest(
                report.manifest, encode_s=report.encode_s, upload_s=report.upload_s, publish_s=report.total_s))
        self.store.set_latest_hint(version)
        log.info("published version %d", version, extra={
            "version": version, "base": base_version, "changed": report.manifest.changed_total,
            "density": round(report.manifest.density, 6), "delta_bytes": report.total_bytes,
            "segments": report.segments, "encode_s": round(report.encode_s, 3),
            "publish_s": round(report.total_s, 3)})
        return report
