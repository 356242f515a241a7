"""The rollout actor process.

Lifecycle: bootstrap from the newest snapshot in its bucket, replay deltas up to the committed version,
register, then loop: take leases, generate a batch on the active version (stamping version and digest at
dispatch), return results. In the background it stages ``D_{v+1}`` (fetch + verify + decode) while
generating on ``v``; at the next batch boundary, once ``v+1`` is committed, it activates it by in-place
scatter — only if its active version is the delta's base. SIGTERM = graceful leave.

Live catch-up: whenever the actor is more than one version behind its bucket, or the next delta it needs
is gone (a gc removed it while the actor was frozen or partitioned), it plans replay vs. the newest
snapshot by bytes (:func:`~aurora_store.store.catchup.plan_catch_up` from its active version). A snapshot
path stages the snapshot like a delta (every file's SHA-256, the digest after applying it checked before
any weight is touched) and activates it at a batch boundary; replay continues from there. Each decision
is logged (``catch_up`` in the run log) and counted (``aurora_catch_up_decisions``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path

from aurora_store import logs
from aurora_store.bus import ActorState, ControlPlane, Lease, RolloutResult
from aurora_store.codec import CodecParams, Staged, StagedDelta, activate
from aurora_store.codec.digest import WeightsDigest
from aurora_store.codec.manifest import SegmentRef
from aurora_store.config import TransferSettings
from aurora_store.errors import (
    AuroraError,
    BusError,
    DigestMismatchError,
    FormatError,
    VersionNotFoundError,
)
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore, open_bucket, plan_catch_up
from aurora_store.store.catchup import CatchUpPlan
from aurora_store.store.replay import stage_snapshot, stage_version
from aurora_store.store.snapshots import load_snapshot, read_snapshot_manifest
from aurora_store.trust import Verifier
from workers import lifecycle
from workers.actor.ahead import DecodeAhead
from workers.actor.cli import ActorConfig, parse_args
from workers.actor.engine import Engine, load_engine
from workers.actor.prefetch import Prefetcher, staging_fetcher
from workers.actor.segments import RelayCache, read_segment
from workers.actor.sources import BAD_COPY_ERRORS, VersionSources

log = logging.getLogger("aurora.actor")


class Actor:
    def __init__(self, config: ActorConfig) -> None:
        self.config = config
        self.actor_id = config.actor_id or f"{config.region}-{socket.gethostname()}-{os.getpid()}"
        settings = TransferSettings.from_env()
        if config.streams:
            settings = TransferSettings(**{**settings.__dict__, "streams": config.streams})
        self.settings = settings
        self.plane = ControlPlane(config.redis, config.run, wait_s=120)
        self.regional = DeltaStore(open_bucket(config.bucket, settings=settings), settings)
        self.engine: Engine | None = None
        self.sources: VersionSources | None = None
        self.lock = threading.Condition()
        self.staged: Staged | None = None
        self.staging: int | None = None
        self.beat_now = threading.Event()  # state changed: tell the trainer now, not at the next tick
        self.known_latest = -1
        self.committed = -1
        self.queue: deque[Lease] = deque()
        self.work_cursor: str | None = None  # last entry read from our work stream (set once registered)
        self.token = ""
        self.leaving = threading.Event()
        self.stopped = threading.Event()
        self.crashed: str | None = None  # a background loop died of an unexpected error: leave and exit non-zero
        self.tokens_per_s = 0.0
        self.downloaded_bytes = 0
        self.activations = 0
        self.calibrated_at = 0.0
        self._sizes: dict[tuple[str, str, int], int] = {}  # (bucket, kind, version) → download bytes
        self._planned: tuple[int, int] | None = None  # (active version, goal) of the last catch-up decision
        self._blocked: int | None = None  # active version at which no catch-up path was found (logged once)
        self.status = "starting"
        self.cache_dir = Path(config.cache_dir or f"/tmp/aurora-actor-{self.actor_id}")
        self.metrics = Metrics("actor", config.run, config.region)
        if config.metrics_port:
            self.metrics.serve(config.metrics_port)
        # The trainer's key comes from the command line / environment, never from a bucket.
        # With a key, manifests must also name this actor's run (one key may sign several runs).
        self.verify = Verifier.load(config.trainer_public_key, config.run) if config.trainer_public_key else None
        # Cut-through: segments announced for a newer version are fetched before its manifest (--no-prefetch:
        # the store-and-forward baseline), from the relay's cache when it has them.
        self.prefetcher = (Prefetcher(settings.streams, config.prefetch_bytes, self.metrics)
                           if config.prefetch else None)
        self.ahead: DecodeAhead | None = None  # decode-ahead of the next version's prefetched segments (bootstrap)
        self._decoded_ahead = 0  # segments the last staging found decoded already
        self._relay_cache: RelayCache | None = None
        self.read_bytes = {"relay_cache": 0, "bucket": 0}  # where segment bytes came from (stager and prefetch)
        self._bytes_lock = threading.Lock()  # segments are read on several threads at once
        self._manifest_seen: dict[int, float] = {}  # version → when this actor learned its manifest exists

    # --- bootstrap -------------------------------------------------------------------------------

    def _wait_for_run(self) -> dict:
        timeout_s = self.config.wait_for_run_s
        started = time.monotonic()
        next_note = started + 30.0
        while True:
            info = self._run_info(self.regional)
            if info is not None and self.regional.snapshot_versions():
                return info
            if self.config.source_bucket:
                source = DeltaStore(open_bucket(self.config.source_bucket, settings=self.settings), self.settings)
                info = self._run_info(source)
                if info is not None and source.snapshot_versions():
                    return info
            now = time.monotonic()
            if timeout_s > 0 and now - started > timeout_s:
                raise VersionNotFoundError(f"no run and snapshot appeared in {self.regional.url} in {timeout_s:g} s "
                                           f"(is the trainer running? raise --wait-for-run to wait longer)")
            if now >= next_note:  # say why nothing happens yet, so a waiting actor does not look hung
                log.info("waiting for the run's first snapshot", extra={"bucket": self.regional.url,
                                                                        "waited_s": round(now - started)})
                next_note = now + 30.0
            time.sleep(0.5)

    @staticmethod
    def _run_info(store: DeltaStore) -> dict | None:
        """The advisory run record; a malformed one counts as absent (it is never trusted for anything)."""
        try:
            return store.run_info()
        except FormatError as exc:
            log.warning("ignoring a malformed run record in %s", store.url, extra={"error": str(exc)})
            return None

    def bootstrap(self) -> None:
        info = self._wait_for_run()
        # The fallback bucket comes from this actor's own configuration, never from the (unsigned) run record
        # in the regional bucket, which whoever can write that bucket could point at a bucket of their own.
        source = None
        if self.config.source_bucket:
            source = DeltaStore(open_bucket(self.config.source_bucket, settings=self.settings), self.settings)
            if source.url == self.regional.url:  # compared as opened: a path and its file:// URL are one bucket
                source.close()
                source = None
        self.sources = VersionSources(self.regional, source, self.config.region, info.get("home_region", ""),
                                      self.plane, self.actor_id)
        self.sources.wait_for_relay(self.plane.heartbeat_ttl_s)
        self.sources.refresh()
        store = self.sources.store()
        if not store.snapshot_versions() and source is not None:
            store = source  # regional bucket not seeded yet
        try:
            self._bootstrap_from(store)
        except BAD_COPY_ERRORS as exc:
            if source is None or store is source:
                raise
            # A corrupt or forged regional copy: the source bucket is the truth.
            log.warning("bootstrap from %s failed; using the source bucket", store.url, extra={"error": str(exc)})
            self.plane.log_event("refetch_source", actor=self.actor_id, version=-1, error=type(exc).__name__)
            if self.engine is not None:
                self.engine.close()
                self.engine = None
            self._bootstrap_from(source)

    def _bootstrap_from(self, store: DeltaStore) -> None:
        trainer = self.plane.trainer_state()
        latest = store.latest_version() or 0
        self.committed = trainer.committed if trainer is not None and trainer.committed >= 0 else max(latest - 1, 0)
        goal = min(latest, self.committed)
        snapshots = {s: read_snapshot_manifest(store, s).total_bytes for s in store.snapshot_versions() if s <= goal}
        plan = plan_catch_up(None, goal, {v: store.delta_bytes(v) for v in store.versions() if v <= goal}, snapshots)
        # The layout comes from the (signed) snapshot manifest; its document is checked against that hash.
        snapshot = read_snapshot_manifest(store, plan.snapshot)
        if self.verify is not None:
            self.verify(snapshot)
        self.layout = store.layout(snapshot.layout_fingerprint)
        model_dir = self.cache_dir / f"snapshot-{plan.snapshot}"
        _, manifest = load_snapshot(store, plan.snapshot, self.layout, download_dir=model_dir,
                                    verify_manifest=self.verify)
        self.downloaded_bytes += manifest.total_bytes
        self.engine = load_engine(self.config.engine, model_dir, self.layout, seed=self.config.seed,
                                  options=self.config.engine_options)
        target = self.engine.target
        target.version = plan.snapshot
        target.digest = WeightsDigest.parse(manifest.weights_digest)
        if target.full_digest() != target.digest:
            raise DigestMismatchError("engine weights differ from the snapshot it loaded")
        codec = None
        for version in plan.deltas:
            staged = stage_version(store, version, target, streams=self.settings.streams,
                                   on_fetched=self._count_bytes, verify_manifest=self.verify)
            activate(staged, target)
            self.downloaded_bytes += len(staged.manifest.to_bytes())
            codec = staged.manifest.codec
        if self.prefetcher is not None:  # decode-ahead needs the run's codec, from a verified manifest
            self.ahead = DecodeAhead(target, self.prefetcher, self.metrics,
                                     codec or self._codec_of(store, plan.snapshot))
        self.engine.weights_changed()
        self.known_latest = max(latest, target.version)
        self.plane.log_event("actor_bootstrap", actor=self.actor_id, region=self.config.region,
                             snapshot=plan.snapshot, deltas=len(plan.deltas), planned_bytes=plan.bytes,
                             downloaded_bytes=self.downloaded_bytes, version=target.version)
        logs.set_version(target.version)
        log.info("bootstrapped", extra={"snapshot": plan.snapshot, "deltas": list(plan.deltas),
                                        "planned_bytes": plan.bytes, "downloaded_bytes": self.downloaded_bytes})

    def _codec_of(self, store: DeltaStore, version: int) -> CodecParams | None:
        """The codec of ``version``'s verified delta manifest, if the bucket still has one."""
        if version < 1:
            return None
        try:
            manifest = store.manifest(version)
            if self.verify is not None:
                self.verify(manifest)
        except AuroraError as exc:
            log.info("no codec for decode-ahead yet", extra={"error": str(exc)})
            return None
        return manifest.codec

    def _count_bytes(self, nbytes: int) -> None:
        self.downloaded_bytes += nbytes
        self.metrics.downloaded_bytes.inc(nbytes)

    # --- state -----------------------------------------------------------------------------------

    @property
    def target(self):
        return self.engine.target

    def state(self) -> ActorState:
        staged = self.staged
        return ActorState(
            actor_id=self.actor_id, region=self.config.region, engine=self.config.engine,
            active_version=self.target.version if self.engine else None,
            active_digest=str(self.target.digest) if self.engine else None,
            staged_version=staged.version if staged is not None else None,
            tokens_per_s=self.config.claim_tokens_per_s or self.tokens_per_s,
            leases=len(self.queue), status=self.status, heartbeat_ms=int(time.time() * 1000),
            source=self.sources.label if self.sources else "regional", downloaded_bytes=self.downloaded_bytes,
            host=socket.gethostname(), staging_version=self.staging)

    def _update_gauges(self) -> None:
        m, staged = self.metrics, self.staged
        m.version_active.set(self.target.version)
        m.version_staged.set(staged.version if staged is not None else -1)
        m.version_lag.set(max(self.known_latest - self.target.version, 0))
        m.tokens_per_second.set(self.tokens_per_s)

    def _heartbeat_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                self._update_gauges()
                self.plane.heartbeat_actor(self.state(), self.token)
                if self.sources is not None and self.sources.refresh():
                    with self.lock:
                        self.lock.notify_all()
            except AuroraError as exc:
                log.warning("heartbeat failed", extra={"error": str(exc)})
            self.beat_now.wait(1.0)
            self.beat_now.clear()

    # --- background: learn about versions and stage the next one ---------------------------------

    def _events_loop(self) -> None:
        cursors = {r: self.plane.latest_event_id(r) for r in self.sources.event_regions()}
        last_poll = 0.0
        while not self.stopped.is_set():
            try:
                regions = self.sources.event_regions()
                for region in regions:
                    cursors.setdefault(region, self.plane.latest_event_id(region))
                for region, entry_id, event in self.plane.read_events({r: cursors[r] for r in regions},
                                                                      block_ms=500):
                    cursors[region] = entry_id
                    if event.kind == "segment":
                        self._offer(event)
                        continue
                    with self.lock:
                        if event.kind == "staged":
                            self._manifest_seen.setdefault(event.version, time.monotonic())
                            self.known_latest = max(self.known_latest, event.version)
                        elif event.kind == "commit":
                            self.committed = max(self.committed, event.version)
                        self.lock.notify_all()
                if time.monotonic() - last_poll > 2.0:  # the bucket is the truth: notifications may be lost
                    last_poll = time.monotonic()
                    newer = self.sources.store().versions(after=self.known_latest)
                    trainer = self.plane.trainer_state()
                    with self.lock:
                        for version in newer:
                            self._manifest_seen.setdefault(version, time.monotonic())
                        if newer:
                            self.known_latest = max(self.known_latest, newer[-1])
                        if trainer is not None:
                            self.committed = max(self.committed, trainer.committed)
                        self.lock.notify_all()
            except (AuroraError, OSError) as exc:
                log.warning("event loop error", extra={"error": str(exc)})
                self.stopped.wait(0.5)

    def _offer(self, event) -> None:
        """A segment of a version being published is readable (from the trainer's bucket, or from the relay's
        cache): prefetch it if the version is newer than the active one."""
        if self.prefetcher is None or not event.segment or event.size is None or self.engine is None:
            return
        if event.version <= self.target.version:
            return
        store = self.sources.store()
        self.prefetcher.offer(event.version, SegmentRef(event.segment, event.size, ()),
                              lambda ref: self._read_segment(store, ref))

    def _cache(self) -> RelayCache | None:
        url = self.sources.cache_url if self.sources is not None else None
        if url is None or not self.config.cache_token:
            return None
        cache = self._relay_cache
        if cache is None or cache.url != url:
            try:
                cache = self._relay_cache = RelayCache(url, self.config.cache_token, self.metrics,
                                                       self.config.cache_timeout_s)
            except ValueError:
                log.warning("ignoring the relay's unusable cache URL", extra={"url": url[:200]})
                return None
        return cache

    def _read_segment(self, store: DeltaStore, ref: SegmentRef) -> bytes:
        """One segment, verified: the relay's cache, else ``store`` (a miss, an error, a timeout or wrong
        bytes from the cache all fall through)."""
        cache = self._cache() if store is not self.sources.source else None
        data, label = read_segment(ref, store, cache)
        self.metrics.segment_reads.labels(label).inc()
        with self._bytes_lock:
            self.read_bytes[label] += len(data)
            self._count_bytes(len(data))
        return data

    def _stage(self, version: int, *, snapshot: bool = False) -> Staged:
        """Stage from the current bucket; if its copy is corrupt or tampered with (bad bytes, unparseable,
        unsigned, mis-signed or foreign-run manifest), re-fetch from the source bucket instead."""
        return self.sources.read(version, lambda store: self._stage_from(store, version, snapshot=snapshot))

    def _stage_from(self, store: DeltaStore, version: int, *, snapshot: bool = False) -> Staged:
        self._decoded_ahead = 0
        if self.config.full_sync or snapshot:  # full_sync: the full-broadcast baseline, every version's snapshot
            staged = stage_snapshot(store, version, self.target, streams=self.settings.streams,
                                    verify_manifest=self.verify)
            self._count_bytes(staged.snapshot_bytes)
            return staged
        fetch = staging_fetcher(lambda ref: self._read_segment(store, ref), self.settings.streams, self.prefetcher)
        ahead = self.ahead
        delta = stage_version(store, version, self.target, streams=self.settings.streams, verify_manifest=self.verify,
                              fetch=fetch, decode=ahead.stage if ahead is not None else None)
        self._decoded_ahead = ahead.last_decoded_ahead if ahead is not None else 0
        return delta

    def _size(self, store: DeltaStore, kind: str, version: int) -> int:
        """Download bytes of a delta or snapshot (manifests are immutable: read once)."""
        key = (store.url, kind, version)
        if key not in self._sizes:
            self._sizes[key] = (store.delta_bytes(version) if kind == "delta"
                                else read_snapshot_manifest(store, version).total_bytes)
        return self._sizes[key]

    def _plan_catch_up(self, cause: str) -> CatchUpPlan | None:
        """Replay or snapshot, by bytes, from the active version to the newest version the bucket holds.
        ``None`` when there is nothing to decide (not behind, or the bucket does not hold the next version
        yet). Raises :class:`VersionNotFoundError` when no snapshot or delta chain reaches it."""
        store = self.sources.store()
        current = self.target.version
        deltas = store.versions(after=current)
        snapshots = [s for s in store.snapshot_versions() if s > current]
        goal = max(deltas[-1:] + snapshots[-1:], default=None)
        if goal is None or goal <= current + (1 if cause == "behind" else 0):
            return None
        if self._planned == (current, goal) and cause == "behind":
            return None  # decided already; the stager is carrying it out
        plan = plan_catch_up(current, goal, {v: self._size(store, "delta", v) for v in deltas if v <= goal},
                             {s: self._size(store, "snapshot", s) for s in snapshots if s <= goal})
        self._planned = (current, goal)
        self.metrics.catch_up.labels(plan.kind, cause).inc()
        self.plane.log_event("catch_up", actor=self.actor_id, version=current, goal=goal, cause=cause, path=plan.kind,
                             snapshot=plan.snapshot, deltas=len(plan.deltas), bytes=plan.bytes,
                             replay_bytes=plan.replay_bytes, bucket=store.url)
        log.info("catch-up from %d to %d: %s", current, goal, plan.kind,
                 extra={"cause": cause, "snapshot": plan.snapshot, "bytes": plan.bytes,
                        "replay_bytes": plan.replay_bytes})
        return plan

    def _next_to_stage(self, want: int, cause: str) -> tuple[int, bool] | None:
        """What to stage next: ``(version, is_snapshot)``, or ``None`` to wait."""
        try:
            plan = self._plan_catch_up(cause)
        except VersionNotFoundError as exc:
            # Neither the chain nor a snapshot reaches the bucket's newest version from here (yet): wait.
            if self._blocked != self.target.version:  # said once per active version, not every retry
                self._blocked = self.target.version
                log.warning("no catch-up path", extra={"error": str(exc), "version": self.target.version})
                self.plane.log_event("catch_up_blocked", actor=self.actor_id, version=self.target.version,
                                     cause=cause, error=str(exc)[:200])
            return None
        if plan is not None and plan.kind == "snapshot":
            return plan.snapshot, True
        if plan is None and cause == "missing":
            return None  # not in this bucket yet (relay still copying)
        return want, False

    def _stager_loop(self) -> None:
        missing = False  # the last attempt found the next delta absent from the bucket
        while not self.stopped.is_set():
            with self.lock:
                want = self.target.version + 1
                if self.staged is not None or self.known_latest < want:
                    self.lock.wait(0.5)
                    continue
                behind = self.known_latest > want
            version, snapshot = want, False
            if (behind or missing) and not self.config.full_sync:
                try:
                    nxt = self._next_to_stage(want, "missing" if missing else "behind")
                except AuroraError as exc:
                    log.warning("catch-up planning failed", extra={"error": str(exc)})
                    nxt = None
                if nxt is None:  # nothing reachable yet: look again with a fresh listing
                    missing = False
                    self.stopped.wait(0.5)
                    continue
                version, snapshot = nxt
            self.staging = version
            self.beat_now.set()
            started = time.perf_counter()
            try:
                staged = self._stage(version, snapshot=True) if snapshot else self._stage(version)
                self.metrics.fetch_seconds.observe(time.perf_counter() - started)
                self._staged_now(version, started, staged)
                missing = False
            except VersionNotFoundError:
                # Announced but not in this bucket yet (relay still copying), or gone (gc): the next pass
                # plans from the listing, which tells the two apart.
                missing = True
                self.stopped.wait(0.3)
                continue
            except AuroraError as exc:
                # Corrupt or tampered input is refused; the weights are untouched. Try again later (a
                # re-fetch, or the source bucket if the relay is gone).
                log.error("staging version %d failed", version, extra={"error": str(exc), "kind": type(exc).__name__})
                self.plane.log_event("stage_failed", actor=self.actor_id, version=version, error=type(exc).__name__)
                self.stopped.wait(1.0)
                continue
            finally:
                self.staging = None
            with self.lock:
                if staged.base_version == self.target.version:
                    self.staged = staged
                    self.lock.notify_all()
            self.beat_now.set()

    def _staged_now(self, version: int, started: float, staged: Staged) -> None:
        """Time from learning of the manifest to staged (the part cut-through shortens), with where the
        bytes came from so far and how many of its segments were decoded before the manifest."""
        now = time.monotonic()
        seen = self._manifest_seen.pop(version, None)
        seconds = now - seen if seen is not None else time.perf_counter() - started
        for old in [v for v in self._manifest_seen if v < version]:
            self._manifest_seen.pop(old, None)
        self.metrics.staged_after_manifest_seconds.observe(seconds)
        p = self.prefetcher
        self.plane.log_event("stage", actor=self.actor_id, region=self.config.region, version=version,
                             after_manifest_s=round(seconds, 4), cache_bytes=self.read_bytes["relay_cache"],
                             bucket_bytes=self.read_bytes["bucket"], prefetched_bytes=p.prefetched_bytes if p else 0,
                             prefetch_used_bytes=p.used_bytes if p else 0,
                             prefetch_dropped_bytes=p.dropped_bytes if p else 0,
                             segments=len(staged.manifest.segments) if isinstance(staged, StagedDelta) else 0,
                             decoded_ahead=self._decoded_ahead)

    # --- the main loop ---------------------------------------------------------------------------

    def _activate_ready(self) -> None:
        """At a batch boundary: activate staged versions that are committed (or demanded by a lease)."""
        demanded = max((lease.version for lease in self.queue), default=-1)
        while True:
            with self.lock:
                staged = self.staged
                if staged is None or staged.version > max(self.committed, demanded):
                    return
                if staged.base_version != self.target.version:
                    self.staged = None
                    continue
                started = time.perf_counter()
                with self.ahead.writing() if self.ahead is not None else contextlib.nullcontext():
                    activate(staged, self.target)  # not while segments are decoded against the old weights
                if self.ahead is not None:  # before the stager can start on the next version
                    self.ahead.resume()
                self.engine.weights_changed()
                self.staged = None
                self.activations += 1
                self.lock.notify_all()
            if self.prefetcher is not None:
                self.prefetcher.retire(self.target.version)
            self.beat_now.set()
            seconds = time.perf_counter() - started
            self.metrics.activate_seconds.observe(seconds)
            self._update_gauges()
            logs.set_version(self.target.version)
            if self.config.verify_full_digest and self.target.full_digest() != self.target.digest:
                raise DigestMismatchError(f"weights after activating {staged.version} do not hash to its digest")
            self.plane.log_event("activate", actor=self.actor_id, region=self.config.region, version=staged.version,
                                 digest=str(self.target.digest), seconds=round(seconds, 6))
            log.info("activated version %d", staged.version, extra={"activate_s": round(seconds, 6)})

    def _pull_work(self, cursor: str, block_ms: int | None) -> str:
        for entry_id, lease in self.plane.read_work(self.actor_id, cursor, block_ms=block_ms):
            cursor = entry_id
            self.queue.append(lease)
            with self.lock:  # a lease on v implies v is published and committed
                if lease.version > self.known_latest:
                    self.known_latest = lease.version
                    self.lock.notify_all()
        return cursor

    def _return_pending(self) -> int:
        """Hand back every lease granted to us and not generated: queued ones and any still unread in our
        work stream (granted while the last batch was generating). Returns how many."""
        if self.work_cursor is not None:
            self.work_cursor = self._pull_work(self.work_cursor, block_ms=None)
        pending = list(self.queue)
        self.queue.clear()
        self._return(pending)
        return len(pending)

    def _return(self, leases: list[Lease]) -> None:
        for lease in leases:
            self.plane.send_result(RolloutResult("return", lease.lease_id, self.actor_id, self.token))

    def _generate(self, batch: list[Lease]) -> None:
        version, digest = self.target.version, str(self.target.digest)  # stamped at dispatch
        started = time.perf_counter()
        max_new_tokens = self.config.max_new_tokens or batch[0].max_new_tokens
        groups = self.engine.generate([lease.prompt for lease in batch], batch[0].group_size, max_new_tokens,
                                      batch[0].temperature,
                                      seed=(int(batch[0].lease_id[:8], 16) ^ self.config.seed) & 0x7FFFFFFF)
        tokens = sum(len(c.ids) for group in groups for c in group)
        elapsed = self._emulate(time.perf_counter() - started, self._charged(tokens, len(groups) * batch[0].group_size,
                                                                             max_new_tokens))
        self.metrics.tokens.inc(tokens)
        if len(batch) >= self.config.batch_size and elapsed > 0:
            # Capacity is measured on full batches only: partial batches are dominated by fixed costs and
            # would make an under-used actor look slow, starving it further.
            self.tokens_per_s = 0.7 * self.tokens_per_s + 0.3 * tokens / elapsed
        self._throttle(tokens, elapsed)
        share = elapsed / len(batch)
        for lease, group in zip(batch, groups):
            self.plane.send_result(RolloutResult(
                "result", lease.lease_id, self.actor_id, self.token, version, digest,
                sum(len(c.ids) for c in group), share, [c.as_dict() for c in group]))

    def _throttle(self, tokens: int, elapsed: float) -> None:
        """``--throttle-file`` (tests): stretch the batch to the file's tokens/s cap, after the self-measurement."""
        if not self.config.throttle_file:
            return
        try:
            cap = float(Path(self.config.throttle_file).read_text().strip() or 0)
        except (OSError, ValueError):
            return
        if cap > 0 and tokens / cap > elapsed:
            time.sleep(min(tokens / cap - elapsed, 300.0))

    def _emulate(self, elapsed: float, tokens: int) -> float:
        """Stretch a batch to emulate a slower engine (``--slowdown``, ``--sim-tokens-per-s``)."""
        target = elapsed * max(self.config.slowdown, 1.0)
        if self.config.sim_tokens_per_s:
            target = max(target, tokens / self.config.sim_tokens_per_s)
        if target > elapsed:
            time.sleep(target - elapsed)
        return target

    def _charged(self, tokens: int, samples: int, max_new_tokens: int) -> int:
        """Tokens the emulated engine is charged for: what was sampled, or with ``--sim-full-length`` every
        sample's whole budget (sampled lengths vary step to step, and would make emulated steps vary with them)."""
        return samples * max_new_tokens if self.config.sim_full_length else tokens

    def calibrate(self, warm_up: bool = False) -> None:
        """Measure generation capacity (tokens/s) once, before taking work. It is only the prior the trainer
        may use until it has measured this actor's settled work, so it is not repeated when idle: a
        recalibration blocks the actor for a whole batch, and leases granted meanwhile would wait for it."""
        prompts = ["1+1="] * min(self.config.batch_size, 8)
        if warm_up:
            self.engine.generate(prompts, 2, 2, 1.0, seed=0)  # first calls pay one-time costs
        started = time.perf_counter()
        max_new_tokens = self.config.max_new_tokens or 4
        groups = self.engine.generate(prompts, 4, max_new_tokens, 1.0, seed=1)
        tokens = self._charged(sum(len(c.ids) for g in groups for c in g), 4 * len(prompts), max_new_tokens)
        rate = tokens / self._emulate(time.perf_counter() - started, tokens)
        self.tokens_per_s = rate if not self.tokens_per_s else 0.5 * self.tokens_per_s + 0.5 * rate
        self.calibrated_at = time.monotonic()

    def run(self) -> int:
        self.bootstrap()
        self.calibrate(warm_up=True)
        self.work_cursor = self.plane.latest_id(self.plane.keys.work(self.actor_id))
        self.status = "ready"
        self.token = self.plane.register_actor(self.state())
        lifecycle.enter("serving")  # from here a stop signal sets `leaving`: the finally below leaves gracefully
        threads = [threading.Thread(target=self._guarded, args=(f,), name=f.__name__, daemon=True)
                   for f in (self._heartbeat_loop, self._events_loop, self._stager_loop)]
        for thread in threads:
            thread.start()
        log.info("ready", extra={"actor": self.actor_id, "region": self.config.region})
        self.plane.log_event("actor_ready", actor=self.actor_id, region=self.config.region,
                             version=self.target.version, tokens_per_s=round(self.tokens_per_s, 1))
        try:
            while not self.leaving.is_set():
                self.work_cursor = self._pull_work(self.work_cursor, block_ms=None if self.queue else 200)
                self._activate_ready()
                active = self.target.version
                obsolete = [lease for lease in self.queue if lease.version < active]
                if obsolete:  # their step is over (the trainer only moves on once a batch is complete)
                    self.queue = deque(lease for lease in self.queue if lease.version >= active)
                    self._return(obsolete)
                batch: list[Lease] = []
                for lease in list(self.queue):
                    if lease.version == active and len(batch) < self.config.batch_size:
                        batch.append(lease)
                if batch:
                    for lease in batch:
                        self.queue.remove(lease)
                    self._generate(batch)
                elif self.queue:
                    with self.lock:  # work for a newer version: wait for staging
                        self.lock.wait(0.1)
        except BusError as exc:
            log.error("control plane unreachable", extra={"error": str(exc)})
            return 2
        finally:
            self._leave()
            for thread in threads:
                thread.join(timeout=5)
        return 3 if self.crashed else 0

    def _guarded(self, loop) -> None:
        """Run a background loop; if it dies of an error it does not handle, the actor leaves (handing its
        leases back) and exits non-zero for its supervisor to restart it. Without this, an actor whose
        stager or event thread died would stay registered and heartbeating, but never move to a new version."""
        try:
            loop()
        except Exception as exc:
            self.crashed = f"{loop.__name__}: {type(exc).__name__}: {exc}"
            log.exception("background loop %s crashed; leaving", loop.__name__)
            with contextlib.suppress(AuroraError):  # the control plane may be what failed
                self.plane.log_event("actor_crash", actor=self.actor_id, loop=loop.__name__, error=type(exc).__name__)
            self.leaving.set()

    def _leave(self) -> None:
        """Graceful leave: hand back unfinished leases at once, deregister."""
        self.status = "leaving"
        self.stopped.set()
        self.beat_now.set()
        try:
            returned = self._return_pending()
            self.plane.deregister_actor(self.actor_id, self.config.region)
            # A dispatch that read our state just before we deregistered may still have granted us leases:
            # collect them too (returns are accepted from a deregistered actor; its token is remembered).
            returned += self._return_pending()
            self.plane.log_event("actor_leave", actor=self.actor_id, returned=returned)
            log.info("left", extra={"returned": returned})
        except AuroraError as exc:
            log.warning("could not deregister cleanly", extra={"error": str(exc)})
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.engine is not None:
            self.engine.close()


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logs.configure(f"actor:{config.actor_id or config.region}", config.run)
    # Until run() enters "serving", SIGTERM/SIGINT unwind (connecting, waiting for the run, bootstrap); then
    # they set `leaving` and the main loop leaves gracefully (see workers.lifecycle).
    life = lifecycle.install("actor")

    def serve() -> int:
        actor = Actor(config)
        life.on_stop(actor.leaving.set)
        return actor.run()
    return life.run(serve)
