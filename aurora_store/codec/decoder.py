"""Decode + apply, split into ``stage`` (verify and decode; no writes) and ``activate`` (in-place scatter).

Staging checks, in order: the layout fingerprint, the base version and base digest against the target,
every segment's SHA-256 against the manifest, each segment's structure and chunk table against the
manifest, every index against its tensor's bounds, and finally that the weights *after* the update would
hash to the manifest's ``weights_digest``. Only a fully verified :class:`StagedDelta` can be activated, so
a bad input raises a typed error and leaves the target's weights untouched.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import zstandard

from aurora_store.codec import kernels, leb128
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import ChunkRef, DeltaManifest, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.segment import ChunkHeader, Entropy, ValueTransform, unpack
from aurora_store.codec.streams import apply_values, apply_values_in_place, chunk_indices, chunk_indices_into
from aurora_store.codec.target import HostStorage, ScatterPlan, SupportsScatterPlan, TensorTarget, WeightTarget
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import (
    BaseVersionMismatchError,
    CorruptSegmentError,
    DigestMismatchError,
    LayoutMismatchError,
    ManifestError,
)


@dataclass(frozen=True)
class DecodedChunk:
    tensor: str
    indices: torch.Tensor  # int64, sorted, global flat indices in the inference tensor
    values: bytes  # raw value stream (decoding DELTA16 needs the target's current bits)
    header: ChunkHeader


@dataclass(frozen=True)
class TensorUpdate:
    tensor: str
    indices: torch.Tensor  # int64 sorted flat indices
    bits: torch.Tensor  # int16 new bit patterns
    plan: ScatterPlan | None = None  # the indices cut and placed for the target staged against, if it plans


class Transition(Protocol):
    """What moving a target from one version to the next promises: the layout it is for, the exact base
    (version and weights digest) it must start from, and the weights digest it ends at. A delta manifest is
    one; so is every staged update."""

    @property
    def version(self) -> int: ...

    @property
    def base_version(self) -> int: ...

    @property
    def layout_fingerprint(self) -> str: ...

    @property
    def elements(self) -> int: ...

    @property
    def base_weights_digest(self) -> str: ...

    @property
    def weights_digest(self) -> str: ...


@dataclass(frozen=True)
class StagedDelta:
    """A verified, decoded delta ready for :func:`activate`."""

    manifest: DeltaManifest
    updates: tuple[TensorUpdate, ...]

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def base_version(self) -> int:
        return self.manifest.base_version

    @property
    def layout_fingerprint(self) -> str:
        return self.manifest.layout_fingerprint

    @property
    def elements(self) -> int:
        return self.manifest.elements

    @property
    def base_weights_digest(self) -> str:
        return self.manifest.base_weights_digest

    @property
    def weights_digest(self) -> str:
        return self.manifest.weights_digest


@dataclass(frozen=True)
class StagedSnapshot:
    """A full snapshot staged against a target: the difference between the target's bits and the snapshot's,
    verified to end at the snapshot's weights digest; activated like a delta (:func:`activate`)."""

    version: int
    base_version: int
    layout_fingerprint: str
    elements: int
    base_weights_digest: str
    weights_digest: str
    updates: tuple[TensorUpdate, ...]
    snapshot_bytes: int  # what was downloaded to stage it

    @property
    def changed(self) -> int:
        return sum(u.indices.numel() for u in self.updates)


#: Anything :func:`activate` applies.
Staged = StagedDelta | StagedSnapshot


def verify_segment(ref: SegmentRef, data: bytes) -> None:
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
        raise CorruptSegmentError(f"segment {ref.digest[:12]}… does not match its digest "
                                  f"({len(data)} bytes, expected {ref.size})")


def decode_segment(layout: ModelLayout, codec: CodecParams, ref: SegmentRef, data: bytes, *,
                   check_values: bool = False) -> list[DecodedChunk]:
    """Verify one segment's digest and structure and decode its chunks. ``check_values`` also checks each
    value stream's structure (class table, padding, escape words), which staging does when it decodes them
    against the base; ``verify --deep`` has no base and asks for it here."""
    return [decode_chunk(*part, check_values=check_values) for part in open_segment(layout, codec, ref, data)]


