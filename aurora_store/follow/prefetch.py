"""Prefetching: an actor fetches each announced segment of a newer version in the background, before the
version's manifest exists, so that staging after the manifest only fetches what it is still missing.

Bounded: at most ``budget_bytes`` are held or in flight; a segment over the budget is simply not prefetched
(staging fetches it). Nothing prefetched is trusted by itself: each segment is verified against its
SHA-256 name by the reader, and only the signed manifest decides what is used — held segments it does not
name are dropped (and counted), as is everything for versions the actor has moved past. An actor that
missed every announcement still stages from the bucket: prefetching only saves time.

Announcements are unsigned (anyone on the bus can send one), so none may hold the budget for long: a
segment is offered only for the next ``window`` versions, and whatever a version holds or fetches is
released once it has been held ``hold_s`` without its manifest being staged — a version that never comes
pins nothing, and cut-through goes on for the versions that do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from aurora_store.codec.manifest import SegmentRef
from aurora_store.errors import AuroraError
from aurora_store.metrics import Metrics
from aurora_store.store.pool import PoolClosedError, shared_pool

log = logging.getLogger("aurora.follow.prefetch")

#: Reads one segment, verified (relay cache, then bucket); raises on failure.
Read = Callable[[SegmentRef], bytes]
#: Called with each verified prefetched segment before it is held (decode-ahead: :mod:`aurora_store.follow.ahead`).
Arrived = Callable[[int, SegmentRef, bytes], None]

#: Versions ahead of the active one that segments are prefetched for: the trainer announces the version it
#: is publishing, the next one; a few more ride out an actor that is a little behind.
WINDOW = 4
#: Seconds a version's prefetched segments are kept waiting for its manifest to be staged.
HOLD_S = 300.0


class Prefetcher:
    """Background fetches of announced segments within a byte budget, on ``streams`` lanes of the process's
    transfer pool (so their connections are the ones staging uses next); a
    :class:`~aurora_store.store.transfer.HeldSegments` for :func:`~aurora_store.store.transfer.fetch_segments`."""

    def __init__(self, streams: int, budget_bytes: int, metrics: Metrics, *, window: int = WINDOW,
                 hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_bytes = budget_bytes
        self.metrics = metrics
        self.window = window
        self.hold_s = hold_s
        self._clock = clock
        self._first_offer: dict[int, float] = {}  # version → when its first segment was offered
        self.refused = 0  # offers refused as out of the window or malformed
        self.expired_bytes = 0  # held bytes released for a version whose manifest never came
        self._pool = shared_pool().lanes(streams)
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, bytes]] = {}  # digest → (version announced with, bytes)
        self._inflight: dict[str, tuple[int, int, Future]] = {}  # digest → (version, size, fetch)
        self._reserved = 0  # bytes held + in flight
        self._floor = -1  # versions up to here are active or older: not wanted any more
        self.prefetched_bytes = 0
        self.used_bytes = 0
        self.dropped_bytes = 0
        self.over_budget = 0  # announcements not prefetched for the budget
        self.on_arrival: Arrived | None = None  # runs on the fetching thread, before waiters see the segment
        self._closed = False
        self._tasks: dict[str, Future] = {}  # digest → the pool's future of its fetch (to tell cancelled ones)

    def offer(self, version: int, ref: SegmentRef, read: Read) -> bool:
        """A segment of ``version`` was announced: fetch it in the background unless it is known, of a version
        not newer than the active one, too far ahead of it, or over the budget. Returns whether a fetch
        started."""
        with self._lock:
            self._expire()
            if self._closed or version <= self._floor or ref.digest in self._held or ref.digest in self._inflight:
                return False
            if ref.size < 1 or (self._floor >= 0 and version > self._floor + self.window):
                self.refused += 1
                return False
            self._first_offer.setdefault(version, self._clock())
            if self._reserved + ref.size > self.budget_bytes:
                self.over_budget += 1
                return False
            self._reserved += ref.size
            future: Future = Future()
            self._inflight[ref.digest] = (version, ref.size, future)
        try:
            task = self._pool.submit(self._fetch, version, ref, read, future)
            with self._lock:
                # a fast fetch may already be over (and have removed its entry): record only one in flight
                if ref.digest in self._inflight and self._inflight[ref.digest][2] is future:
                    self._tasks[ref.digest] = task
        except PoolClosedError:  # the process is exiting: nothing to wait for
            with self._lock:
                self._inflight.pop(ref.digest, None)
                self._reserved -= ref.size
            future.set_result(False)
            return False
        return True

    def _fetch(self, version: int, ref: SegmentRef, read: Read, future: Future) -> None:
        data: bytes | None = None
        try:
            data = read(ref)
        except (AuroraError, OSError) as exc:  # not there yet, or unreachable: staging fetches it
            log.debug("prefetch of %s… failed", ref.digest[:12], extra={"error": str(exc)})
        except Exception as exc:  # never lose the waiter below
            log.warning("prefetch of %s… failed", ref.digest[:12], extra={"error": repr(exc)})
        hook = self.on_arrival
        if data is not None and hook is not None and version > self._floor:
            self._arrived(hook, version, ref, data)  # while still in flight: staging waits for it, not twice
        with self._lock:
            self._inflight.pop(ref.digest, None)
            self._tasks.pop(ref.digest, None)
            if data is not None:
                self.prefetched_bytes += len(data)
                self.metrics.prefetched_bytes.inc(len(data))
            if data is not None and version > self._floor and version in self._first_offer:  # not expired meanwhile
                self._held[ref.digest] = (version, data)
            else:
                self._reserved -= ref.size
                if data is not None:
                    self._drop_counted(len(data))
        future.set_result(data is not None)

    @staticmethod
    def _arrived(hook: Arrived, version: int, ref: SegmentRef, data: bytes) -> None:
        try:
            hook(version, ref, data)
        except Exception as exc:  # only an optimisation: staging decodes the segment itself
            log.warning("decode-ahead of %s… failed", ref.digest[:12], extra={"error": repr(exc)})

    def reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` more of the budget (decoded data kept beside the bytes); ``False`` if over it."""
        with self._lock:
            if self._reserved + nbytes > self.budget_bytes:
                return False
            self._reserved += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes

    def held_of(self, version: int) -> list[tuple[SegmentRef, bytes]]:
        """The segments held for ``version`` (they stay held)."""
        with self._lock:
            return [(SegmentRef(d, len(data), ()), data) for d, (v, data) in self._held.items() if v == version]

    def submit(self, fn: Callable[..., object], *args: object) -> bool:
        """Run ``fn(*args)`` on the prefetch threads; ``False`` once closed."""
        with self._lock:
            if self._closed:  # the actor is leaving
                return False
        try:
            self._pool.submit(fn, *args)
        except PoolClosedError:
            return False
        return True

    def _drop_counted(self, nbytes: int) -> None:
        self.dropped_bytes += nbytes
        self.metrics.prefetch_dropped_bytes.inc(nbytes)

    def take(self, digest: str) -> bytes | None:
        with self._lock:
            entry = self._held.pop(digest, None)
            if entry is None:
                return None
            self._reserved -= len(entry[1])
            self.used_bytes += len(entry[1])
        self.metrics.segment_reads.labels("prefetched").inc()
        return entry[1]

    def claim(self, version: int, refs: Sequence[SegmentRef]) -> tuple[dict[str, bytes], dict[str, Future]]:
        """The signed manifest of ``version`` names ``refs``: take what is held, and the fetches still in
        flight for them; drop what was announced for ``version`` but is not named."""
        named = {ref.digest for ref in refs}
        with self._lock:
            stray = [d for d, (v, _) in self._held.items() if v == version and d not in named]
            for digest in stray:
                _, data = self._held.pop(digest)
                self._reserved -= len(data)
                self._drop_counted(len(data))
            pending = {d: self._inflight[d][2] for d in named if d in self._inflight}
        if stray:
            log.info("dropped %d prefetched segment(s) version %d does not name", len(stray), version)
        held = {}
        for digest in named:
            taken = self.take(digest)
            if taken is not None:
                held[digest] = taken
        return held, pending

    def _expire(self) -> None:
        """Release what versions offered more than ``hold_s`` ago still hold (under the lock)."""
        now = self._clock()
        stale = {v for v, first in self._first_offer.items() if now - first > self.hold_s}
        if not stale:
            return
        for version in stale:
            del self._first_offer[version]
        old = [d for d, (v, _) in self._held.items() if v in stale]
        for digest in old:
            _, data = self._held.pop(digest)
            self._reserved -= len(data)
            self.expired_bytes += len(data)
            self._drop_counted(len(data))
        if old:
            log.info("released %d prefetched segment(s) of version(s) whose manifest never came", len(old),
                     extra={"versions": sorted(stale)[:8]})

    def expire(self) -> None:
        """Release what has waited longer than ``hold_s`` (also done on every offer)."""
        with self._lock:
            self._expire()

    def retire(self, active_version: int) -> None:
        """The actor is on ``active_version``: nothing of it or older is wanted."""
        with self._lock:
            self._floor = max(self._floor, active_version)
            for version in [v for v in self._first_offer if v <= self._floor]:
                del self._first_offer[version]
            old = [d for d, (v, _) in self._held.items() if v <= self._floor]
            for digest in old:
                _, data = self._held.pop(digest)
                self._reserved -= len(data)
                self._drop_counted(len(data))

    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(data) for _, data in self._held.values())

    def close(self) -> None:
        """Stop prefetching (the actor is leaving): later offers are ignored, and fetches that had not started
        are released to their waiters as not prefetched (they read the bucket), never left hanging."""
        with self._lock:
            self._closed = True
            tasks = list(self._tasks.values())
        for task in tasks:  # only those not started yet are cancelled (the lanes queue them)
            task.cancel()
        with self._lock:
            cancelled = [digest for digest, task in self._tasks.items() if task.cancelled()]
            abandoned = [(self._inflight.pop(digest), self._tasks.pop(digest)) for digest in cancelled
                         if digest in self._inflight]
            for (_, size, _), _ in abandoned:
                self._reserved -= size
        for (_, _, future), _ in abandoned:
            future.set_result(False)
