"""Fuzzing the reader (issue 17, item 9): valid segments and manifests mutated by hypothesis — bit flips,
length fields, truncation, zstd frames, nesting, numbers — always end in success or an :class:`AuroraError`,
never another exception, and within a memory bound (peak traced allocation per example)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
import tracemalloc

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aurora_store.codec import DeltaManifest, ModelLayout, SegmentRef, stage
from aurora_store.codec.segment import unpack
from aurora_store.errors import AuroraError
from aurora_store.store.snapshot_manifest import SnapshotManifest
from aurora_store.testing.builders import TINY_QWEN3, blobs, encode, perturb, random_state, target_for

LAYOUT = ModelLayout.from_config(TINY_QWEN3)
OLD = random_state(LAYOUT, seed=21)
TARGET0 = target_for(LAYOUT, OLD, version=0)
MANIFEST, SEGMENTS = encode(LAYOUT, OLD, perturb(OLD, 0.03, seed=22), 1, 0, TARGET0.digest)
MEMORY_BOUND = 256 << 20  # a tiny model's delta: anything near this is an allocation driven by hostile input
FUZZ = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INTERESTING_U64 = [0, 1, 2, 3, 7, 255, 4096, 1 << 20, 1 << 30, 1 << 32, 1 << 62, (1 << 63) - 1, (1 << 64) - 1]
_FIXED = struct.Struct("<QQQBBBBQQQQ")


def _chunk_field_offsets(data: bytes) -> list[int]:
    """Byte offsets of every u64 field (lo, hi, count and the four lengths) in the segment's chunk table."""
    offsets, pos = [], 16
    for _ in range(struct.unpack_from("<I", data, 8)[0]):
        (name_len,) = struct.unpack_from("<H", data, pos)
        pos += 2 + name_len
        offsets += [pos + k for k in (0, 8, 16)] + [pos + 28 + 8 * k for k in range(4)]
        pos += _FIXED.size
    return offsets