def open_segment(layout: ModelLayout, codec: CodecParams, ref: SegmentRef,
                 data: bytes) -> list[tuple[ChunkHeader, memoryview, memoryview]]:
    """The first half of :func:`decode_segment`: the segment's digest and structure, and every chunk header
    checked against the layout and the codec (nothing decompressed yet). Its chunks are then decoded one by
    one (:func:`decode_chunk`), on any thread."""
    verify_segment(ref, data)
    parts = unpack(data)
    listed = tuple(ChunkRef(h.tensor, h.lo, h.hi, h.count) for h, _, _ in parts)
    if listed != ref.chunks:
        raise ManifestError(f"segment {ref.digest[:12]}… holds chunks that differ from its manifest entry")
    for header, _, _ in parts:
        if header.tensor not in layout:
            raise CorruptSegmentError(f"chunk for unknown tensor {header.tensor!r}")
        if header.hi > layout[header.tensor].numel:
            raise CorruptSegmentError(f"chunk {header.tensor} [{header.lo}, {header.hi}) exceeds the tensor")
        if header.value_transform != codec.value_transform or not (
                codec.allows(header.index_entropy) and codec.allows(header.value_entropy)):
            raise CorruptSegmentError(f"chunk {header.tensor} uses codecs the manifest does not declare")
        check_raw_lengths(header, codec)
    return parts


_local = threading.local()


def decode_chunk(header: ChunkHeader, index_stream: memoryview, value_stream: memoryview, *,
                 check_values: bool = False) -> DecodedChunk:
    """One chunk of a segment :func:`open_segment` has checked: its streams inflated (never past their checked
    raw lengths) and its indices decoded and checked (see :func:`decode_segment` for ``check_values``)."""
    decompressor = _decompressor()
    index_raw = _inflate(decompressor, header.index_entropy, index_stream, header.index_raw_len)
    value_raw = _inflate(decompressor, header.value_entropy, value_stream, header.value_raw_len)
    # One compiled sweep pair: LEB128 structure, strictly increasing, inside [lo, hi) (streams.py).
    indices = torch.from_numpy(chunk_indices(header.tensor, index_raw, header.count, header.lo, header.hi))
    if check_values:
        zeros = np.zeros(header.count, dtype=np.int16)
        apply_values(header.tensor, indices.numpy(), zeros, value_raw, header.value_transform, zeros.copy())
    return DecodedChunk(header.tensor, indices, value_raw, header)


