"""Decode-ahead on the actor: prefetched segments of the version right after the active one are decoded and
hashed against the active weights as they arrive (an :class:`~aurora_store.codec.ahead.AheadStager`), so that
staging after the signed manifest only runs its checks and decodes what had not arrived yet.

When it applies: a segment announced for ``active + 1`` (the version the stager stages next, on top of the
active weights), once the codec is known from a verified manifest (the run's; the first version after a
bootstrap from a bare snapshot is only prefetched). Segments of later versions are only held as bytes; after
an activation the held segments of the new ``active + 1`` are decoded then (:meth:`DecodeAhead.resume`).
Anything else — another base, another codec in the manifest, nothing decoded — stages the normal way.

Decoding ahead is valid only against the exact base bits, so an activation waits for decodes in progress
(:meth:`DecodeAhead.writing`) and discards everything decoded against the old weights. Decoded data counts
against the prefetcher's byte budget (reserved from the chunk headers before decoding; over the budget a
segment is simply held as bytes). Nothing decoded ahead is trusted before :meth:`AheadStager.finish` has
checked it against the manifest.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from aurora_store.codec.ahead import AheadStager
from aurora_store.codec.decoder import StagedDelta, stage
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.segment import unpack
from aurora_store.codec.target import WeightTarget
from aurora_store.errors import AuroraError
from aurora_store.follow.prefetch import Prefetcher
from aurora_store.metrics import Metrics

log = logging.getLogger("aurora.follow.ahead")

#: Bytes decoding keeps per changed element beside the segment: an int64 index and the new 16-bit pattern
#: (the old pattern is gathered only while hashing).
_PER_CHANGE = 8 + 2 + 2


def decoded_size(data: bytes) -> int:
    """Memory decoding ``data`` keeps, from its chunk headers (before anything is inflated)."""
    return sum(h.count * _PER_CHANGE + h.index_raw_len + h.value_raw_len for h, _, _ in unpack(data))


@dataclass
class _Slot:
    stager: AheadStager
    version: int
    reserved: int = 0  # of the prefetcher's budget, for decoded data
    live: bool = True
    decoding: set[str] = field(default_factory=set)  # being decoded now
    queued: set[str] = field(default_factory=set)  # to be decoded on a prefetch thread, not started


class _Gate:
    """Decoders read the target together; an activation writes it alone."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            while self._readers:
                self._cond.wait()
            yield


