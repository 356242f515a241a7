"""Encoding where the weights live: a piece's changed elements → the raw index and value streams of its
chunks (FORMAT §3.1, §3.2), built with torch ops on the piece's own device.

Per piece, on its device:

1. the changed indices (:func:`.extract.changed_indices`: one count pass, one sync), their old/new bits and
   the digest move (lanes stay on the device);
2. the chunk cut (every ``step`` changed elements, exactly as the host encoder cuts), the gaps, each gap's
   LEB128 length, the DELTA16 words and their 2-bit classes, and per chunk the counts that size every stream
   (values per LEB128 level, side bits, escapes): one small table, the second and last sync of the piece;
3. every byte of every chunk's raw streams scattered into one ``uint8`` buffer (chunk after chunk, each its
   index stream then its value stream): level-major LEB128 bytes, classes packed four per byte, side bits
   eight per byte, escapes as two byte planes (or RAW's two byte planes) — no sync;
4. that one buffer copied to the host: on CUDA into pinned memory on a side stream (the next piece's work
   proceeds on the compute stream meanwhile), one piece ahead of the caller; on CPU it is the buffer itself.

Only the raw streams (~1.2 bytes per change) cross to the host, where zstd, packing and SHA-256 run on the
encoder's threads. The host layout arithmetic (:func:`_layout`, numpy) is the one formula for where each
stream lies: the device receives its table instead of recomputing it. On CPU tensors the same torch code
runs, which is how the suite proves it byte-identical to the host encoder (:mod:`.kernels`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from aurora_store.codec import extract
from aurora_store.codec.digest import ZERO, WeightsDigest, digest_of_lanes, lanes_on_device
from aurora_store.codec.layout import InferenceTensor
from aurora_store.codec.leb128 import MAX_BYTES
from aurora_store.codec.segment import ValueTransform

#: Pieces whose streams are built ahead of the one the caller encodes (their copies in flight meanwhile).
PREFETCH = 1

# Columns of the per-chunk table the device sends to the host (sync 2).
_LO, _HI, _MID, _ESCAPE = range(4)
_LEVELS = 4  # then MAX_BYTES columns: values of the chunk with more than ``l`` LEB128 bytes, per level l
_COLUMNS = _LEVELS + MAX_BYTES


@dataclass(frozen=True)
class ChunkSpan:
    """One chunk of a piece: its range and count, and where its raw streams lie in the piece's buffer."""

    lo: int  # local to the piece, as the host encoder's chunk cut
    hi: int
    count: int
    index_at: int
    index_len: int
    value_at: int
    value_len: int


@dataclass(frozen=True)
class PieceStreams:
    """A piece's chunks encoded up to the entropy stage: ``raw`` holds each chunk's raw index stream then its
    raw value stream, chunk after chunk, at the offsets its :class:`ChunkSpan` gives."""

    tensor: InferenceTensor
    offset: int
    numel: int
    raw: np.ndarray  # uint8
    chunks: tuple[ChunkSpan, ...]


@dataclass(frozen=True)
class _Layout:
    """Where each chunk's streams lie (numpy, int64 per chunk; ``level_at`` and ``level_before`` are
    ``[chunks, MAX_BYTES]``). Computed once, on the host; the device gets :meth:`table`."""

    count: np.ndarray
    index_at: np.ndarray
    index_len: np.ndarray
    value_at: np.ndarray
    value_len: np.ndarray
    level_at: np.ndarray  # first byte of each LEB128 level of the chunk
    level_before: np.ndarray  # values at that level in the chunks before
    side_at: np.ndarray
    escape_at: np.ndarray
    mid: np.ndarray
    escape: np.ndarray
    mid_before: np.ndarray
    escape_before: np.ndarray
    class_off: np.ndarray  # the chunk's first byte among all chunks' class bytes
    class_end: np.ndarray
    side_off: np.ndarray  # ... among all chunks' side bytes
    side_end: np.ndarray
    total: int

    #: The order of the columns of :meth:`table` (levels first: ``MAX_BYTES`` columns each).
    SCALARS = ("count", "value_at", "side_at", "escape_at", "escape", "mid_before", "escape_before",
               "class_off", "class_end", "side_off", "side_end")

    def table(self) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate(
            [self.level_at, self.level_before] + [getattr(self, name)[:, None] for name in self.SCALARS], axis=1))