def concat_host(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` of host tensors through numpy. A host ``torch.cat`` above its grain size wakes torch's
    intra-op thread pool, and in a process pinned to fewer cores than that pool has threads (a region's
    actors sharing a core) the wake-up cost ~0.1 s per call — more than the whole staging of a small delta."""
    if len(parts) == 1:
        return parts[0]
    if any(p.device.type != "cpu" for p in parts):
        return torch.cat(list(parts))
    return torch.from_numpy(np.concatenate([p.numpy() for p in parts]))


def stage(manifest: DeltaManifest, segments: Mapping[str, bytes] | Iterable[tuple[SegmentRef, bytes]],
          target: WeightTarget, *, threads: int | None = None) -> StagedDelta:
    """Verify and decode a delta against ``target`` without modifying it.

    ``segments`` maps segment digests to bytes, or yields ``(ref, bytes)`` pairs in any order (e.g. as they
    arrive from parallel downloads). Segments are verified and decoded, and tensors' values decoded and
    hashed, on up to ``threads`` threads (SHA-256, zstd and the compiled kernels release the GIL); the
    result does not depend on the count. A :class:`TensorTarget` in host memory is read chunk by chunk by
    the decoding itself; any other target answers one gather per group of tensors.
    """
    check_applicable(manifest, target)
    decoded: dict[str, list[DecodedChunk]] = {}
    seen: set[str] = set()
    wanted = {ref.digest: ref for ref in manifest.segments}
    pairs = ((wanted.get(d), b) for d, b in segments.items()) if isinstance(segments, Mapping) else segments
    todo = []
    for ref, data in pairs:
        if ref is None or ref.digest not in wanted:
            continue
        if ref.digest in seen:
            continue
        seen.add(ref.digest)
        todo.append((target.layout, manifest.codec, wanted[ref.digest], data))
    missing = set(wanted) - seen
    if missing:
        raise ManifestError(f"{len(missing)} segment(s) of version {manifest.version} were not supplied")
    # Segments verified and opened, then their chunks decoded, each spread over the threads (a model's delta
    # is a few segments of many chunks: chunks balance the threads, segments alone would not).
    opened = kernels.run_blocks(open_segment, todo, threads)
    if isinstance(target, TensorTarget):
        # Every tensor in host memory (not on an accelerator, nor held in another element order): the chunks
        # read the old bits themselves. Otherwise each group gathers them first (below).
        names = {header.tensor for parts in opened for header, _, _ in parts}
        storage = {name: held for name in names if (held := target.host_storage(name)) is not None}
        if len(storage) == len(names):
            return _stage_in_place(manifest, target, opened, storage, threads)
    for chunk in kernels.run_blocks(decode_chunk, [part for parts in opened for part in parts], threads):
        decoded.setdefault(chunk.tensor, []).append(chunk)
    plans = []
    for name in sorted(decoded, key=target.layout.names.index):
        chunks = sorted(decoded[name], key=lambda c: c.header.lo)
        for before, after in itertools.pairwise(chunks):
            if after.header.lo < before.header.hi:
                raise CorruptSegmentError(f"chunks of {name} overlap")
        indices = concat_host([c.indices for c in chunks])
        if indices.numel() != manifest.changed.get(name, 0):
            raise ManifestError(f"{name}: decoded {indices.numel()} changes, manifest says "
                                f"{manifest.changed.get(name, 0)}")
        plans.append((name, chunks, indices))
    transform = manifest.codec.value_transform
    planner = target if isinstance(target, SupportsScatterPlan) else None

    def decode_tensor(name: str, chunks: list[DecodedChunk], indices: torch.Tensor,
                      old: torch.Tensor) -> tuple[torch.Tensor, WeightsDigest]:
        # Values decoded straight into the tensor's new bits, the digest move summed in the same sweep.
        new = torch.empty_like(old)
        idx_np, old_np, new_np = indices.numpy(), old.numpy(), new.numpy()
        moved = WeightsDigest()
        start = 0
        for c in chunks:
            stop = start + c.header.count
            moved = moved + apply_values(name, idx_np[start:stop], old_np[start:stop], c.values, transform,
                                         new_np[start:stop])
            start = stop
        return new, moved

    # A target of this process is read per group, on the threads; any other (an engine in another process)
    # answers one gather_many for every tensor in one round trip, before the threads start.
    gathered: dict[str, torch.Tensor] = {}
    if not isinstance(target, TensorTarget):
        gathered = dict(zip((name for name, _, _ in plans),
                            target.gather_many([(name, indices) for name, _, indices in plans]), strict=True))

    def stage_group(group: list[tuple[str, list[DecodedChunk], torch.Tensor]],
                    ) -> list[tuple[TensorUpdate, WeightsDigest]]:
        if gathered or not group:  # read already (or nothing to read: no empty round trip)
            olds = [gathered[name] for name, _, _ in group]
        else:
            olds = target.gather_many([(name, indices) for name, _, indices in group])
        out = []
        for (name, chunks, indices), old in zip(group, olds):
            new, moved = decode_tensor(name, chunks, indices, old)
            # Cutting the indices at the target's pieces (and moving them to its device) belongs to staging:
            # activation is then one scatter_ per piece.
            plan = planner.plan_scatter(name, indices) if planner is not None else None
            out.append((TensorUpdate(name, indices, new, plan), moved))
        return out

    updates = []
    delta = WeightsDigest()
    for group in kernels.run_blocks(stage_group, [(g,) for g in _groups(plans, threads)], threads):
        for update, moved in group:
            updates.append(update)
            delta = delta + moved
    if str(target.digest + delta) != manifest.weights_digest:
        raise DigestMismatchError(f"applying version {manifest.version} would give weights digest "
                                  f"{target.digest + delta}, manifest says {manifest.weights_digest}")
    return StagedDelta(manifest, tuple(updates))


def _stage_in_place(manifest: DeltaManifest, target: TensorTarget,
                    opened: list[list[tuple[ChunkHeader, memoryview, memoryview]]],
                    storage: dict[str, HostStorage], threads: int | None) -> StagedDelta:
    """:func:`stage` against a target whose tensors all lie in host memory: each tensor's indices and new bits
    are allocated once (their counts are in the checked chunk headers) and every chunk, on any thread, decodes
    its indices into its slice and its values against the old bits it reads from the weights itself, summing
    its digest move in the same sweep — no per-tensor gather, concatenation or index check after decoding."""
    order = {name: k for k, name in enumerate(target.layout.names)}
    by_tensor: dict[str, list[tuple[ChunkHeader, memoryview, memoryview]]] = {}
    for parts in opened:
        for part in parts:
            by_tensor.setdefault(part[0].tensor, []).append(part)
    tasks = []
    tensors = []
    for name in sorted(by_tensor, key=order.__getitem__):
        chunks = sorted(by_tensor[name], key=lambda part: part[0].lo)
        for (before, _, _), (after, _, _) in itertools.pairwise(chunks):
            if after.lo < before.hi:
                raise CorruptSegmentError(f"chunks of {name} overlap")
        total = sum(header.count for header, _, _ in chunks)
        if total != manifest.changed.get(name, 0):
            raise ManifestError(f"{name}: decoded {total} changes, manifest says {manifest.changed.get(name, 0)}")
        indices = np.empty(total, dtype=np.int64)
        bits = np.empty(total, dtype=np.int16)
        start = 0
        for header, index_stream, value_stream in chunks:
            stop = start + header.count
            tasks.append((header, index_stream, value_stream, indices[start:stop], bits[start:stop], storage[name],
                          manifest.codec.value_transform))
            start = stop
        tensors.append((name, indices, bits))
    delta = WeightsDigest()
    for moved in kernels.run_blocks(_stage_chunk, tasks, threads):
        delta = delta + moved
    if str(target.digest + delta) != manifest.weights_digest:
        raise DigestMismatchError(f"applying version {manifest.version} would give weights digest "
                                  f"{target.digest + delta}, manifest says {manifest.weights_digest}")
    updates = []
    for name, indices, bits in tensors:
        # Cutting the indices at the target's pieces belongs to staging: activation is one scatter_ per piece.
        # The indices were checked against their chunks' ranges as they were decoded.
        flat = torch.from_numpy(indices)
        updates.append(TensorUpdate(name, flat, torch.from_numpy(bits), target.plan_scatter(name, flat, in_range=True)))
    return StagedDelta(manifest, tuple(updates))


def _stage_chunk(header: ChunkHeader, index_stream: memoryview, value_stream: memoryview, indices: np.ndarray,
                 bits: np.ndarray, storage: HostStorage, transform: ValueTransform) -> WeightsDigest:
    """One chunk of :func:`_stage_in_place`: streams inflated, indices decoded into ``indices``, values decoded
    against the target's bits into ``bits``; returns the chunk's digest move."""
    decompressor = _decompressor()
    index_raw = _inflate(decompressor, header.index_entropy, index_stream, header.index_raw_len)
    value_raw = _inflate(decompressor, header.value_entropy, value_stream, header.value_raw_len)
    chunk_indices_into(header.tensor, index_raw, header.count, header.lo, header.hi, indices)
    return apply_values_in_place(header.tensor, indices, storage, value_raw, transform, bits)


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor = getattr(_local, "zstd", None)
    if decompressor is None:  # one per thread: a ZstdDecompressor must not be used by two threads at once
        decompressor = _local.zstd = zstandard.ZstdDecompressor()
    return decompressor


def _groups(plans: list[tuple[str, list[DecodedChunk], torch.Tensor]],
            threads: int | None) -> list[list[tuple[str, list[DecodedChunk], torch.Tensor]]]:
    """Consecutive tensors in groups of about equal changed elements: one group on one thread (a single
    gather for the target), two per thread on more (the threads even out what one group costs more)."""
    count = kernels.DEFAULT_THREADS if threads is None else threads
    wanted = 1 if count <= 1 else 2 * count
    total = sum(indices.numel() for _, _, indices in plans)
    groups: list[list[tuple[str, list[DecodedChunk], torch.Tensor]]] = [[]]
    filled = 0
    for plan in plans:
        if groups[-1] and filled >= total * len(groups) / wanted:
            groups.append([])
        groups[-1].append(plan)
        filled += plan[2].numel()
    return groups


def check_applicable(manifest: Transition, target: WeightTarget) -> None:
    """Raise unless ``manifest`` was made for this layout and the target's exact current weights."""
    if manifest.layout_fingerprint != target.layout.fingerprint:
        raise LayoutMismatchError(f"delta {manifest.version} is for layout {manifest.layout_fingerprint}, "
                                  f"target has {target.layout.fingerprint}")
    if manifest.elements != target.layout.numel:
        raise LayoutMismatchError(f"delta {manifest.version} covers {manifest.elements} elements, "
                                  f"layout has {target.layout.numel}")
    if target.version != manifest.base_version:
        raise BaseVersionMismatchError(f"delta {manifest.version} has base {manifest.base_version}, "
                                       f"target is at version {target.version}")
    if str(target.digest) != manifest.base_weights_digest:
        raise BaseVersionMismatchError(f"target weights digest {target.digest} differs from the delta's "
                                       f"base digest {manifest.base_weights_digest}")


def activate(staged: Staged, target: WeightTarget) -> None:
    """Scatter a staged delta (or snapshot) into ``target`` in place, advance its version and digest, and
    flush: every write is visible when this returns. A flush that fails leaves the weights unknown, so the
    target's version becomes ``None`` (no delta applies to it until it is declared again)."""
    check_applicable(staged, target)
    planner = target if isinstance(target, SupportsScatterPlan) else None
    for update in staged.updates:
        if planner is not None and update.plan is not None and update.plan.owner is target:
            planner.scatter_planned(update.tensor, update.plan, update.bits)
        else:
            target.scatter(update.tensor, update.indices, update.bits)
    # Version and digest first: a target in another process sends them along with its queued writes.
    target.version = staged.version
    target.digest = WeightsDigest.parse(staged.weights_digest)
    try:
        target.flush()
    except BaseException:
        target.version = None
        raise


def apply_delta(manifest: DeltaManifest, segments: Mapping[str, bytes] | Iterable[tuple[SegmentRef, bytes]],
                target: WeightTarget) -> None:
    activate(stage(manifest, segments, target), target)


def check_raw_lengths(header: ChunkHeader, codec: CodecParams) -> None:
    """Bound a chunk's declared raw lengths by its ``count`` before anything is allocated (FORMAT §3.1–3.3).

    ``count`` itself is bounded by the chunk's range (checked by :func:`unpack`), the tensor and the codec's
    chunk size; the index stream holds ``count`` LEB128 values of 1–9 bytes; the value stream is exactly
    ``2·count`` bytes (RAW) or its class table plus at most one side bit and one escaped word per element
    (DELTA16). Nothing is decompressed or allocated from a length that fails these bounds.
    """
    n = header.count
    if n > codec.max_changed_per_chunk:
        raise CorruptSegmentError(f"chunk {header.tensor}: {n} values exceed the codec's "
                                  f"{codec.max_changed_per_chunk} per chunk")
    if not n <= header.index_raw_len <= leb128.MAX_BYTES * n:
        raise CorruptSegmentError(f"chunk {header.tensor}: index raw length {header.index_raw_len} is "
                                  f"impossible for {n} values")
    if header.value_transform == ValueTransform.RAW:
        low = high = 2 * n
    else:
        low = (n + 3) // 4
        high = low + (n + 7) // 8 + 2 * n
    if not low <= header.value_raw_len <= high:
        raise CorruptSegmentError(f"chunk {header.tensor}: value raw length {header.value_raw_len} is "
                                  f"impossible for {n} values")


def _inflate(decompressor: zstandard.ZstdDecompressor, entropy: Entropy, stream: memoryview, raw_len: int) -> bytes:
    """The raw bytes of one stream, never more than ``raw_len`` (already bounded by the chunk's count)."""
    if entropy == Entropy.NONE:
        if len(stream) != raw_len:
            raise CorruptSegmentError(f"raw stream of {len(stream)} bytes, expected {raw_len}")
        return bytes(stream)
    data = bytes(stream)
    try:
        # The frame must declare its content size (FORMAT §3.3) and it must be the raw length: zstd sizes its
        # output buffer from the declared size, so a frame claiming 1 GiB is refused before allocating it.
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CorruptSegmentError(f"zstd stream is corrupt: {exc}") from exc
    if declared != raw_len:
        what = "no content size" if declared < 0 else f"{declared} bytes"
        raise CorruptSegmentError(f"zstd frame declares {what}, chunk header says {raw_len}")
    try:
        raw = decompressor.decompress(data, max_output_size=raw_len, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CorruptSegmentError(f"zstd stream is corrupt: {exc}") from exc
    except MemoryError:
        raise CorruptSegmentError(f"zstd stream of {raw_len} raw bytes does not fit in memory") from None
    if len(raw) != raw_len:
        raise CorruptSegmentError(f"zstd stream inflates to {len(raw)} bytes, expected {raw_len}")
    return raw
