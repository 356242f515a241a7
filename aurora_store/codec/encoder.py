"""Extraction and encoding: old/new 16-bit weights → a stream of content-addressed segments.

The change mask is computed on bit patterns (so NaN, -0.0 and inf compare exactly), per piece of an
inference tensor, without materialising fused tensors. Segments are yielded as soon as they are full so
the caller can upload while encoding continues (cut-through).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from aurora_store.codec import leb128
from aurora_store.codec.digest import ZERO, WeightsDigest, hash_elements
from aurora_store.codec.layout import InferenceTensor, ModelLayout, bits_view
from aurora_store.codec.manifest import ChunkRef, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.segment import ChunkHeader, EncodedChunk, Entropy, pack
from aurora_store.codec.values import encode_values
from aurora_store.errors import LayoutError

_MASK_BLOCK = 1 << 24  # elements compared at once when looking for changes


@dataclass(frozen=True)
class Piece:
    """A contiguous run of an inference tensor: flat elements ``[offset, offset + len(old))``."""

    tensor: InferenceTensor
    offset: int
    old: torch.Tensor  # flat int16 bit patterns
    new: torch.Tensor


@dataclass(frozen=True)
class Segment:
    ref: SegmentRef
    data: bytes


@dataclass
class EncodeSummary:
    """Filled in while a :class:`DeltaEncoder` runs; complete once its generator is exhausted."""

    changed: dict[str, int] = field(default_factory=dict)
    digest_delta: WeightsDigest = ZERO
    elements: int = 0
    segments: int = 0
    segment_bytes: int = 0
    index_bytes: int = 0
    value_bytes: int = 0
    encode_seconds: float = 0.0

    @property
    def changed_total(self) -> int:
        return sum(self.changed.values())


def pieces_from_states(layout: ModelLayout, old: Mapping[str, torch.Tensor],
                       new: Mapping[str, torch.Tensor]) -> Iterator[Piece]:
    """Pair up training-layout ``old`` and ``new`` state dicts into pieces, in layout order."""
    old_pieces = layout.pieces(old)
    for (tensor, offset, new_bits), (_, _, old_bits) in zip(layout.pieces(new), old_pieces):
        yield Piece(tensor, offset, old_bits, new_bits)


def pieces_from_fused(layout: ModelLayout, old: Mapping[str, torch.Tensor],
                      new: Mapping[str, torch.Tensor]) -> Iterator[Piece]:
    """Pair up inference-layout tensors into one piece per tensor."""
    for tensor in layout.tensors:
        if tensor.name not in old or tensor.name not in new:
            raise LayoutError(f"inference tensor {tensor.name} missing from old or new state")
        o, n = bits_view(old[tensor.name]), bits_view(new[tensor.name])
        if o.numel() != tensor.numel or n.numel() != tensor.numel:
            raise LayoutError(f"{tensor.name}: expected {tensor.numel} elements")
        yield Piece(tensor, 0, o, n)


class DeltaEncoder:
    """Encodes pieces into segments; iterate :meth:`segments`, then read :attr:`summary`."""

    def __init__(self, layout: ModelLayout, params: CodecParams | None = None) -> None:
        self.layout = layout
        self.params = params or CodecParams()
        self.summary = EncodeSummary()
        self._zstd = zstandard.ZstdCompressor(level=self.params.zstd_level, write_content_size=True)

    def segments(self, pieces: Iterable[Piece]) -> Iterator[Segment]:
        pending: list[EncodedChunk] = []
        pending_bytes = 0
        started = time.perf_counter()
        paused = 0.0  # time spent suspended in yield (the consumer's, not ours)
        for piece in pieces:
            self._check_piece(piece)
            self.summary.elements += piece.old.numel()
            for chunk in self._encode_piece(piece):
                pending.append(chunk)
                pending_bytes += chunk.nbytes
                if pending_bytes >= self.params.segment_bytes:
                    segment = self._seal(pending)
                    pending, pending_bytes = [], 0
                    t0 = time.perf_counter()
                    yield segment
                    paused += time.perf_counter() - t0
        if pending:
            segment = self._seal(pending)
            t0 = time.perf_counter()
            yield segment
            paused += time.perf_counter() - t0
        self.summary.encode_seconds = time.perf_counter() - started - paused

    # --- internals -------------------------------------------------------------------------------

    def _check_piece(self, piece: Piece) -> None:
        tensor = piece.tensor
        if tensor.name not in self.layout:
            raise LayoutError(f"piece of unknown tensor {tensor.name}")
        if piece.old.dtype != torch.int16 or piece.new.dtype != torch.int16:
            raise LayoutError(f"{tensor.name}: pieces must be int16 bit views")
        n = piece.old.numel()
        if piece.new.numel() != n or piece.offset < 0 or piece.offset + n > tensor.numel:
            raise LayoutError(f"{tensor.name}: piece [{piece.offset}, {piece.offset + n}) outside the tensor "
                              f"or old/new sizes differ")

    def _encode_piece(self, piece: Piece) -> Iterator[EncodedChunk]:
        old, new = piece.old, piece.new
        n = old.numel()
        # Compare in blocks: the boolean mask stays bounded (an embedding piece is 10^8+ elements); only the
        # changed indices, proportional to the delta, are kept.
        local = torch.cat([torch.where(old[lo: lo + _MASK_BLOCK] != new[lo: lo + _MASK_BLOCK])[0] + lo
                           for lo in range(0, n, _MASK_BLOCK)]) if n > _MASK_BLOCK else torch.where(old != new)[0]
        if local.numel() == 0:
            return
        name = piece.tensor.name
        old_vals, new_vals = old[local], new[local]
        global_idx = local + piece.offset
        self.summary.changed[name] = self.summary.changed.get(name, 0) + local.numel()
        self.summary.digest_delta = (self.summary.digest_delta + hash_elements(name, global_idx, new_vals)
                                     - hash_elements(name, global_idx, old_vals))
        idx_np = local.numpy()
        old_np, new_np = old_vals.numpy(), new_vals.numpy()
        step = self.params.max_changed_per_chunk
        for start in range(0, idx_np.size, step):
            stop = min(start + step, idx_np.size)
            lo = 0 if start == 0 else int(idx_np[start])
            hi = n if stop == idx_np.size else int(idx_np[stop])
            yield self._encode_chunk(name, piece.offset, lo, hi, idx_np[start:stop],
                                     old_np[start:stop], new_np[start:stop])

    def _encode_chunk(self, name: str, offset: int, lo: int, hi: int, idx: np.ndarray,
                      old: np.ndarray, new: np.ndarray) -> EncodedChunk:
        gaps = np.empty(idx.size, dtype=np.int64)
        gaps[0] = idx[0] - lo
        np.subtract(idx[1:], idx[:-1], out=gaps[1:])
        index_raw = leb128.encode(gaps)
        transform = self.params.value_transform
        value_raw = encode_values(old, new, transform)
        index_entropy, index_bytes = self._compress(index_raw)
        value_entropy, value_bytes = self._compress(value_raw)
        self.summary.index_bytes += len(index_bytes)
        self.summary.value_bytes += len(value_bytes)
        header = ChunkHeader(name, offset + lo, offset + hi, int(idx.size), index_entropy, transform,
                             value_entropy, len(index_raw), len(index_bytes), len(value_raw),
                             len(value_bytes))
        return EncodedChunk(header, index_bytes, value_bytes)

    def _compress(self, raw: bytes) -> tuple[Entropy, bytes]:
        if self.params.use_zstd and len(raw) > 64:
            packed = self._zstd.compress(raw)
            if len(packed) < len(raw):
                return Entropy.ZSTD, packed
        return Entropy.NONE, raw

    def _seal(self, chunks: list[EncodedChunk]) -> Segment:
        data = pack(chunks)
        ref = SegmentRef(hashlib.sha256(data).hexdigest(), len(data),
                         tuple(ChunkRef(c.header.tensor, c.header.lo, c.header.hi, c.header.count)
                               for c in chunks))
        self.summary.segments += 1
        self.summary.segment_bytes += len(data)
        return Segment(ref, data)
