"""Extraction and encoding: old/new 16-bit weights → a stream of content-addressed segments.

The change mask is computed on bit patterns (so NaN, -0.0 and inf compare exactly), per piece of an
inference tensor, without materialising fused tensors. Segments are yielded as soon as they are full so
the caller can upload while encoding continues (cut-through).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from aurora_store.codec import kernels
from aurora_store.codec.device_encode import ChunkSpan, DeviceEncoding, PieceStreams
from aurora_store.codec.extract import Changes, host_changes
from aurora_store.codec.layout import InferenceTensor, ModelLayout, bits_view
from aurora_store.codec.manifest import ChunkRef, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.segment import ChunkHeader, EncodedChunk, Entropy, ValueTransform, pack
from aurora_store.codec.values import encode_values
from aurora_store.codec.weights_digest import ZERO, WeightsDigest
from aurora_store.errors import LayoutError


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


#: ``auto``: where the pieces live — on the host for CPU tensors (the reference path), with torch ops on
#: the device otherwise; ``host`` / ``device`` force one (``device`` on CPU tensors runs the GPU code there).
EXTRACTIONS = ("auto", "host", "device")

#: One chunk's encoding: a function and its arguments, run on an encoding thread.
_Task = tuple[Callable[..., EncodedChunk], tuple]


class DeltaEncoder:
    """Encodes pieces into segments; iterate :meth:`segments`, then read :attr:`summary`.

    ``host``: extraction (bit compare, changed-index and bits gather, digest update) in compiled host
    kernels (:mod:`.extract`), then gaps, LEB128 and the value transform per chunk (:mod:`.kernels`).
    ``device``: all of that with torch ops where the pieces live (:mod:`.device_encode`); only each piece's
    raw streams reach the host. Either way zstd, packing and SHA-256 run on the host, and both give
    byte-identical segments."""

    def __init__(self, layout: ModelLayout, params: CodecParams | None = None, *,
                 extraction: str = "auto", encode_threads: int | None = None) -> None:
        if extraction not in EXTRACTIONS:
            raise ValueError(f"extraction must be one of {EXTRACTIONS}, not {extraction!r}")
        if encode_threads is not None and encode_threads < 1:
            raise ValueError(f"encode_threads must be ≥ 1, not {encode_threads}")
        self.layout = layout
        self.extraction = extraction
        self.encode_threads = encode_threads
        self.params = params or CodecParams()
        self.summary = EncodeSummary()
        self._local = threading.local()

    def segments(self, pieces: Iterable[Piece]) -> Iterator[Segment]:
        pending: list[EncodedChunk] = []
        pending_bytes = 0
        started = time.perf_counter()
        paused = 0.0  # time spent suspended in yield (the consumer's, not ours)
        tasks, device = self._tasks(pieces)
        for chunk in self._chunks(tasks, self._threads()):
            pending.append(chunk)
            pending_bytes += chunk.nbytes
            if pending_bytes >= self.params.segment_bytes:
                segment = self._seal(pending)
                pending, pending_bytes = [], 0
                t0 = time.perf_counter()
                yield segment
                paused += time.perf_counter() - t0
        if device is not None:
            self.summary.digest_delta = self.summary.digest_delta + device.digest_delta()
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
        if piece.new.device.type == "meta":
            raise LayoutError(f"{tensor.name}: meta tensors hold no bits to extract a delta from")
        if piece.old.device != piece.new.device:
            raise LayoutError(f"{tensor.name}: old bits on {piece.old.device}, new bits on {piece.new.device}")
        if piece.new.numel() != n or piece.offset < 0 or piece.offset + n > tensor.numel:
            raise LayoutError(f"{tensor.name}: piece [{piece.offset}, {piece.offset + n}) outside the tensor "
                              f"or old/new sizes differ")

    def _tasks(self, pieces: Iterable[Piece]) -> tuple[Iterator[_Task], DeviceEncoding | None]:
        """Each chunk's encoding task, in order, from changes found where the pieces live: on the host (see
        :mod:`.extract`), or raw streams built on the device (see :mod:`.device_encode`)."""
        checked = (self._checked(piece) for piece in pieces)
        first = next(checked, None)
        if first is None:
            return iter(()), None
        rest = itertools.chain([first], checked)
        on_device = first.new.device.type != "cpu"
        if self.extraction == "device" or (self.extraction == "auto" and on_device):
            device = DeviceEncoding(((p.tensor, p.offset, p.old, p.new) for p in rest),
                                    step=self.params.max_changed_per_chunk, transform=self.params.value_transform)
            return (task for streams in device for task in self._stream_tasks(streams)), device
        return self._host_tasks(rest), None

    def _threads(self) -> int:
        """Host threads for extraction (host path) and chunk encoding: the compiled compare and numpy's passes
        and zstd release the GIL, so blocks and chunks run in parallel; the output does not depend on the
        count (blocks and chunks are put back in order)."""
        if self.encode_threads is not None:
            return self.encode_threads
        return kernels.DEFAULT_THREADS

    def _chunks(self, tasks: Iterable[_Task], threads: int) -> Iterator[EncodedChunk]:
        """Encoded chunks in order. With several threads, chunks are encoded ahead (at most ``2 × threads``
        in flight, bounding memory) and yielded in submission order, so the output is byte-identical."""
        if threads == 1:
            for fn, args in tasks:
                yield self._account(fn(*args))
            return
        window: deque[Future[EncodedChunk]] = deque()
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="aurora-encode") as pool:
            for fn, args in tasks:
                window.append(pool.submit(fn, *args))
                while len(window) > 2 * threads:
                    yield self._account(window.popleft().result())
            while window:
                yield self._account(window.popleft().result())

    def _account(self, chunk: EncodedChunk) -> EncodedChunk:
        """Summary sizes are added here, in the consumer's thread, never by encoding threads."""
        self.summary.index_bytes += len(chunk.index_bytes)
        self.summary.value_bytes += len(chunk.value_bytes)
        return chunk

    def _checked(self, piece: Piece) -> Piece:
        self._check_piece(piece)
        self.summary.elements += piece.old.numel()
        return piece

    def _host_tasks(self, pieces: Iterable[Piece]) -> Iterator[_Task]:
        found = host_changes(((p.tensor, p.offset, p.old, p.new) for p in pieces), threads=self._threads())
        for changes, delta in found:
            self.summary.digest_delta = self.summary.digest_delta + delta
            yield from self._chunk_tasks(changes)

    def _chunk_tasks(self, changes: Changes) -> Iterator[_Task]:
        """The ``_encode_chunk`` task of each chunk of ``changes`` (≤ ``max_changed_per_chunk`` each)."""
        idx_np, old_np, new_np = changes.indices, changes.old, changes.new
        if idx_np.size == 0:
            return
        name = changes.tensor.name
        self.summary.changed[name] = self.summary.changed.get(name, 0) + int(idx_np.size)
        step = self.params.max_changed_per_chunk
        n = changes.numel
        for start in range(0, idx_np.size, step):
            stop = min(start + step, idx_np.size)
            lo = 0 if start == 0 else int(idx_np[start])
            hi = n if stop == idx_np.size else int(idx_np[stop])
            yield self._encode_chunk, (name, changes.offset, lo, hi, idx_np[start:stop], old_np[start:stop],
                                       new_np[start:stop])

    def _stream_tasks(self, streams: PieceStreams) -> Iterator[_Task]:
        """The ``_seal_chunk`` task of each chunk of a piece whose raw streams were built on the device."""
        name = streams.tensor.name
        self.summary.changed[name] = self.summary.changed.get(name, 0) + sum(c.count for c in streams.chunks)
        for span in streams.chunks:
            yield self._seal_chunk, (name, streams.offset, streams.raw, span)

    def _seal_chunk(self, name: str, offset: int, raw: np.ndarray, span: ChunkSpan) -> EncodedChunk:
        """A chunk from its raw streams (built on the device): the entropy stage and the header."""
        return self._chunk(name, offset + span.lo, offset + span.hi, span.count,
                           raw[span.index_at: span.index_at + span.index_len].data,
                           raw[span.value_at: span.value_at + span.value_len].data)

    def _encode_chunk(self, name: str, offset: int, lo: int, hi: int, idx: np.ndarray,
                      old: np.ndarray, new: np.ndarray) -> EncodedChunk:
        # The gaps' planar LEB128 and the DELTA16 value stream in compiled sweeps (the same bytes as
        # leb128.encode and values.encode_values, which stay the format's reference and decode's inverse).
        index_raw = kernels.leb128_gaps(np.ascontiguousarray(idx, dtype=np.int64), lo).tobytes()
        transform = self.params.value_transform
        if transform == ValueTransform.DELTA16:
            value_raw = kernels.delta16_values(np.ascontiguousarray(old), np.ascontiguousarray(new)).tobytes()
        else:
            value_raw = encode_values(old, new, transform)
        return self._chunk(name, offset + lo, offset + hi, int(idx.size), index_raw, value_raw)

    def _chunk(self, name: str, lo: int, hi: int, count: int, index_raw: bytes | memoryview,
               value_raw: bytes | memoryview) -> EncodedChunk:
        index_entropy, index_bytes = self._compress(index_raw)
        value_entropy, value_bytes = self._compress(value_raw)
        header = ChunkHeader(name, lo, hi, count, index_entropy, self.params.value_transform, value_entropy,
                             len(index_raw), len(index_bytes), len(value_raw), len(value_bytes))
        return EncodedChunk(header, index_bytes, value_bytes)

    def _compress(self, raw: bytes | memoryview) -> tuple[Entropy, bytes]:
        if self.params.use_zstd and len(raw) > 64:
            # One compressor per thread: a ZstdCompressor must not be used by two threads at once.
            compressor = getattr(self._local, "zstd", None)
            if compressor is None:
                compressor = self._local.zstd = zstandard.ZstdCompressor(level=self.params.zstd_level,
                                                                         write_content_size=True)
            packed = compressor.compress(raw)
            if len(packed) < len(raw):
                return Entropy.ZSTD, packed
        return Entropy.NONE, bytes(raw)  # a view of a piece's stream buffer becomes the chunk's own bytes

    def _seal(self, chunks: list[EncodedChunk]) -> Segment:
        data = pack(chunks)
        ref = SegmentRef(hashlib.sha256(data).hexdigest(), len(data),
                         tuple(ChunkRef(c.header.tensor, c.header.lo, c.header.hi, c.header.count)
                               for c in chunks))
        self.summary.segments += 1
        self.summary.segment_bytes += len(data)
        return Segment(ref, data)
