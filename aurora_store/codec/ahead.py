"""Staging a delta segment by segment as the segments arrive, before its manifest exists (decode-ahead).

:func:`~aurora_store.codec.decoder.stage` needs the manifest first, so an actor that prefetched every segment
still decodes and hashes all of them after the manifest — serial work on the critical path of cut-through.
An :class:`AheadStager` does that work per segment as each arrives (verify its SHA-256 and structure, decode
its values against the target's current bits, sum its contribution to the weights digest), and
:meth:`AheadStager.finish` then only checks the signed manifest against what was decoded: same codec, every
listed segment and nothing else counted, chunks disjoint, per-tensor change counts, and the final weights
digest. Nothing decoded ahead is trusted before that check, and the target is never written.

The codec parameters are the run's (they do not change between versions); a manifest declaring others is
decoded again from the kept bytes. The target must stay at the base while segments are added.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import torch

from aurora_store.codec.decoder import (
    DecodedChunk,
    StagedDelta,
    TensorUpdate,
    check_applicable,
    concat_host,
    decode_segment,
    verify_segment,
)
from aurora_store.codec.manifest import ChunkRef, DeltaManifest, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.segment import unpack
from aurora_store.codec.streams import apply_values
from aurora_store.codec.target import SupportsScatterPlan, WeightTarget
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import CorruptSegmentError, DigestMismatchError, ManifestError


@dataclass(frozen=True)
class _Decoded:
    ref: SegmentRef  # with the chunk list the segment itself holds
    data: bytes
    chunks: tuple[DecodedChunk, ...]
    bits: tuple[torch.Tensor, ...]  # new bit patterns per chunk
    digest_delta: WeightsDigest


class AheadStager:
    """Decodes segments of the next version against ``target`` as they are added (thread-safe)."""

    def __init__(self, target: WeightTarget, codec: CodecParams) -> None:
        self.target = target
        self.codec = codec
        self.base = (target.version, str(target.digest))
        self._decoded: dict[str, _Decoded] = {}
        self._lock = threading.Lock()

    def __contains__(self, digest: str) -> bool:
        return digest in self._decoded

    def __len__(self) -> int:
        return len(self._decoded)

    def add(self, ref: SegmentRef, data: bytes, codec: CodecParams | None = None) -> None:
        """Verify and decode one segment. ``ref`` may lack its chunk list (a ``segment`` event names only the
        digest and size): it is read from the verified bytes then, and checked against the manifest later."""
        if not ref.chunks:
            verify_segment(ref, data)
            ref = SegmentRef(ref.digest, ref.size, tuple(ChunkRef(h.tensor, h.lo, h.hi, h.count)
                                                         for h, _, _ in unpack(data)))
        decoded = self._decode(ref, data, codec or self.codec)
        with self._lock:
            self._decoded[ref.digest] = decoded

    def _decode(self, ref: SegmentRef, data: bytes, codec: CodecParams) -> _Decoded:
        chunks = tuple(decode_segment(self.target.layout, codec, ref, data))
        olds = self.target.gather_many([(c.tensor, c.indices) for c in chunks])
        bits, delta = [], WeightsDigest()
        for chunk, old in zip(chunks, olds):
            new = torch.empty_like(old)
            delta = delta + apply_values(chunk.tensor, chunk.indices.numpy(), old.numpy(), chunk.values,
                                         codec.value_transform, new.numpy())
            bits.append(new)
        return _Decoded(ref, data, chunks, tuple(bits), delta)

    def finish(self, manifest: DeltaManifest, rest: dict[str, bytes] | None = None) -> StagedDelta:
        """The verified :class:`StagedDelta` of ``manifest`` from what was added plus ``rest`` (digest →
        bytes of segments not added yet). Raises like :func:`~aurora_store.codec.decoder.stage`."""
        check_applicable(manifest, self.target)
        if (self.target.version, str(self.target.digest)) != self.base:
            raise ManifestError("the target moved while segments were decoded ahead; stage again")
        for ref in manifest.segments:
            held = self._decoded.get(ref.digest)
            if held is not None and held.ref.chunks != ref.chunks:
                raise ManifestError(f"segment {ref.digest[:12]}… holds chunks that differ from its manifest entry")
            if held is not None and held.ref.size != ref.size:
                raise ManifestError(f"segment {ref.digest[:12]}… has {held.ref.size} bytes, its manifest entry "
                                    f"says {ref.size}")
            if held is not None and manifest.codec != self.codec:  # decoded under other parameters: redo
                self.add(ref, held.data, manifest.codec)
            elif held is None:
                if rest is None or ref.digest not in rest:
                    raise ManifestError(f"segment {ref.digest[:12]}… of version {manifest.version} was not "
                                        "supplied")
                self.add(ref, rest[ref.digest], manifest.codec)
        per_tensor: dict[str, list[tuple[DecodedChunk, torch.Tensor]]] = {}
        delta = WeightsDigest()
        for digest in dict.fromkeys(ref.digest for ref in manifest.segments):
            decoded = self._decoded[digest]
            delta = delta + decoded.digest_delta
            for chunk, bits in zip(decoded.chunks, decoded.bits):
                per_tensor.setdefault(chunk.tensor, []).append((chunk, bits))
        updates = []
        for name in sorted(per_tensor, key=self.target.layout.names.index):
            parts = sorted(per_tensor[name], key=lambda p: p[0].header.lo)
            for (before, _), (after, _) in itertools.pairwise(parts):
                if after.header.lo < before.header.hi:
                    raise CorruptSegmentError(f"chunks of {name} overlap")
            indices = concat_host([c.indices for c, _ in parts])
            if indices.numel() != manifest.changed.get(name, 0):
                raise ManifestError(f"{name}: decoded {indices.numel()} changes, manifest says "
                                    f"{manifest.changed.get(name, 0)}")
            updates.append(TensorUpdate(name, indices, concat_host([b for _, b in parts])))
        if str(self.target.digest + delta) != manifest.weights_digest:
            raise DigestMismatchError(f"applying version {manifest.version} would give weights digest "
                                      f"{self.target.digest + delta}, manifest says {manifest.weights_digest}")
        # Plan the scatter only once the version is accepted (as stage() does): activation is then one
        # scatter_ per piece, not an index cut on the batch boundary.
        planner = self.target
        if isinstance(planner, SupportsScatterPlan):
            updates = [TensorUpdate(u.tensor, u.indices, u.bits, planner.plan_scatter(u.tensor, u.indices))
                       for u in updates]
        return StagedDelta(manifest, tuple(updates))
