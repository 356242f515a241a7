"""Rows of training tensors owned by one rank → flat ranges of the fused inference tensors, and merging
what several ranks encoded into one delta.

A data-parallel trainer (FSDP2) shards every parameter on dim 0, so a rank owns rows ``[start, stop)`` of
each training tensor. Fused inference tensors stack their components along dim 0, so those rows are one
contiguous flat range of the fused tensor: ``[(row_offset + start) · row_size, (row_offset + stop) · row_size)``.
Each rank can therefore diff, hash and encode exactly the elements it owns without seeing anyone else's
(a component in an element order of its own, :mod:`aurora_store.codec.order`, keeps each training row one row
of its block, so a rank puts its own rows in engine order first), and the per-rank results
(:class:`DeltaPart`) merge into one manifest: the digest is additive and the chunks of one tensor written by
different ranks cover disjoint ranges, which decoders sort by ``lo``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from aurora_store.codec.digest import ZERO, WeightsDigest, hash_range
from aurora_store.codec.encoder import Piece
from aurora_store.codec.layout import InferenceTensor, ModelLayout, engine_bits
from aurora_store.codec.manifest import SegmentRef
from aurora_store.errors import LayoutError, ManifestError


def even_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a ``rows``-row tensor that ``rank`` of ``world`` owns when dim 0 is split the
    way ``torch.chunk`` (and so FSDP2's ``Shard(0)``) splits it: ``ceil(rows / world)`` rows per rank, the
    last ranks possibly short or empty."""
    if world < 1 or not 0 <= rank < world or rows < 0:
        raise LayoutError(f"invalid shard: rank {rank} of {world} over {rows} rows")
    chunk = -(-rows // world)
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


@dataclass(frozen=True)
class LocalRows:
    """Rows ``[start, start + len(tensor))`` of training tensor ``name`` held by this rank."""

    name: str
    start: int
    tensor: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.tensor.shape[0]) if self.tensor.dim() else 1


def rank_rows(layout: ModelLayout, state: Mapping[str, torch.Tensor], rank: int, world: int) -> dict[str, LocalRows]:
    """The dim-0 rows of every training tensor of whole ``state`` that ``rank`` of ``world`` holds (even_rows, as
    an FSDP2 rank does): a sharded trainer's view, built from whole tensors (tests, benchmarks)."""
    out = {}
    for name in layout.train_names:
        start, stop = even_rows(state[name].shape[0], rank, world)
        out[name] = LocalRows(name, start, state[name][start:stop].contiguous())
    return out


def row_span(layout: ModelLayout, train_name: str, start: int, rows: int) -> tuple[InferenceTensor, int, int]:
    """The inference tensor and flat range ``[lo, hi)`` that rows ``[start, start + rows)`` of a training
    tensor occupy."""
    tensor, comp = layout.locate(train_name)
    if start < 0 or rows < 0 or start + rows > comp.rows:
        raise LayoutError(f"{train_name}: rows [{start}, {start + rows}) outside its {comp.rows} rows")
    lo = (comp.row_offset + start) * tensor.row_size
    return tensor, lo, lo + rows * tensor.row_size


def _check_rows(layout: ModelLayout, rows: Mapping[str, LocalRows]) -> None:
    expected = set(layout.train_names)
    if set(rows) != expected:
        missing, unexpected = sorted(expected - set(rows)), sorted(set(rows) - expected)
        raise LayoutError(f"local rows do not match the layout: missing {missing[:8]}, unexpected {unexpected[:8]}")
    for name, local in rows.items():
        tensor, comp = layout.locate(name)
        tail = tuple(local.tensor.shape[1:]) if local.tensor.dim() else ()
        if tail != tensor.component_shape(comp)[1:]:
            raise LayoutError(f"{name}: local rows have shape {tuple(local.tensor.shape)}, rows of "
                              f"{tensor.component_shape(comp)} expected")
        row_span(layout, name, local.start, local.rows)


