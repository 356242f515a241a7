"""Corrupted, truncated, out-of-range, wrong-base, wrong-layout input: typed errors, target untouched."""

import dataclasses
import hashlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.codec import DeltaManifest, ModelLayout, SegmentRef, activate, apply_delta, stage
from aurora_store.codec.segment import EncodedChunk, pack, unpack
from aurora_store.errors import (
    AuroraError,
    BaseVersionMismatchError,
    CorruptSegmentError,
    DigestMismatchError,
    LayoutMismatchError,
    ManifestError,
)
from aurora_store.testing.builders import TINY_QWEN3, blobs, encode, perturb, random_state, target_for

LAYOUT = ModelLayout.from_config(TINY_QWEN3)
OLD = random_state(LAYOUT, seed=7)
NEW = perturb(OLD, 0.05, seed=8)


@pytest.fixture()
def fresh():
    target = target_for(LAYOUT, OLD, version=0)
    manifest, segments = encode(LAYOUT, OLD, NEW, 1, 0, target.digest)
    return target, manifest, segments


def snapshot_bits(target):
    return {t.name: target.fused_bits(t.name).clone() for t in LAYOUT.tensors}


def assert_untouched(target, before, digest):
    assert target.version == 0
    assert target.digest == digest
    for name, bits in before.items():
        assert torch.equal(target.fused_bits(name), bits), name
    assert target.full_digest() == digest


def rehash(manifest: DeltaManifest, index: int, data: bytes) -> DeltaManifest:
    """A manifest whose segment ``index`` is replaced by ``data`` (so digests match)."""
    old = manifest.segments[index]
    ref = SegmentRef(hashlib.sha256(data).hexdigest(), len(data), old.chunks)
    segs = list(manifest.segments)
    segs[index] = ref
    return dataclasses.replace(manifest, segments=tuple(segs))


