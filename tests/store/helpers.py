from __future__ import annotations

from aurora_store.codec import CodecParams, DeltaEncoder, DeltaManifest, ModelLayout, pieces_from_states
from aurora_store.codec.digest import WeightsDigest
from aurora_store.store.transfer import PublishReport, publish_delta
from aurora_store.store.versions import DeltaStore


def publish(store: DeltaStore, layout: ModelLayout, old, new, version: int, base_digest: WeightsDigest,
            params: CodecParams | None = None, **kwargs) -> PublishReport:
    encoder = DeltaEncoder(layout, params or CodecParams(segment_bytes=4096))

    def make_manifest(summary, refs):
        return DeltaManifest(
            version=version, base_version=version - 1, layout_fingerprint=layout.fingerprint, codec=encoder.params,
            segments=refs, changed=summary.changed, elements=layout.numel,
            base_weights_digest=str(base_digest), weights_digest=str(base_digest + summary.digest_delta))

    return publish_delta(store, encoder, pieces_from_states(layout, old, new), make_manifest, **kwargs)
