"""Decoding allocates only what a chunk's validated ``count`` allows: zstd bombs and absurd raw lengths are
refused with a typed error, before memory is spent on them (issue 17, case 1)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import zstandard

from aurora_store.codec import ModelLayout, stage
from aurora_store.codec.decoder import check_raw_lengths
from aurora_store.codec.params import CodecParams
from aurora_store.codec.segment import ChunkHeader, Entropy, ValueTransform
from aurora_store.errors import CorruptSegmentError
from aurora_store.testing.builders import TINY_QWEN3, encode, perturb, random_state, target_for
from tests.codec.bombs import bomb_frame, bomb_segment

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


def _header(count: int, iraw: int, vraw: int, transform: ValueTransform = ValueTransform.DELTA16) -> ChunkHeader:
    return ChunkHeader("t", 0, 10 * count, count, Entropy.ZSTD, transform, Entropy.ZSTD, iraw, 10, vraw, 10)


@pytest.mark.parametrize(("count", "iraw", "vraw", "transform"), [
    (4, 3, 1, ValueTransform.DELTA16),  # fewer index bytes than values
    (4, 37, 1, ValueTransform.DELTA16),  # more than 9 bytes per value
    (4, 4, 0, ValueTransform.DELTA16),  # value stream shorter than its class table
    (4, 4, 1 + 1 + 9, ValueTransform.DELTA16),  # longer than every element escaped plus side bits
    (4, 4, 7, ValueTransform.RAW),  # RAW is exactly 2·count
    (1, 1, 1 << 62, ValueTransform.DELTA16),
    (1, 1 << 62, 1, ValueTransform.DELTA16),
])
def test_raw_lengths_are_bounded_by_count(count, iraw, vraw, transform):
    params = CodecParams(segment_bytes=4096, values="raw" if transform == ValueTransform.RAW else "delta16")
    with pytest.raises(CorruptSegmentError, match="impossible"):
        check_raw_lengths(_header(count, iraw, vraw, transform), params)


def test_extreme_valid_raw_lengths_pass():
    params = CodecParams(segment_bytes=4096)
    check_raw_lengths(_header(4, 4, 1, ValueTransform.DELTA16), params)
    check_raw_lengths(_header(4, 36, 1 + 1 + 8, ValueTransform.DELTA16), params)
    check_raw_lengths(_header(4, 4, 8, ValueTransform.RAW), CodecParams(segment_bytes=4096, values="raw"))


def test_count_above_the_codec_chunk_size_is_refused():
    params = CodecParams(segment_bytes=4096)
    n = params.max_changed_per_chunk + 1
    with pytest.raises(CorruptSegmentError, match="per chunk"):
        check_raw_lengths(_header(n, n, (n + 3) // 4), params)


def test_frame_must_declare_exactly_the_raw_length():
    old = random_state(LAYOUT, seed=1)
    new = perturb(old, 0.05, seed=2)
    target = target_for(LAYOUT, old, version=0)
    manifest, segments = encode(LAYOUT, old, new, 1, 0, target.digest)
    count = manifest.segments[0].chunks[0].count
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x01" * count)
    for frame, message in [(no_size, "no content size"), (bomb_frame(1 << 20), "declares")]:
        bad_manifest, blobs = bomb_segment(manifest, segments, frame, count)
        with pytest.raises(CorruptSegmentError, match=message):
            stage(bad_manifest, blobs, target)


_PROBE = textwrap.dedent("""
    import json, resource, sys
    from aurora_store.codec import ModelLayout, stage
    from aurora_store.errors import AuroraError
    from aurora_store.testing.builders import TINY_QWEN3, encode, perturb, random_state, target_for
    from tests.codec.bombs import bomb_frame, bomb_segment
    layout = ModelLayout.from_config(TINY_QWEN3)
    old = random_state(layout, seed=1)
    target = target_for(layout, old, version=0)
    manifest, segments = encode(layout, old, perturb(old, 0.05, seed=2), 1, 0, target.digest)
    frame = bomb_frame(1 << 30) if sys.argv[1] == "gib" else bomb_frame(1 << 16, content_size=False)
    raw_len = 1 if sys.argv[1] == "gib" else 1 << 62
    bad, blobs = bomb_segment(manifest, segments, frame, raw_len)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        stage(bad, blobs, target)
        outcome = "accepted"
    except AuroraError as exc:
        outcome = type(exc).__name__
    except MemoryError:
        outcome = "MemoryError"
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"outcome": outcome, "segment_bytes": len(blobs[bad.segments[0].digest]),
                      "grown_kib": grown}))
""")


@pytest.mark.parametrize("kind", ["gib", "huge-raw-length"])
def test_decompression_bomb_is_refused_with_low_peak_memory(kind):
    proc = subprocess.run([sys.executable, "-c", _PROBE, kind], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "CorruptSegmentError", result
    assert result["segment_bytes"] < 64 << 10
    assert result["grown_kib"] < 64 << 10, result  # under 64 MiB of extra peak RSS (1 GiB before)


def test_bomb_builder_really_is_a_bomb():
    frame = bomb_frame(1 << 30)
    assert len(frame) < 40 << 10
    assert zstandard.frame_content_size(frame) == 1 << 30