@st.composite
def mutated_segment(draw) -> tuple[int, bytes]:
    index = draw(st.integers(0, len(SEGMENTS) - 1))
    data = bytearray(SEGMENTS[index].data)
    kind = draw(st.sampled_from(["flip", "byte", "truncate", "extend", "u64", "u32", "frame"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= 1 << draw(st.integers(0, 7))
    elif kind == "byte":
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif kind == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif kind == "extend":
        data += draw(st.binary(min_size=1, max_size=64))
    elif kind == "u64":
        at = draw(st.sampled_from(_chunk_field_offsets(bytes(data))))
        struct.pack_into("<Q", data, at, draw(st.sampled_from(INTERESTING_U64) | st.integers(0, (1 << 64) - 1)))
    elif kind == "u32":  # chunk count or table length
        struct.pack_into("<I", data, draw(st.sampled_from([8, 12])), draw(st.sampled_from(INTERESTING_U64[:9])))
    else:  # replace the first chunk's index stream by a zstd frame declaring some size
        header, index_stream, _ = unpack(bytes(data))[0]
        declared = draw(st.sampled_from([1, header.count, 1 << 16, 1 << 24]))
        frame = zstandard.ZstdCompressor(level=1).compress(bytes(declared))
        start = len(data) - sum(len(s) for _, i, v in unpack(bytes(data)) for s in (i, v))
        data = data[:start] + frame + data[start + len(index_stream):]
        at = _chunk_field_offsets(bytes(data))[4]  # index stored length of chunk 0
        struct.pack_into("<Q", data, at, len(frame))
        data[at - 12] = 1  # index entropy: zstd
    return index, bytes(data)


def _bounded(fn) -> None:
    tracemalloc.start()
    try:
        fn()
    except AuroraError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"peak {peak} bytes"


@FUZZ
@given(mutated_segment(), st.booleans())
def test_mutated_segments_fail_typed_and_bounded(mutation, readdress):
    index, data = mutation
    manifest = MANIFEST
    segments = blobs(SEGMENTS)
    if readdress:  # give the mutated bytes a matching digest, so only the decoder's checks stand in the way
        old = manifest.segments[index]
        ref = SegmentRef(hashlib.sha256(data).hexdigest(), len(data), old.chunks)
        manifest = dataclasses.replace(manifest, segments=tuple(ref if i == index else s
                                                                for i, s in enumerate(manifest.segments)))
        del segments[old.digest]
        segments[ref.digest] = data
    else:
        segments[manifest.segments[index].digest] = data
    target = target_for(LAYOUT, OLD, version=0)
    _bounded(lambda: stage(manifest, segments, target))


_NUMBER = re.compile(rb"(?<=[:\[,])-?\d+")
HOSTILE_NUMBERS = [b"1e400", b"-1e400", b"NaN", b"Infinity", b"-1", b"1.5", b"true", b"null", b'"7"',
                   str(1 << 64).encode(), b"9" * 5000, b"[]", b"{}"]


@st.composite
def mutated_manifest(draw) -> bytes:
    data = bytearray(MANIFEST.to_bytes())
    kind = draw(st.sampled_from(["flip", "truncate", "number", "nest", "duplicate"]))
    if kind == "flip":
        at = draw(st.integers(0, len(data) - 1))
        data[at] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif kind == "number":
        spans = [m.span() for m in _NUMBER.finditer(bytes(data))]
        lo, hi = draw(st.sampled_from(spans))
        data[lo:hi] = draw(st.sampled_from(HOSTILE_NUMBERS) | st.integers(-(1 << 70), 1 << 70).map(
            lambda n: str(n).encode()))
    elif kind == "nest":
        depth = draw(st.sampled_from([10, 40, 1000, 100_000]))
        data = bytearray(data[:-1] + b',"producer":' + b"[" * depth + b"]" * depth + b"}")
    else:  # duplicate keys: the last one wins in JSON parsers; it must still be a valid manifest or refused
        doc = json.loads(bytes(data))
        key = draw(st.sampled_from(sorted(doc)))
        data = bytearray(data[:-1] + b"," + json.dumps(key).encode() + b":" + json.dumps(doc["elements"]).encode()
                         + b"}")
    return bytes(data)


@FUZZ
@given(mutated_manifest())
def test_mutated_manifests_fail_typed_and_bounded(data):
    def run() -> None:
        manifest = DeltaManifest.from_bytes(data)
        stage(manifest, blobs(SEGMENTS), target_for(LAYOUT, OLD, version=0))

    _bounded(run)


SNAPSHOT = {"format": "aurora.snapshot/1", "version": 3, "layout_fingerprint": LAYOUT.fingerprint,
            "weights_digest": str(TARGET0.digest),
            "files": [{"name": "model.safetensors", "sha256": "a" * 64, "size": 10}],
            "weight_files": ["model.safetensors"], "created_at": "", "producer": {"run": "r"}}


@FUZZ
@given(st.data())
def test_mutated_snapshot_manifests_fail_typed(data):
    raw = bytearray(json.dumps(SNAPSHOT).encode())
    spans = [m.span() for m in _NUMBER.finditer(bytes(raw))]
    lo, hi = data.draw(st.sampled_from(spans))
    raw[lo:hi] = data.draw(st.sampled_from(HOSTILE_NUMBERS))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    _bounded(lambda: SnapshotManifest.from_bytes(bytes(raw)))


def test_the_unmutated_inputs_stage():
    stage(MANIFEST, blobs(SEGMENTS), target_for(LAYOUT, OLD, version=0))
    assert DeltaManifest.from_bytes(MANIFEST.to_bytes()) == MANIFEST


@pytest.mark.parametrize("declared", [1 << 30])
def test_a_gib_frame_in_the_fuzzers_shape_is_bounded(declared):
    """The bomb, through the same mutation path (index stream replaced by a frame declaring 1 GiB)."""
    from tests.codec.bombs import bomb_frame, bomb_segment

    bad, segments = bomb_segment(MANIFEST, SEGMENTS, bomb_frame(declared), MANIFEST.segments[0].chunks[0].count)
    _bounded(lambda: stage(bad, segments, target_for(LAYOUT, OLD, version=0)))
