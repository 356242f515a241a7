"""The relay process: one per remote region, the region's single cross-region copy of every version.

It copies each segment from the source bucket into the regional bucket as soon as the trainer announces
it (cut-through: before the manifest exists), over parallel streams, through a hot cache that it serves to
the region's actors (:mod:`workers.relay.serve`), announcing each segment there once cached; when the
manifest is announced it makes sure every segment is there, writes the manifest bytes unchanged (create-
only) and re-announces ``staged`` — and, once the trainer commits, ``commit`` — on the region's stream. A
restarted relay re-reads both buckets and copies only what the regional bucket lacks.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import Future, wait
from pathlib import Path

from aurora_store import logs
from aurora_store.bus import ControlPlane, RelayState, VersionEvent
from aurora_store.bus.messages import is_sha256
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.config import TransferSettings, heartbeat_ttl_s
from aurora_store.errors import AuroraError, ObjectNotFoundError, VersionExistsError
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.pool import shared_pool
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.trust import Verifier
from workers import lifecycle
from workers.relay.cli import RelayConfig, parse_args
from workers.relay.serve import CacheServer, advertised_url, private_address

log = logging.getLogger("aurora.relay")

#: Segment events are acted on only for versions at most this far ahead of the newest one in the region: the
#: trainer announces the version it is publishing, a version or two ahead at most. Anything further is a
#: forgery or a relay so far behind that copying at ``staged`` (which reads the signed manifest) costs nothing.
SEGMENT_WINDOW = 8
#: Copies in flight or queued, at most, started by segment events (their names are not signed: a flood of
#: forged names would otherwise queue without end in front of real copies). Manifest copies are not bounded
#: here: a signed manifest bounds them.
MAX_EVENT_COPIES = 512


class SegmentCache:
    """Hot cache of recent segments: a bounded in-memory LRU, spilling to an optional disk directory."""

    def __init__(self, memory_bytes: int, disk_dir: str | None = None, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self.memory_bytes = memory_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.disk = Path(disk_dir) if disk_dir else None
        if self.disk is not None:
            self.disk.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0

    def get(self, digest: str) -> bytes | None:
        """A served read: counted as a hit or a miss."""
        data = self.peek(digest)
        with self._lock:
            self._count(hit=data is not None)
        return data

    def _file(self, digest: str) -> Path | None:
        """The disk tier's file of ``digest`` — only for a well-formed SHA-256 name, so that no name (they come
        from messages anyone on the bus can write) can reach a file outside the cache directory."""
        if self.disk is None or not is_sha256(digest):
            return None
        return self.disk / digest

    def peek(self, digest: str) -> bytes | None:
        """The cached bytes, not counted (the relay's own copy path)."""
        with self._lock:
            data = self._items.get(digest)
            if data is not None:
                self._items.move_to_end(digest)
                return data
        path = self._file(digest)
        if path is not None:
            try:
                return path.read_bytes()
            except FileNotFoundError:  # never spilled, or discarded meanwhile
                return None
        return None

    def holds(self, digest: str) -> bool:
        with self._lock:
            if digest in self._items:
                return True
        path = self._file(digest)
        return path is not None and path.is_file()

    def discard(self, digests: set[str]) -> None:
        """Forget segments no reader needs any more (versions older than the current one's base)."""
        with self._lock:
            for digest in digests:
                blob = self._items.pop(digest, None)
                if blob is not None:
                    self._size -= len(blob)
        for digest in digests:
            path = self._file(digest)
            if path is not None:
                path.unlink(missing_ok=True)

    def _count(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        if self.metrics is not None:
            (self.metrics.cache_hits if hit else self.metrics.cache_misses).inc()
            self.metrics.update_cache(self.hits, self.misses)

    def put(self, digest: str, data: bytes) -> None:
        if not is_sha256(digest):
            raise ValueError(f"not a segment name: {digest[:80]!r}")
        with self._lock:
            if digest in self._items or len(data) > self.memory_bytes:
                return
            self._items[digest] = data
            self._size += len(data)
            while self._size > self.memory_bytes:
                old, blob = self._items.popitem(last=False)
                self._size -= len(blob)
                path = self._file(old)
                if path is not None:
                    tmp = path.with_name(f".{old}.tmp")
                    tmp.write_bytes(blob)
                    tmp.replace(path)


class Relay:
    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.settings = settings = TransferSettings.from_env().with_overrides(streams=config.streams)
        self.source = DeltaStore(open_bucket(config.source, settings=settings), settings)
        self.dest = DeltaStore(open_bucket(config.dest, create=True, settings=settings), settings)
        self.plane = ControlPlane(config.redis, config.run, wait_s=120, heartbeat_ttl_s=heartbeat_ttl_s())
        self.metrics = Metrics("relay", config.run, config.region)
        if config.metrics_port is not None:
            self.metrics.serve(config.metrics_port)
        self.cache = SegmentCache(config.cache_bytes, config.cache_dir, self.metrics)
        self.pool = shared_pool().lanes(settings.streams)  # the process's warm transfer threads, S at a time
        self.inflight: dict[str, Future] = {}
        self.present: set[str] = set()
        self.forwarded: set[int] = set()
        self._listed = False
        self.snapshots: set[int] = set()
        self.committed = -1
        self.commit_sent = -1
        self.version: int | None = None
        self.segments_copied = 0
        self.bytes_copied = 0  # cross-region bytes: everything read from the source bucket
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.progress_at = time.monotonic()  # last completed copy or loop iteration (the watchdog's input)
        # A relay cannot mint versions: it forwards only manifests signed by the trainer, bytes unchanged.
        self.verify_manifest = (Verifier.load(config.trainer_public_key, config.run)
                                if config.trainer_public_key else None)
        # The region's actors read hot segments from here before the regional write completes (only with the
        # run's token: weights are confidential; --no-serve-cache is the store-and-forward baseline).
        self.server: CacheServer | None = None
        self.cache_url: str | None = None
        if config.serve_cache and config.cache_token:
            bind = config.cache_bind if config.cache_bind is not None else private_address()
            self.server = CacheServer((bind, config.cache_port), self.cache.get, config.cache_token,
                                      self.metrics, max_connections=config.cache_connections,
                                      header_deadline_s=config.cache_header_deadline_s,
                                      per_client=config.cache_per_client)
            self.cache_url = advertised_url(config.cache_host, self.server.port, bind)
        elif config.serve_cache:
            log.warning("no cache token (--cache-token / AURORA_CACHE_TOKEN): not serving the hot cache")
        self.announced: set[str] = set()  # segments announced to the region as servable
        self.segments_by_version: dict[int, set[str]] = {}
        self.dropped: Counter[str] = Counter()  # events not acted on, by reason (also a Prometheus counter)

    # --- copying ---------------------------------------------------------------------------------

    def _copy_segment(self, ref: SegmentRef, version: int | None) -> None:
        if ref.digest in self.present:
            return
        data = self.cache.peek(ref.digest)
        if data is None:
            data = self.source.get_segment(ref)
            with self._lock:
                self.segments_copied += 1
                self.bytes_copied += len(data)
            self.metrics.cross_region_bytes.inc(len(data))
            self.cache.put(ref.digest, data)
        if version is not None:
            with self._lock:
                self.segments_by_version.setdefault(version, set()).add(ref.digest)
        if self.server is not None and self.cache.holds(ref.digest):
            self._announce(ref, version)  # servable from here now, before the regional write
        self.dest.put_segment(ref, data)
        with self._lock:
            self.present.add(ref.digest)
        self._announce(ref, version)  # readable from the regional bucket (once per segment either way)
        self.progress_at = time.monotonic()

    def _announce(self, ref: SegmentRef, version: int | None) -> None:
        """Cut-through into the region: tell its actors a segment of ``version`` is readable, so that they
        prefetch it instead of waiting for the manifest."""
        if version is None:
            return
        with self._lock:
            if ref.digest in self.announced:
                return
            self.announced.add(ref.digest)
        self.plane.announce(VersionEvent("segment", version, self.config.region, segment=ref.digest, size=ref.size,
                                         sent_ms=self.plane.now_ms()))

    def copy_segment(self, ref: SegmentRef, version: int | None = None) -> Future:
        with self._lock:
            future = self.inflight.get(ref.digest)
            started = future is None or (future.done() and future.exception() is not None)
            if started:
                future = self.pool.submit(self._copy_segment, ref, version)
                self.inflight[ref.digest] = future
        assert future is not None
        if started:
            # Outside the lock: a copy already over runs its callback here and now, and the callback takes it.
            future.add_done_callback(functools.partial(self._settled, ref.digest))
        return future

    def _settled(self, digest: str, future: Future) -> None:
        """A copy is over: forget it (a copied segment is in ``present``; a failed one may be asked again), so
        the map holds only what is in flight — never every name a message ever mentioned."""
        with self._lock:
            if self.inflight.get(digest) is future:
                del self.inflight[digest]

    def _drop(self, reason: str, event: VersionEvent) -> None:
        self.dropped[reason] += 1
        self.metrics.events_dropped.labels(reason).inc()
        if self.dropped[reason] & (self.dropped[reason] - 1) == 0:  # 1st, 2nd, 4th, …: a flood logs little
            log.warning("not acting on a %s event", event.kind,
                        extra={"reason": reason, "version": event.version, "count": self.dropped[reason]})

    def _in_source(self, kind: str, version: int) -> bool:
        """Whether the source bucket (the trainer's: the truth) holds ``version``'s manifest — an event's
        version is acted on only then. One HEAD, and none for versions known already."""
        if (kind == "delta" and version in self.forwarded) or (kind == "snapshot" and version in self.snapshots):
            return True
        key = object_names.delta(version) if kind == "delta" else object_names.snapshot_manifest(version)
        return self.source.bucket.exists(key)

    def _newest_here(self) -> int:
        """The newest version the region holds (delta or snapshot); -1 before any."""
        return max(self.version if self.version is not None else -1, max(self.snapshots, default=-1))

    def _evict_before(self, version: int) -> None:
        """Keep the current and the next version hot: readers of older ones read the regional bucket."""
        with self._lock:
            old = [v for v in self.segments_by_version if v < version]
            keep = set().union(*(d for v, d in self.segments_by_version.items() if v >= version))
            gone = set().union(*(self.segments_by_version.pop(v) for v in old)) - keep
            self.announced -= gone
        if gone:
            self.cache.discard(gone)

    def forward_version(self, version: int) -> None:
        """Make the regional bucket hold ``version`` completely, manifest last; then announce it."""
        if version in self.forwarded:
            return
        started = time.perf_counter()
        raw = self.source.manifest_bytes(version)
        manifest = DeltaManifest.from_bytes(raw)
        if manifest.version != version:
            raise AuroraError(f"source manifest under version {version} declares {manifest.version}")
        if self.verify_manifest is not None:
            self.verify_manifest(manifest)
        for future in [self.copy_segment(ref, version) for ref in manifest.segments]:
            future.result()
        self.dest.put_layout(self.source.layout(manifest.layout_fingerprint))
        try:
            self.dest.publish_manifest(raw)  # the same bytes: signatures and digests stay valid
        except VersionExistsError:
            log.error("regional bucket holds a different manifest for version %d; not forwarding", version)
            raise
        self.forwarded.add(version)
        self.version = max(self.version or 0, version)
        self._evict_before(self.version)
        self.metrics.version_published.set(self.version)
        self.metrics.publish_seconds.observe(time.perf_counter() - started)
        self.plane.announce(VersionEvent("staged", version, self.config.region, base=manifest.base_version,
                                         manifest_key=object_names.delta(version),
                                         weights_digest=manifest.weights_digest,
                                         sent_ms=self.plane.now_ms()))
        self.plane.log_event("relay_forward", region=self.config.region, version=version,
                             bytes=manifest.segment_bytes, segments=len(manifest.segments))
        log.info("forwarded version %d", version, extra={"bytes": manifest.segment_bytes})
        self._send_commits()

    def forward_snapshot(self, version: int) -> None:
        if version in self.snapshots:
            return
        manifest = read_snapshot_manifest(self.source, version)
        if self.verify_manifest is not None:
            self.verify_manifest(manifest)
        for entry in manifest.files:
            key = object_names.snapshot_dir(version) + entry.name
            if self.dest.bucket.exists(key) and self.dest.bucket.size(key) == entry.size:
                continue
            data = self.source.get_object(key)
            with self._lock:
                self.bytes_copied += len(data)
            self.metrics.cross_region_bytes.inc(len(data))
            self.dest.put_object(key, data)
            self.progress_at = time.monotonic()
        for fingerprint in filter(None, (manifest.layout_fingerprint, manifest.files_layout)):
            self.dest.put_layout(self.source.layout(fingerprint))
        raw = self.source.get_object(object_names.snapshot_manifest(version))
        self.dest.create_object(object_names.snapshot_manifest(version), raw, error=VersionExistsError)
        self.snapshots.add(version)
        self.plane.announce(VersionEvent("snapshot", version, self.config.region,
                                         manifest_key=object_names.snapshot_manifest(version),
                                         weights_digest=manifest.weights_digest))

    def _send_commits(self) -> None:
        """Commit(v) reaches the region only once the regional bucket holds v (a commit covers all ≤ v)."""
        version = self.committed
        if version > self.commit_sent and (version in self.forwarded or version in self.snapshots):
            self.commit_sent = version
            self.plane.announce(VersionEvent("commit", version, self.config.region, sent_ms=self.plane.now_ms()))

    # --- resynchronisation -----------------------------------------------------------------------

    def sync(self) -> None:
        """Bring the regional bucket up to date from the listing (the truth), copying only what it lacks."""
        info = self.source.run_info()
        if info is None:
            return
        if self.dest.run_info() != info:
            self.dest.put_run_info(info)
        if not self._listed:  # once: what the region already holds (a restarted relay copies none of it)
            self.present |= set(self.dest.segment_digests())
            self.forwarded |= set(self.dest.versions())
            if self.forwarded:
                self.version = max(self.version or 0, max(self.forwarded))
            self._listed = True
        self.snapshots |= set(self.dest.snapshot_versions())
        source_snapshots = self.source.snapshot_versions()
        if source_snapshots and not self.snapshots:
            self.forward_snapshot(source_snapshots[-1])
        floor = max(self.snapshots) if self.snapshots else 0
        done = floor
        while done + 1 in self.forwarded:  # everything up to here is in the region: list only what is newer
            done += 1
        for version in self.source.versions(after=done):
            if version not in self.forwarded:
                self.forward_version(version)
        newest_snapshot = source_snapshots[-1] if source_snapshots else None
        if newest_snapshot is not None and newest_snapshot not in self.snapshots:
            self.forward_snapshot(newest_snapshot)
        trainer = self.plane.trainer_state()
        if trainer is not None:
            self._commit(trainer.committed)  # a state in Redis is a message like any other
        self._send_commits()

    def heartbeat(self) -> None:
        self.plane.heartbeat_relay(RelayState(self.config.region, self.version, self.segments_copied,
                                              self.bytes_copied, self.cache.hits, self.cache.misses,
                                              int(time.time() * 1000), self.cache_url))

    def stalled(self) -> bool:
        return time.monotonic() - self.progress_at > self.config.stall_s

    def _heartbeat_loop(self) -> None:
        """Beat from a thread of its own: forwarding a large snapshot (or riding out a stalled request)
        takes longer than the heartbeat TTL, and a relay that is busy must not look gone — its actors would
        fall back to the source bucket and every one of them would pay the cross-region copy. A relay whose
        work has made no progress for ``stall_s`` stops beating, so a wedged relay does let them fall back."""
        was_stalled = False
        while not self.stopping.is_set():
            stalled = self.stalled()
            if stalled != was_stalled:  # log the transitions, not every silent second
                if stalled:
                    log.error("no progress for %.0fs: not heartbeating (actors will read the source bucket)",
                              time.monotonic() - self.progress_at)
                else:
                    log.warning("progress again: heartbeating")
                was_stalled = stalled
            if not stalled:
                try:
                    self.heartbeat()
                except AuroraError as exc:
                    log.warning("heartbeat failed", extra={"error": str(exc)})
            self.stopping.wait(1.0)

    def run(self) -> int:
        home = (self.source.run_info() or {}).get("home_region")
        while home is None and not self.stopping.is_set():
            time.sleep(0.5)
            home = (self.source.run_info() or {}).get("home_region")
        if home is None:  # told to stop before the run had begun: nothing to relay
            return 0
        cursor = self.plane.latest_event_id(home) if home else "0"
        self.progress_at = time.monotonic()
        if self.server is not None:
            self.server.start()
            log.info("serving the hot cache", extra={"url": self.cache_url})
        beating = threading.Thread(target=self._heartbeat_loop, name="relay-heartbeat", daemon=True)
        beating.start()
        self.sync()  # a restarted relay's backlog: its actors wait for it rather than all crossing regions
        last_sync = time.monotonic()
        log.info("relay ready", extra={"region": self.config.region, "home": home})
        lifecycle.enter("serving")
        while not self.stopping.is_set():
            try:
                events, cursors = self.plane.read_event_batch({home: cursor}, block_ms=300)
                cursor = cursors[home]  # past malformed entries too: each is dropped once
                for _, _, event in events:
                    try:
                        self._handle(event)
                    except AuroraError as exc:  # this event only: the batch's others still count
                        log.error("handling a %s event failed; the next resync covers it", event.kind,
                                  extra={"error": str(exc)[:300], "kind": type(exc).__name__,
                                         "version": event.version})
                now = time.monotonic()
                if now - last_sync >= 2.0:  # recover whatever notifications were lost
                    self.sync()
                    last_sync = now
                self.progress_at = time.monotonic()
            except ObjectNotFoundError as exc:
                log.warning("source object missing (yet)", extra={"error": str(exc)})
                time.sleep(0.2)
            except AuroraError as exc:
                log.error("relay step failed; will resync", extra={"error": str(exc), "kind": type(exc).__name__})
                time.sleep(0.5)
        with self._lock:
            copies = list(self.inflight.values())
        for copy in copies:  # finish the copies under way; the rest is re-listed by the next start
            copy.cancel()
        wait(copies)
        if self.server is not None:
            self.server.stop()
        beating.join(timeout=5)
        return 0

    def _handle(self, event: VersionEvent) -> None:
        """Act on one event — only as far as the source bucket bears it out: Redis notifies, the bucket
        decides. An event that is not borne out is dropped and counted, never slept on, and leaves no state
        behind beyond the bounds above."""
        if event.kind == "segment":
            if self.config.store_and_forward or event.segment is None or event.size is None:
                return
            if not self._newest_here() < event.version <= self._newest_here() + SEGMENT_WINDOW:
                self._drop("segment_out_of_window", event)
                return
            with self._lock:
                pending = len(self.inflight)
            if pending >= MAX_EVENT_COPIES:
                self._drop("segment_copies_full", event)
                return
            self.copy_segment(SegmentRef(event.segment, event.size, ()), event.version)
        elif event.kind == "staged":
            if event.version in self.forwarded:
                return
            if not self._in_source("delta", event.version):
                self._drop("staged_not_in_source", event)
                return
            self.forward_version(event.version)
        elif event.kind == "commit":
            self._commit(event.version, event)
        elif event.kind == "snapshot":
            if not self._in_source("snapshot", event.version):
                self._drop("snapshot_not_in_source", event)
                return
            self.forward_snapshot(event.version)

    def _commit(self, version: int, event: VersionEvent | None = None) -> None:
        """Commit(``version``) counts only for a version the source bucket holds: one forged commit with a huge
        version would otherwise stand above every real one, and the relay would never forward another."""
        if version <= self.committed:
            return
        if not (self._in_source("delta", version) or self._in_source("snapshot", version)):
            if event is not None:
                self._drop("commit_not_in_source", event)
            else:
                self.dropped["commit_not_in_source"] += 1
                self.metrics.events_dropped.labels("commit_not_in_source").inc()
            return
        self.committed = version
        self._send_commits()


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logs.configure(f"relay:{config.region}", config.run)
    life = lifecycle.install("relay")  # unwinds while starting; sets `stopping` once serving

    def serve() -> int:
        relay = Relay(config)
        life.on_stop(relay.stopping.set)
        return relay.run()
    return life.run(serve)
