"""Hostile segments for the bounded-decoding tests: small zstd frames that inflate to a lot."""

from __future__ import annotations

import dataclasses
import hashlib

import zstandard

from aurora_store.codec import DeltaManifest, SegmentRef
from aurora_store.codec.encoder import Segment
from aurora_store.codec.segment import EncodedChunk, Entropy, pack, unpack


def bomb_frame(size: int, *, content_size: bool = True) -> bytes:
    """A zstd frame of ``size`` zero bytes (1 GiB → ~32 KB), built in 4 MiB steps so building it is cheap."""
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    stream = compressor.compressobj(size=size if content_size else -1)
    step = min(size, 4 << 20)
    zeros = bytes(step)
    parts = [stream.compress(zeros) for _ in range(size // step)]
    parts.append(stream.compress(bytes(size % step)))
    parts.append(stream.flush())
    return b"".join(parts)


def bomb_segment(manifest: DeltaManifest, segments: list[Segment], frame: bytes,
                 index_raw_len: int) -> tuple[DeltaManifest, dict[str, bytes]]:
    """``manifest`` with its first segment's first chunk index stream replaced by ``frame`` (declared raw
    length ``index_raw_len``), re-addressed so digests match: only the decoder's bounds can refuse it."""
    parts = unpack(segments[0].data)
    header, _, values = parts[0]
    bombed = dataclasses.replace(header, index_entropy=Entropy.ZSTD, index_raw_len=index_raw_len,
                                 index_len=len(frame))
    chunks = [EncodedChunk(bombed, frame, bytes(values))]
    chunks += [EncodedChunk(h, bytes(i), bytes(v)) for h, i, v in parts[1:]]
    data = pack(chunks)
    first = manifest.segments[0]
    ref = SegmentRef(hashlib.sha256(data).hexdigest(), len(data), first.chunks)
    bad = dataclasses.replace(manifest, segments=(ref, *manifest.segments[1:]))
    blobs = {s.ref.digest: s.data for s in segments[1:]}
    blobs[ref.digest] = data
    return bad, blobs