class DecodeAhead:
    """One actor's decode-ahead state; ``prefetcher.on_arrival`` feeds it."""

    def __init__(self, target: WeightTarget, prefetcher: Prefetcher, metrics: Metrics,
                 codec: CodecParams | None = None) -> None:
        self.target = target
        self.prefetcher = prefetcher
        self.metrics = metrics
        self.codec = codec
        self.last_decoded_ahead = 0  # segments the last staging found decoded already
        self.over_budget = 0
        self._gate = _Gate()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a decode ahead finished
        self._slot: _Slot | None = None
        self._busy: int | None = None  # version being staged
        self._done = -1  # staged already: late arrivals of it are not decoded
        prefetcher.on_arrival = self.arrived

    def learn(self, manifest: DeltaManifest) -> None:
        """A verified manifest's codec is the run's: decode ahead with it from now on."""
        with self._lock:
            self.codec = manifest.codec

    def arrived(self, version: int, ref: SegmentRef, data: bytes) -> None:
        """A verified prefetched segment of ``version``: decode it now if ``version`` is next after the active."""
        with self._gate.reading():
            with self._lock:
                slot = self._slot_for(version)
                if slot is None or ref.digest in slot.stager or ref.digest in slot.decoding:
                    return
                slot.decoding.add(ref.digest)
            self._decode(slot, ref, data)

    def resume(self) -> int:
        """After an activation: decode the segments held for the new next version, in the background. A staging
        that starts meanwhile waits for those being decoded and decodes those not started itself. Returns how
        many were queued."""
        with self._gate.reading(), self._lock:
            version = self.target.version + 1 if self.target.version is not None else -1
            slot = self._slot_for(version)
            if slot is None:
                return 0
            todo = [(ref, data) for ref, data in self.prefetcher.held_of(version)
                    if ref.digest not in slot.stager and ref.digest not in slot.decoding]
            slot.queued.update(ref.digest for ref, _ in todo)
        for ref, data in todo:
            if not self.prefetcher.submit(self._resumed, slot, ref, data):
                break  # closed: the actor is leaving
        return len(todo)

    def _resumed(self, slot: _Slot, ref: SegmentRef, data: bytes) -> None:
        with self._gate.reading():
            with self._lock:
                if ref.digest not in slot.queued:  # taken by a staging meanwhile
                    return
                slot.queued.discard(ref.digest)
                if not slot.live or ref.digest in slot.stager or ref.digest in slot.decoding:
                    return
                slot.decoding.add(ref.digest)
            self._decode(slot, ref, data)

    def _slot_for(self, version: int) -> _Slot | None:
        """The slot decoding ``version`` against the target now (made if need be); ``None`` when it is not the
        next version, the codec is unknown, or the version is staged or being staged. Under the lock."""
        base = (self.target.version, str(self.target.digest))
        if self.codec is None or base[0] is None or version != base[0] + 1 or version <= self._done:
            return None
        slot = self._slot
        if slot is None and self._busy == version:
            return None  # staged the normal way right now
        if slot is None or slot.stager.base != base or slot.stager.codec != self.codec:
            self._discard_locked()
            slot = self._slot = _Slot(AheadStager(self.target, self.codec), version)
        return slot

    def _decode(self, slot: _Slot, ref: SegmentRef, data: bytes) -> None:
        """Decode one marked segment into ``slot`` (the caller reads under the gate), within the budget."""
        try:
            extra = decoded_size(data) + len(data)
        except AuroraError:
            extra = -1  # unparseable: staging refuses it with the manifest's say
        reserved = extra >= 0 and self.prefetcher.reserve(extra)
        with self._lock:
            if extra >= 0 and not reserved:
                self.over_budget += 1
            if reserved and slot.live:
                slot.reserved += extra
            elif reserved:  # dropped meanwhile (an activation, or staged)
                self.prefetcher.release(extra)
                reserved = False
        try:
            if reserved:
                slot.stager.add(ref, data)
        except AuroraError as exc:  # staging meets it again and refuses it properly
            log.info("segment %s… not decoded ahead", ref.digest[:12], extra={"error": str(exc)})
        finally:
            self._decoded_one(slot, ref)

    def _decoded_one(self, slot: _Slot, ref: SegmentRef) -> None:
        with self._changed:
            slot.decoding.discard(ref.digest)
            self._changed.notify_all()

    def stage(self, manifest: DeltaManifest, segments: Iterable[tuple[SegmentRef, bytes]]) -> StagedDelta:
        """Stage ``manifest`` (checked and applicable to the target) from ``segments`` (each verified): finish
        what was decoded ahead when it was decoded against this target with the manifest's codec, else stage
        normally. Either way every check of :func:`~aurora_store.codec.decoder.stage` runs, and what was
        decoded ahead is dropped afterwards (used, or refused with the manifest)."""
        with self._gate.reading():
            with self._lock:
                slot = self._slot
                base = (self.target.version, str(self.target.digest))
                usable = (slot is not None and slot.version == manifest.version and slot.stager.base == base
                          and slot.stager.codec == manifest.codec)
                if not usable:
                    self._discard_locked()
                self._busy = manifest.version  # arrivals meanwhile join a usable slot, or wait
            self.last_decoded_ahead = 0
            staged = None
            try:
                if usable and slot is not None:
                    staged = self._finish(slot, manifest, segments)
                else:
                    staged = stage(manifest, segments, self.target)
            finally:
                with self._lock:
                    self._busy = None
                    self._discard_locked()
                    if staged is not None:
                        self._done = max(self._done, manifest.version)
                        self.codec = manifest.codec  # verified: the run's, to decode the next version with
            return staged

    def _finish(self, slot: _Slot, manifest: DeltaManifest, segments: Iterable[tuple[SegmentRef, bytes]]
                ) -> StagedDelta:
        ahead = 0
        for ref, data in segments:
            with self._changed:  # being decoded on a prefetch thread: wait, rather than decode it twice
                slot.queued.discard(ref.digest)  # not started: decoded here
                while ref.digest in slot.decoding:
                    self._changed.wait()
            if ref.digest in slot.stager:
                ahead += 1
                continue
            slot.stager.add(ref, data)
        staged = slot.stager.finish(manifest)
        self.last_decoded_ahead = ahead
        self.metrics.decoded_ahead.inc(ahead)
        log.debug("staged %d with %d of %d segments decoded ahead", manifest.version, ahead,
                  len(manifest.segments))
        return staged

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around any write to the target: waits for decodes in progress, then drops what was decoded ahead
        (against weights that are about to change)."""
        with self._gate.writing():
            try:
                yield
            finally:
                with self._lock:
                    self._discard_locked()

    def _discard_locked(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.live = False
            self._release_locked(slot)

    def _release_locked(self, slot: _Slot) -> None:
        if slot.reserved:
            self.prefetcher.release(slot.reserved)
            slot.reserved = 0

    def decoded(self) -> int:
        """Segments decoded ahead and not yet used or discarded."""
        with self._lock:
            return 0 if self._slot is None else len(self._slot.stager)