def test_bit_flipped_segment_is_rejected(fresh):
    target, manifest, segments = fresh
    before, digest = snapshot_bits(target), target.digest
    data = bytearray(segments[0].data)
    data[len(data) // 2] ^= 0x01
    with pytest.raises(CorruptSegmentError):
        apply_delta(manifest, {segments[0].ref.digest: bytes(data), **blobs(segments[1:])}, target)
    assert_untouched(target, before, digest)


def test_truncated_segment_is_rejected(fresh):
    target, manifest, segments = fresh
    before, digest = snapshot_bits(target), target.digest
    with pytest.raises(CorruptSegmentError):
        apply_delta(manifest, {**blobs(segments), segments[-1].ref.digest: segments[-1].data[:-3]}, target)
    assert_untouched(target, before, digest)


def test_missing_segment_is_rejected(fresh):
    target, manifest, segments = fresh
    before, digest = snapshot_bits(target), target.digest
    with pytest.raises(ManifestError, match="not supplied"):
        apply_delta(manifest, blobs(segments[:-1]), target)
    assert_untouched(target, before, digest)


def test_wrong_base_version_is_rejected(fresh):
    target, manifest, segments = fresh
    target.version = 5
    with pytest.raises(BaseVersionMismatchError):
        stage(manifest, blobs(segments), target)


def test_wrong_base_weights_are_rejected(fresh):
    _, manifest, segments = fresh
    other = target_for(LAYOUT, NEW, version=0)  # right version number, different weights
    before, digest = snapshot_bits(other), other.digest
    with pytest.raises(BaseVersionMismatchError, match="digest"):
        apply_delta(manifest, blobs(segments), other)
    for name, bits in before.items():
        assert torch.equal(other.fused_bits(name), bits)
    assert other.digest == digest


def test_wrong_layout_fingerprint_is_rejected(fresh):
    target, manifest, segments = fresh
    before, digest = snapshot_bits(target), target.digest
    bad = dataclasses.replace(manifest, layout_fingerprint="sha256:" + "0" * 64)
    with pytest.raises(LayoutMismatchError):
        apply_delta(bad, blobs(segments), target)
    assert_untouched(target, before, digest)


def test_wrong_weights_digest_is_rejected_before_any_write(fresh):
    target, manifest, segments = fresh
    before, digest = snapshot_bits(target), target.digest
    bad = dataclasses.replace(manifest, weights_digest="lthash128:" + "1" * 32)
    with pytest.raises(DigestMismatchError):
        apply_delta(bad, blobs(segments), target)
    assert_untouched(target, before, digest)


def test_out_of_range_index_is_rejected_even_with_valid_digests(fresh):
    target, manifest, segments = fresh
    before, digest = snapshot_bits(target), target.digest
    parts = unpack(segments[0].data)
    header, idx, val = parts[0]
    numel = LAYOUT[header.tensor].numel
    # Shift the chunk so its last index lands past the end of the tensor.
    shifted = dataclasses.replace(header, lo=numel - 1, hi=numel - 1 + (header.hi - header.lo))
    chunks = [EncodedChunk(shifted, bytes(idx), bytes(val))]
    chunks += [EncodedChunk(h, bytes(i), bytes(v)) for h, i, v in parts[1:]]
    data = pack(chunks)
    bad = rehash(manifest, 0, data)
    ref = bad.segments[0]
    bad = dataclasses.replace(bad, segments=(dataclasses.replace(ref, chunks=tuple(
        dataclasses.replace(c, lo=shifted.lo, hi=shifted.hi) if i == 0 else c
        for i, c in enumerate(ref.chunks))), *bad.segments[1:]))
    with pytest.raises(CorruptSegmentError, match=r"exceeds|out of range"):
        apply_delta(bad, {**blobs(segments), ref.digest: data}, target)
    assert_untouched(target, before, digest)


def test_unknown_manifest_format_and_garbage_are_rejected():
    with pytest.raises(ManifestError):
        DeltaManifest.from_bytes(b'{"format": "aurora.delta/99"}')
    with pytest.raises(ManifestError):
        DeltaManifest.from_bytes(b"not json")
    with pytest.raises(ManifestError):
        DeltaManifest.from_bytes(b"[1, 2]")


def test_inconsistent_manifest_counts_are_rejected(fresh):
    _, manifest, _ = fresh
    doc = manifest.to_json()
    name = next(iter(doc["changed"]))
    doc["changed"][name] += 1
    with pytest.raises(ManifestError, match="counts"):
        DeltaManifest.from_json(doc)


def test_activation_refuses_a_target_that_moved_since_staging(fresh):
    target, manifest, segments = fresh
    staged = stage(manifest, blobs(segments), target)
    target.version = 9
    with pytest.raises(BaseVersionMismatchError):
        activate(staged, target)


@given(st.data())
def test_random_corruption_never_escapes_as_an_untyped_error_nor_touches_weights(data):
    target = target_for(LAYOUT, OLD, version=0)
    manifest, segments = encode(LAYOUT, OLD, NEW, 1, 0, target.digest)
    index = data.draw(st.integers(0, len(segments) - 1))
    raw = bytearray(segments[index].data)
    mode = data.draw(st.sampled_from(["flip", "truncate", "extend", "splice"]))
    if mode == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            pos = data.draw(st.integers(0, len(raw) - 1))
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif mode == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif mode == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=16))
    else:
        pos = data.draw(st.integers(0, len(raw)))
        raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    raw = bytes(raw)
    before, digest = snapshot_bits(target), target.digest
    # Re-hash so the corruption reaches the parser instead of stopping at the digest check.
    bad = rehash(manifest, index, raw)
    supplied = {**blobs(segments), bad.segments[index].digest: raw}
    try:
        apply_delta(bad, supplied, target)
    except AuroraError:
        assert_untouched(target, before, digest)
    else:  # only possible if the change was semantically a no-op; then weights must be the new ones
        assert target.digest == target.full_digest()
        assert str(target.digest) == manifest.weights_digest
