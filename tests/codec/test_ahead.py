"""Decode-ahead: staging segments as they arrive gives exactly what staging after the manifest gives, and the
manifest still decides (missing, foreign or corrupt segments, a moved target)."""

from __future__ import annotations

import dataclasses

import pytest

from aurora_store.codec import CodecParams, ModelLayout, activate, digest_state, stage
from aurora_store.codec.ahead import AheadStager
from aurora_store.codec.manifest import SegmentRef
from aurora_store.errors import AuroraError, DigestMismatchError, ManifestError
from aurora_store.testing.builders import TINY_QWEN3, blobs, encode, perturb, random_state, target_for

LAYOUT = ModelLayout.from_config(TINY_QWEN3)
PARAMS = CodecParams(segment_bytes=4096)


@pytest.fixture()
def delta():
    old = random_state(LAYOUT, seed=3)
    new = perturb(old, 0.1, seed=4)
    manifest, segments = encode(LAYOUT, old, new, 1, 0, digest_state(LAYOUT, old), PARAMS)
    assert len(segments) >= 3
    return old, new, manifest, segments


def announced(ref: SegmentRef) -> SegmentRef:
    return SegmentRef(ref.digest, ref.size, ())  # a segment event names only digest and size


def test_same_staged_delta_as_staging_after_the_manifest(delta):
    old, new, manifest, segments = delta
    target = target_for(LAYOUT, old, 0)
    ahead = AheadStager(target, dataclasses.replace(PARAMS, segment_bytes=8192))  # other size: decoded again
    for segment in segments[::-1][: len(segments) // 2]:  # any order, half of them before the manifest
        ahead.add(announced(segment.ref), segment.data)
    staged = ahead.finish(manifest, blobs(segments))
    reference = stage(manifest, blobs(segments), target_for(LAYOUT, old, 0))
    assert [u.tensor for u in staged.updates] == [u.tensor for u in reference.updates]
    for got, want in zip(staged.updates, reference.updates):
        assert got.indices.equal(want.indices) and got.bits.equal(want.bits)
        assert got.plan is not None and got.plan.owner is target  # activation is the planned scatter_
    activate(staged, target)
    assert target.version == 1 and target.full_digest() == digest_state(LAYOUT, new)


def test_the_manifest_decides(delta):
    old, _, manifest, segments = delta
    target = target_for(LAYOUT, old, 0)
    ahead = AheadStager(target, PARAMS)
    for segment in segments[1:]:
        ahead.add(announced(segment.ref), segment.data)
    with pytest.raises(ManifestError, match="not supplied"):
        ahead.finish(manifest)
    with pytest.raises(AuroraError):  # a corrupt segment is refused when it arrives
        ahead.add(announced(segments[0].ref), segments[0].data[:-1] + b"\0")
    lying = dataclasses.replace(manifest, weights_digest=str(digest_state(LAYOUT, old)))
    with pytest.raises(DigestMismatchError):
        ahead.finish(lying, blobs(segments))
    target.version = 5  # the target moved on while segments were decoded
    with pytest.raises(AuroraError):
        ahead.finish(manifest, blobs(segments))