def _column(name: str) -> int:
    return 2 * MAX_BYTES + _Layout.SCALARS.index(name)


def _exclusive(a: np.ndarray, axis: int = 0) -> np.ndarray:
    return np.cumsum(a, axis=axis) - a


def _layout(meta: np.ndarray, count: int, step: int, transform: ValueTransform) -> _Layout:
    """Every stream's offset and length from the device's per-chunk counts (FORMAT §3.1, §3.2)."""
    chunks = meta.shape[0]
    counts = np.full(chunks, step, dtype=np.int64)
    counts[-1] = count - (chunks - 1) * step
    levels = meta[:, _LEVELS:]
    mid, escape = meta[:, _MID], meta[:, _ESCAPE]
    index_len = levels.sum(axis=1)
    if transform == ValueTransform.DELTA16:
        class_bytes = (counts + 3) // 4
        side_bytes = (mid + 7) // 8
        value_len = class_bytes + side_bytes + 2 * escape
    else:
        class_bytes = side_bytes = np.zeros(chunks, dtype=np.int64)
        value_len = 2 * counts
    chunk_len = index_len + value_len
    index_at = _exclusive(chunk_len)
    value_at = index_at + index_len
    class_end, side_end = np.cumsum(class_bytes), np.cumsum(side_bytes)
    return _Layout(count=counts, index_at=index_at, index_len=index_len, value_at=value_at, value_len=value_len,
                   level_at=index_at[:, None] + _exclusive(levels, axis=1), level_before=_exclusive(levels, axis=0),
                   side_at=value_at + class_bytes, escape_at=value_at + class_bytes + side_bytes, mid=mid,
                   escape=escape, mid_before=_exclusive(mid), escape_before=_exclusive(escape),
                   class_off=class_end - class_bytes, class_end=class_end, side_off=side_end - side_bytes,
                   side_end=side_end, total=int(chunk_len.sum()))


@dataclass
class _Survey:
    """A piece's changed elements on its device and what sync 2 brought to the host."""

    gaps: torch.Tensor  # int64, the chunk-relative gaps of FORMAT §3.1
    nbytes: torch.Tensor  # LEB128 bytes of each gap, 1..9
    words: torch.Tensor | None  # DELTA16 zigzag words (int32); None for RAW
    classes: torch.Tensor | None  # their 2-bit classes (uint8)
    new: torch.Tensor  # int16
    meta: np.ndarray  # [chunks, _COLUMNS] int64


def _per_chunk(chunk_of: torch.Tensor, values: torch.Tensor, bins: int, chunks: int) -> torch.Tensor:
    """``[chunks, bins]``: how many elements of each chunk have each value (``0 ≤ values < bins``), without a
    sync (``bincount`` would read the maximum back on CUDA)."""
    keys = chunk_of * bins + values.to(torch.int64)
    hist = torch.zeros(chunks * bins, dtype=torch.int64, device=keys.device)
    hist.index_add_(0, keys, torch.ones(1, dtype=torch.int64, device=keys.device).expand(keys.numel()))
    return hist.view(chunks, bins)