def row_pieces(layout: ModelLayout, old: Mapping[str, LocalRows], new: Mapping[str, LocalRows]) -> Iterator[Piece]:
    """Pair a rank's previously published and new rows into pieces of the fused layout, in layout order
    (empty shards are skipped). Both sides must hold the same rows of every training tensor."""
    _check_rows(layout, old)
    _check_rows(layout, new)
    for name in layout.train_names:
        a, b = old[name], new[name]
        if (a.start, a.rows) != (b.start, b.rows):
            raise LayoutError(f"{name}: old rows [{a.start}, +{a.rows}) and new rows [{b.start}, +{b.rows}) differ")
        if b.rows == 0:
            continue
        tensor, lo, _ = row_span(layout, name, b.start, b.rows)
        comp = layout.locate(name)[1]
        yield Piece(tensor, lo, engine_bits(comp, a.tensor), engine_bits(comp, b.tensor))


def rows_digest(layout: ModelLayout, rows: Mapping[str, LocalRows]) -> WeightsDigest:
    """This rank's from-scratch contribution to the weights digest; the contributions of all ranks sum
    (mod 2^64 per lane) to the digest of the whole model."""
    _check_rows(layout, rows)
    total = ZERO
    for name in layout.train_names:
        local = rows[name]
        if local.rows:
            tensor, lo, _ = row_span(layout, name, local.start, local.rows)
            total = total + hash_range(tensor.name, lo, engine_bits(layout.locate(name)[1], local.tensor))
    return total


def track_spans(pieces: Iterable[Piece], spans: list[tuple[str, int, int]]) -> Iterator[Piece]:
    """Pass ``pieces`` through, appending each one's ``(tensor, lo, hi)`` to ``spans`` (what a part covers)."""
    for piece in pieces:
        spans.append((piece.tensor.name, piece.offset, piece.offset + piece.old.numel()))
        yield piece


@dataclass(frozen=True)
class DeltaPart:
    """What one rank's encoder produced: its segment refs (in order), per-tensor changed counts, its digest
    contribution and the flat ranges it covered. Small (no weights), JSON-serialisable, so ranks can send it
    to the one that writes the manifest."""

    segments: tuple[SegmentRef, ...]
    changed: Mapping[str, int]
    digest_delta: WeightsDigest
    elements: int
    spans: tuple[tuple[str, int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"segments": [s.to_json() for s in self.segments], "changed": dict(self.changed),
                "digest_delta": str(self.digest_delta), "elements": self.elements,
                "spans": [list(s) for s in self.spans]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DeltaPart:
        try:
            return cls(tuple(SegmentRef.from_json(s) for s in doc["segments"]),
                       {str(k): int(v) for k, v in doc["changed"].items()},
                       WeightsDigest.parse(doc["digest_delta"]), int(doc["elements"]),
                       tuple((str(t), int(lo), int(hi)) for t, lo, hi in doc["spans"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"malformed delta part: {exc!r}") from exc


def merge_parts(layout: ModelLayout, parts: Sequence[DeltaPart]) -> DeltaPart:
    """One delta from the parts of all ranks, segments in part order (rank 0's, then rank 1's, …).

    Raises :class:`LayoutError` unless the parts' spans tile every inference tensor exactly once — an element
    encoded twice or by no one would make a delta that silently drops or doubles updates.
    """
    by_tensor: dict[str, list[tuple[int, int]]] = {}
    for part in parts:
        for name, lo, hi in part.spans:
            by_tensor.setdefault(name, []).append((lo, hi))
    for tensor in layout.tensors:
        covered = 0
        for lo, hi in sorted(by_tensor.pop(tensor.name, [])):
            if hi == lo == covered == tensor.numel:  # an empty tensor: covered by its empty piece
                continue
            if lo != covered or hi <= lo:
                raise LayoutError(f"{tensor.name}: parts cover [{lo}, {hi}) after {covered}: overlap or gap")
            covered = hi
        if covered != tensor.numel:
            raise LayoutError(f"{tensor.name}: parts cover {covered} of {tensor.numel} elements")
    if by_tensor:
        raise LayoutError(f"parts cover tensors outside the layout: {sorted(by_tensor)[:8]}")
    changed: dict[str, int] = {}
    digest = ZERO
    for part in parts:
        digest = digest + part.digest_delta
        for name, count in part.changed.items():
            changed[name] = changed.get(name, 0) + count
    ordered = {name: changed[name] for name in layout.names if changed.get(name)}
    return DeltaPart(tuple(itertools.chain.from_iterable(p.segments for p in parts)), ordered, digest,
                     sum(p.elements for p in parts), tuple(itertools.chain.from_iterable(p.spans for p in parts)))