def _survey(indices: torch.Tensor, old: torch.Tensor, new: torch.Tensor, numel: int, step: int,
            transform: ValueTransform) -> _Survey:
    device = indices.device
    count = indices.numel()
    chunks = -(-count // step)
    chunk_of = torch.arange(count, device=device) // step
    # Chunk k starts at its first changed index (the first chunk at 0) and ends where the next one starts: the
    # host encoder's cut. Gaps restart at each chunk's first index, so those gaps are 0.
    lo = indices[::step].clone()
    lo[:1] = 0
    hi = torch.full((chunks,), numel, dtype=torch.int64, device=device)
    hi[:-1] = indices[step::step]
    gaps = torch.empty_like(indices)
    gaps[:1] = indices[:1]
    gaps[1:] = indices[1:] - indices[:-1]
    gaps[step::step] = 0
    # Bytes of each gap: 1 + how many of 2^7, 2^14, …, 2^56 it reaches (gaps are < 2^63).
    thresholds = torch.ones(MAX_BYTES - 1, dtype=torch.int64, device=device) << (
        7 * torch.arange(1, MAX_BYTES, dtype=torch.int64, device=device))
    nbytes = torch.bucketize(gaps, thresholds, right=True) + 1
    by_length = _per_chunk(chunk_of, nbytes - 1, MAX_BYTES, chunks)
    levels = by_length.flip(1).cumsum(1).flip(1)  # values with more than l bytes
    meta = torch.zeros(chunks, _COLUMNS, dtype=torch.int64, device=device)
    meta[:, _LO], meta[:, _HI] = lo, hi
    meta[:, _LEVELS:] = levels
    words = classes = None
    if transform == ValueTransform.DELTA16:
        # FORMAT §3.2 on 16-bit words held in int32: the wrapping difference, zigzagged.
        d = ((new.to(torch.int32) & 0xFFFF) - (old.to(torch.int32) & 0xFFFF)) & 0xFFFF
        words = ((d << 1) & 0xFFFF) ^ ((d >> 15) * 0xFFFF)
        classes = torch.where(words <= 2, words - 1, torch.where(words <= 4, 2, 3)).to(torch.uint8)
        by_class = _per_chunk(chunk_of, classes, 4, chunks)
        meta[:, _MID], meta[:, _ESCAPE] = by_class[:, 2], by_class[:, 3]
    return _Survey(gaps, nbytes, words, classes, new, meta.cpu().numpy())  # sync 2


def _take(values: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``values[at]`` for a 1-D ``values`` (``index_select``: several times ``values[at]``'s speed on CPU)."""
    return values.index_select(0, at)


def _put(buf: torch.Tensor, at: torch.Tensor, values: torch.Tensor) -> None:
    """``buf[at] = values`` for distinct positions ``at`` (``scatter_``: the fastest such write on CPU; with
    distinct positions it is deterministic on every device)."""
    buf.scatter_(0, at, values.to(torch.uint8))


def _pack(buf: torch.Tensor, values: torch.Tensor, chunk_of: torch.Tensor, rank: torch.Tensor, width: int,
          off: torch.Tensor, end: torch.Tensor, total_bytes: int, dest: torch.Tensor) -> None:
    """Pack ``width``-bit ``values`` (uint8) into bytes per chunk, first value in the lowest bits, unused high
    bits zero, and write each chunk's bytes at ``buf[dest[chunk]:]``. ``rank`` is a value's position in its
    chunk, ``off``/``end`` each chunk's byte range among all chunks' packed bytes (``total_bytes`` of them)."""
    per = 8 // width
    slots = torch.zeros(total_bytes * per, dtype=torch.uint8, device=buf.device)
    _put(slots, per * _take(off, chunk_of) + rank, values)
    groups = slots.view(total_bytes, per)
    packed = groups[:, 0].clone()
    for k in range(1, per):
        packed |= groups[:, k] << (width * k)
    at = torch.arange(total_bytes, dtype=torch.int64, device=buf.device)
    owner = torch.searchsorted(end, at, right=True)
    _put(buf, _take(dest, owner) + at - _take(off, owner), packed)


def _selected(mask: torch.Tensor, size: int) -> torch.Tensor:
    """Positions where ``mask`` holds, ascending; ``size`` (their number) is known, so no sync."""
    return torch.nonzero_static(mask, size=size).reshape(-1)


def _fill(survey: _Survey, layout: _Layout, step: int, transform: ValueTransform) -> torch.Tensor:
    """The piece's raw streams as one uint8 tensor on its device (:func:`_layout`'s offsets)."""
    device = survey.gaps.device
    table = torch.from_numpy(layout.table())
    if device.type == "cuda":  # pinned, so the small upload does not wait for the compute stream
        table = table.pin_memory().to(device, non_blocking=True)
    else:
        table = table.to(device)
    columns = table.t().contiguous()  # one contiguous row per column: cheap gathers

    def col(name: str) -> torch.Tensor:
        return columns[_column(name)]

    buf = torch.zeros(layout.total, dtype=torch.uint8, device=device)
    count = survey.gaps.numel()
    k = torch.arange(count, dtype=torch.int64, device=device)
    chunk_of = k // step
    rank = k - chunk_of * step
    # LEB128 level 0: byte 0 of every gap, in order.
    gaps, nbytes = survey.gaps, survey.nbytes
    _put(buf, _take(columns[0], chunk_of) + rank, (gaps & 0x7F) | ((nbytes > 1).to(torch.int64) << 7))
    # Level l: byte l of each gap that has one, in order; each level's gaps are among the previous level's.
    sel = k
    for level in range(1, MAX_BYTES):
        n = int(survey.meta[:, _LEVELS + level].sum())
        if n == 0:
            break
        sel = _take(sel, _selected(_take(nbytes, sel) > level, n))
        owner = sel // step
        at = _take(columns[level], owner) + torch.arange(n, dtype=torch.int64, device=device) \
            - _take(columns[MAX_BYTES + level], owner)
        more = (_take(nbytes, sel) > level + 1).to(torch.int64) << 7
        _put(buf, at, ((_take(gaps, sel) >> (7 * level)) & 0x7F) | more)
    if transform == ValueTransform.RAW:
        bits = survey.new.to(torch.int32) & 0xFFFF
        at = _take(col("value_at"), chunk_of) + rank
        _put(buf, at, bits & 0xFF)
        _put(buf, at + _take(col("count"), chunk_of), bits >> 8)
        return buf
    assert survey.words is not None and survey.classes is not None
    words, classes = survey.words, survey.classes
    _pack(buf, classes, chunk_of, rank, 2, col("class_off"), col("class_end"), int(layout.class_end[-1]),
          col("value_at"))
    mids = int(layout.mid.sum())
    if mids:
        sel = _selected(classes == 2, mids)
        owner = sel // step
        mid_rank = torch.arange(mids, dtype=torch.int64, device=device) - _take(col("mid_before"), owner)
        _pack(buf, (_take(words, sel) - 3).to(torch.uint8), owner, mid_rank, 1, col("side_off"), col("side_end"),
              int(layout.side_end[-1]), col("side_at"))
    escapes = int(layout.escape.sum())
    if escapes:
        sel = _selected(classes == 3, escapes)
        owner = sel // step
        at = _take(col("escape_at"), owner) + torch.arange(escapes, dtype=torch.int64, device=device) \
            - _take(col("escape_before"), owner)
        escaped = _take(words, sel)
        _put(buf, at, escaped & 0xFF)
        _put(buf, at + _take(col("escape"), owner), escaped >> 8)
    return buf


@dataclass
class _InFlight:
    tensor: InferenceTensor
    offset: int
    numel: int
    raw: torch.Tensor  # on the host (pinned on CUDA, valid once ``ready``)
    layout: _Layout
    meta: np.ndarray
    ready: torch.cuda.Event | None


def encode_changes(indices: torch.Tensor, old: torch.Tensor, new: torch.Tensor, numel: int, step: int,
                   transform: ValueTransform) -> tuple[torch.Tensor, tuple[ChunkSpan, ...]]:
    """The raw streams of the chunks of a piece of ``numel`` elements whose changed elements are ``indices``
    (sorted, int64, local) with bits ``old`` → ``new``, cut every ``step`` changes: one uint8 tensor on their
    device and each chunk's span in it. Two syncs (the per-chunk counts; the indices' count is known)."""
    if indices.numel() == 0:
        return torch.zeros(0, dtype=torch.uint8, device=indices.device), ()
    survey = _survey(indices, old, new, numel, step, transform)
    layout = _layout(survey.meta, indices.numel(), step, transform)
    return _fill(survey, layout, step, transform), _spans(survey.meta, layout)


def _spans(meta: np.ndarray, layout: _Layout) -> tuple[ChunkSpan, ...]:
    return tuple(ChunkSpan(int(lo), int(hi), int(c), int(ia), int(il), int(va), int(vl))
                 for lo, hi, c, ia, il, va, vl in zip(meta[:, _LO], meta[:, _HI], layout.count, layout.index_at,
                                                      layout.index_len, layout.value_at, layout.value_len))


class DeviceEncoding:
    """Iterate over :class:`PieceStreams` of ``(tensor, offset, old_bits, new_bits)`` pieces, built with torch
    ops on the pieces' device; read :meth:`digest_delta` once iteration is over."""

    def __init__(self, pieces: Iterable[tuple[InferenceTensor, int, torch.Tensor, torch.Tensor]], *, step: int,
                 transform: ValueTransform, prefetch: int = PREFETCH) -> None:
        if step < 1:
            raise ValueError(f"step must be ≥ 1, not {step}")
        self._pieces = pieces
        self._step = step
        self._transform = transform
        self._prefetch = max(0, prefetch)
        self._lanes: torch.Tensor | None = None
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._finished = False

    def digest_delta(self) -> WeightsDigest:
        if not self._finished:
            raise RuntimeError("digest_delta is known once every piece has been encoded")
        return ZERO if self._lanes is None else digest_of_lanes(self._lanes)

    def __iter__(self) -> Iterator[PieceStreams]:
        def launch(piece: tuple[InferenceTensor, int, torch.Tensor, torch.Tensor]) -> _InFlight | None:
            tensor, offset, old, new = piece
            return self._launch(tensor, offset, old.reshape(-1), new.reshape(-1))

        yield from extract.pipelined(self._pieces, launch, self._land, self._prefetch)
        self._finished = True

    def _launch(self, tensor: InferenceTensor, offset: int, old: torch.Tensor,
                new: torch.Tensor) -> _InFlight | None:
        # Bit patterns (int16 views) are compared, never floats: NaN, -0.0 and inf compare exactly.
        local = extract.changed_indices(old, new)  # sync 1: the count pass
        if local.numel() == 0:
            return None
        old_vals, new_vals = _take(old, local), _take(new, local)
        global_idx = local + offset
        lanes = lanes_on_device(tensor.name, global_idx, new_vals) - lanes_on_device(tensor.name, global_idx, old_vals)
        self._lanes = lanes if self._lanes is None else self._lanes + lanes
        survey = _survey(local, old_vals, new_vals, old.numel(), self._step, self._transform)  # sync 2
        layout = _layout(survey.meta, local.numel(), self._step, self._transform)
        raw = _fill(survey, layout, self._step, self._transform)
        if raw.device.type != "cuda":
            return _InFlight(tensor, offset, old.numel(), raw, layout, survey.meta, None)
        # One copy per piece into pinned memory on a side stream: the compute stream goes on to the next
        # piece meanwhile. The caching host allocator hands out a block again only after the copies that used
        # it have finished, and the host keeps this one alive (numpy views of it) until its chunks are packed,
        # so pieces in flight never share a buffer.
        side = self._streams.get(raw.device)
        if side is None:
            side = self._streams[raw.device] = torch.cuda.Stream(device=raw.device)
        host = torch.empty(raw.shape, dtype=torch.uint8, pin_memory=True)
        side.wait_stream(torch.cuda.current_stream(raw.device))
        with torch.cuda.stream(side):
            host.copy_(raw, non_blocking=True)
        raw.record_stream(side)  # the compute stream may reuse raw's memory only after the copy
        ready = torch.cuda.Event()
        ready.record(side)
        return _InFlight(tensor, offset, old.numel(), host, layout, survey.meta, ready)

    @staticmethod
    def _land(flight: _InFlight) -> PieceStreams:
        if flight.ready is not None:
            flight.ready.synchronize()
        return PieceStreams(flight.tensor, flight.offset, flight.numel, flight.raw.numpy(),
                            _spans(flight.meta, flight.layout))
