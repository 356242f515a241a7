"""The rollout actor process: a follower of the run, a lease loop and an engine.

Lifecycle: bootstrap from the newest snapshot its plan chooses and replay deltas up to the committed version
(:mod:`~workers.actor.bootstrap`, through :class:`~aurora_store.follow.Follower`), register, then loop: take
leases, generate a batch on the active version (stamping version and digest at dispatch), return results. In
the background the :class:`~workers.actor.stager.Stager` stages ``D_{v+1}`` (or a snapshot, when the catch-up
plan says so) while the engine generates on ``v``, fed by the :class:`~workers.actor.intake.EventIntake`;
at the next batch boundary, once ``v+1`` is committed (or a lease demands it), it is activated in place — only
if the active version is its base. SIGTERM = graceful leave: leases handed back, deregistered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aurora_store import logs
from aurora_store.bus import ActorState, ControlPlane, Lease, RolloutResult
from aurora_store.bus.identity import ActorKey, Credentials, check_secret
from aurora_store.config import CommandDefaults, TransferSettings, heartbeat_ttl_s
from aurora_store.errors import AuroraError, BusError, DigestMismatchError
from aurora_store.follow import BucketChain, Follower, Prefetcher
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.trust import Verifier
from workers import lifecycle
from workers.actor.bootstrap import bootstrap, wait_for_run
from workers.actor.cli import ActorConfig, parse_args
from workers.actor.intake import EventIntake
from workers.actor.leases import LeaseQueue
from workers.actor.relay_watch import RelayWatch
from workers.actor.stager import Stager
from workers.actor.throughput import Throughput
from workers.actor.versions import VersionView
from workers.engines import Engine, load_engine

log = logging.getLogger("aurora.actor")

#: How long a leaving actor waits for a heartbeat in flight before it deregisters.
LEAVE_BEAT_WAIT_S = 2.0

#: Wraps the engine the actor loads (benchmarks and tests emulate slower engines this way).
EngineWrapper = Callable[[Engine], Engine]


class Actor:
    def __init__(self, config: ActorConfig, *, wrap_engine: EngineWrapper | None = None,
                 meter: Throughput | None = None) -> None:
        self.config = config
        self.actor_id = config.actor_id or f"{config.region}-{socket.gethostname()}-{os.getpid()}"
        settings = TransferSettings.from_env().with_overrides(streams=config.streams)
        self.plane = ControlPlane(config.redis, config.run, wait_s=120, heartbeat_ttl_s=heartbeat_ttl_s())
        self.metrics = Metrics("actor", config.run, config.region)
        if config.metrics_port is not None:
            self.metrics.serve(config.metrics_port)
        self.view = VersionView()
        # A fresh key pair per process: the private half never leaves memory; the public half is registered
        # with a proof of admission made from the operator's secret (which is not kept).
        self.key = ActorKey.generate()
        self.credentials = Credentials.issue(self.key, check_secret(CommandDefaults.from_env().admission_secret),
                                             config.run, self.actor_id)
        self.leases = LeaseQueue(self.plane, self.actor_id, self.view, self.key)
        self.meter = meter or Throughput()
        self._wrap_engine = wrap_engine
        self.leaving = threading.Event()
        self.stopped = threading.Event()
        self.beat_now = threading.Event()  # state changed: tell the trainer now, not at the next tick
        self._beat_lock = threading.Lock()  # a beat's check of ``stopped`` and its write, against the leave
        self.crashed: str | None = None  # a background loop died of an unexpected error: leave and exit non-zero
        self.status = "starting"
        self.downloaded_bytes = 0
        self.activations = 0
        self.cache_dir = Path(config.cache_dir or f"/tmp/aurora-actor-{self.actor_id}")
        regional = DeltaStore(open_bucket(config.bucket, settings=settings), settings)
        # The fallback bucket comes from this actor's own configuration, never from the (unsigned) run record
        # in the regional bucket, which whoever can write that bucket could point at a bucket of their own.
        source = (DeltaStore(open_bucket(config.source_bucket, settings=settings), settings)
                  if config.source_bucket else None)
        chain = BucketChain(regional, source, on_refetch=self._refetched)
        self.watch = RelayWatch(self.plane, chain, config.region, "", self.actor_id, cache_token=config.cache_token,
                                cache_timeout_s=config.cache_timeout_s, metrics=self.metrics)
        # The trainer's key comes from the command line / environment, never from a bucket. With a key,
        # manifests must also name this actor's run (one key may sign several runs).
        verify = Verifier.load(config.trainer_public_key, config.run) if config.trainer_public_key else None
        # Cut-through: segments announced for a newer version are fetched before its manifest (--no-prefetch:
        # the store-and-forward baseline), from the relay's cache when it has them.
        prefetcher = Prefetcher(settings.streams, config.prefetch_bytes, self.metrics) if config.prefetch else None
        self.follower = Follower(chain, verify=verify, streams=settings.streams, sources_for=self.watch.sources_for,
                                 on_read=self._read, prefetcher=prefetcher, metrics=self.metrics,
                                 on_event=lambda kind, fields: self.plane.log_event(kind, actor=self.actor_id,
                                                                                    **fields),
                                 on_bytes=self._downloaded)
        self.engine: Engine | None = None

    def _refetched(self, version: int, exc: BaseException) -> None:
        self.plane.log_event("refetch_source", actor=self.actor_id, version=version, error=type(exc).__name__)

    def _read(self, label: str, nbytes: int) -> None:
        self.metrics.segment_reads.labels(label).inc()

    def _downloaded(self, nbytes: int) -> None:
        self.downloaded_bytes += nbytes
        self.metrics.downloaded_bytes.inc(nbytes)

    def _load_engine(self, model_dir: Path, layout) -> Engine:
        engine = load_engine(self.config.engine, model_dir, layout, seed=self.config.seed,
                             options=self.config.engine_options)
        return self._wrap_engine(engine) if self._wrap_engine is not None else engine

    # --- bootstrap and state ---------------------------------------------------------------------

    def bootstrap(self) -> Engine:
        info = wait_for_run(self.follower.chain, self.config.wait_for_run_s, self.leaving.is_set)
        self.watch.home_region = info.get("home_region", "")
        self.watch.wait_for_relay(self.plane.heartbeat_ttl_s)
        self.watch.refresh()
        booted = bootstrap(self.follower, self.plane, self._load_engine, self.cache_dir, self.actor_id)
        self.engine = booted.engine
        version = self.follower.target.version
        with self.view.changed:
            self.view.committed = booted.committed
            self.view.known_latest = max(booted.latest, version or 0)
        self.plane.log_event("actor_bootstrap", actor=self.actor_id, region=self.config.region,
                             snapshot=booted.snapshot, deltas=len(booted.deltas), planned_bytes=booted.planned_bytes,
                             downloaded_bytes=self.downloaded_bytes, version=version)
        logs.set_version(version)
        log.info("bootstrapped", extra={"snapshot": booted.snapshot, "deltas": list(booted.deltas),
                                        "planned_bytes": booted.planned_bytes,
                                        "downloaded_bytes": self.downloaded_bytes})
        return booted.engine

    def state(self) -> ActorState:
        staged, attached = self.view.staged, self.follower.attached
        target = self.follower.target if attached else None
        return ActorState(
            actor_id=self.actor_id, region=self.config.region, engine=self.config.engine,
            active_version=target.version if target is not None else None,
            active_digest=str(target.digest) if target is not None else None,
            staged_version=staged.version if staged is not None else None, tokens_per_s=self.meter.reported(),
            leases=len(self.leases), status=self.status, heartbeat_ms=int(time.time() * 1000),
            source=self.follower.chain.label, downloaded_bytes=self.downloaded_bytes, host=socket.gethostname(),
            staging_version=self.view.staging)

    def _update_gauges(self) -> None:
        if not self.follower.attached:
            return
        m, staged, active = self.metrics, self.view.staged, self.follower.target.version or 0
        m.version_active.set(active)
        m.version_staged.set(staged.version if staged is not None else -1)
        m.version_lag.set(max(self.view.known_latest - active, 0))
        m.tokens_per_second.set(self.meter.tokens_per_s)

    def _heartbeat_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                self._update_gauges()
                self._beat()
                if self.watch.refresh():
                    with self.view.changed:
                        self.view.changed.notify_all()
            except AuroraError as exc:
                log.warning("heartbeat failed", extra={"error": str(exc)})
            self.beat_now.wait(1.0)
            self.beat_now.clear()

    def _beat(self) -> None:
        """One heartbeat, unless the actor is leaving. Checked and written under the lock :meth:`_leave` takes
        to set ``stopped``: a beat that landed after the deregistration would register the actor again, live
        until its TTL ran out, and a trainer could grant it leases it would never run."""
        with self._beat_lock:
            if not self.stopped.is_set():
                self.plane.heartbeat_actor(self.state(), self.credentials)

    # --- the main loop ---------------------------------------------------------------------------

    def _activate_ready(self, engine: Engine) -> None:
        """At a batch boundary: activate staged versions that are committed (or demanded by a lease)."""
        demanded = self.leases.demanded()
        while True:
            with self.view.changed:
                staged = self.view.staged
                if staged is None or staged.version > max(self.view.committed, demanded):
                    return
                self.view.staged = None
                started = time.perf_counter()
                if not self.follower.activate(staged):  # not on its base any more: dropped
                    continue
                engine.weights_changed()
                self.activations += 1
                self.view.changed.notify_all()
            seconds = time.perf_counter() - started
            self.metrics.activate_seconds.observe(seconds)
            self._update_gauges()
            target = self.follower.target
            logs.set_version(target.version)
            if self.config.verify_full_digest and target.full_digest() != target.digest:
                raise DigestMismatchError(f"weights after activating {staged.version} do not hash to its digest")
            self.plane.log_event("activate", actor=self.actor_id, region=self.config.region, version=staged.version,
                                 digest=str(target.digest), seconds=round(seconds, 6))
            log.info("activated version %d", staged.version, extra={"activate_s": round(seconds, 6)})
            self.beat_now.set()  # after the run log has the activation (the next tick may still come first)

    def _generate(self, engine: Engine, batch: list[Lease]) -> None:
        target = self.follower.target
        version, digest = target.version, str(target.digest)  # stamped at dispatch
        started = self.meter.clock()
        groups = engine.generate([lease.prompt for lease in batch], batch[0].group_size,
                                 min(self.config.max_new_tokens or batch[0].max_new_tokens, batch[0].max_new_tokens),
                                 batch[0].temperature,
                                 seed=(int(batch[0].lease_id[:8], 16) ^ self.config.seed) & 0x7FFFFFFF)
        elapsed = self.meter.clock() - started
        tokens = sum(len(c.ids) for group in groups for c in group)
        self.metrics.tokens.inc(tokens)
        self.meter.observe(tokens, elapsed, full_batch=len(batch) >= self.config.batch_size)
        share = elapsed / len(batch)
        for lease, group in zip(batch, groups):
            self.leases.send(RolloutResult(
                "result", lease.lease_id, self.actor_id, "", version, digest,
                sum(len(c.ids) for c in group), share, [c.as_dict() for c in group]))

    def run(self) -> int:
        engine = self.bootstrap()
        self.meter.calibrate(engine, self.config.batch_size, self.config.max_new_tokens, warm_up=True)
        self.leases.open()
        self.status = "ready"
        self.plane.register_actor(self.state(), self.credentials)
        lifecycle.enter("serving")  # from here a stop signal sets `leaving`: the finally below leaves gracefully
        stager = Stager(self.follower, self.view, self.plane, self.metrics, actor_id=self.actor_id,
                        region=self.config.region, full_sync=self.config.full_sync, stopped=self.stopped,
                        changed=self.beat_now.set)
        intake = EventIntake(self.plane, self.watch, self.follower, self.view, self.stopped)
        threads = [threading.Thread(target=self._guarded, args=(name, loop), name=name, daemon=True)
                   for name, loop in (("heartbeat", self._heartbeat_loop), ("events", intake.run),
                                      ("stager", stager.run))]
        for thread in threads:
            thread.start()
        log.info("ready", extra={"actor": self.actor_id, "region": self.config.region})
        self.plane.log_event("actor_ready", actor=self.actor_id, region=self.config.region,
                             version=self.follower.target.version, tokens_per_s=round(self.meter.reported(), 1))
        try:
            while not self.leaving.is_set():
                self.leases.pull(block_ms=None if len(self.leases) else 200)
                self._activate_ready(engine)
                batch = self.leases.batch(self.follower.target.version or 0, self.config.batch_size)
                if batch:
                    self._generate(engine, batch)
                elif len(self.leases):
                    with self.view.changed:  # work for a newer version: wait for staging
                        self.view.changed.wait(0.1)
        except BusError as exc:
            log.error("control plane unreachable", extra={"error": str(exc)})
            return 2
        finally:
            self._leave()
            for thread in threads:
                thread.join(timeout=5)
        return 3 if self.crashed else 0

    def _guarded(self, name: str, loop: Callable[[], None]) -> None:
        """Run a background loop; if it dies of an error it does not handle, the actor leaves (handing its
        leases back) and exits non-zero for its supervisor to restart it. Without this, an actor whose
        stager or event thread died would stay registered and heartbeating, but never move to a new version."""
        try:
            loop()
        except Exception as exc:
            self.crashed = f"{name}: {type(exc).__name__}: {exc}"
            log.exception("background loop %s crashed; leaving", name)
            with contextlib.suppress(AuroraError):  # the control plane may be what failed
                self.plane.log_event("actor_crash", actor=self.actor_id, loop=name, error=type(exc).__name__)
            self.leaving.set()

    def _leave(self) -> None:
        """Graceful leave: hand back unfinished leases at once, deregister."""
        self.status = "leaving"
        # After a beat in flight, not during it; bounded, so that a beat stuck on an unreachable Redis does not
        # hold up the leave (the deregistration would not get through either).
        waited = self._beat_lock.acquire(timeout=LEAVE_BEAT_WAIT_S)
        self.stopped.set()
        if waited:
            self._beat_lock.release()
        self.beat_now.set()
        try:
            # Deregistered before anything is handed back: the trainer re-grants returned leases to whoever has the
            # least outstanding work, and a leaver that has just returned all of its own is first in line. Returned
            # first, a lease could go straight back to us and expire (seen under load: one of five, in a run
            # whose trainer took the returns back before the deregistration). Returns are accepted from a
            # deregistered actor: each lease keeps the key it was granted under.
            self.plane.deregister_actor(self.actor_id, self.config.region)
            returned = self.leases.return_pending()
            # A dispatch that read our state just before we deregistered may still have granted us leases:
            # collect them too.
            returned += self.leases.return_pending()
            self.plane.log_event("actor_leave", actor=self.actor_id, returned=returned)
            log.info("left", extra={"returned": returned})
        except AuroraError as exc:
            log.warning("could not deregister cleanly", extra={"error": str(exc)})
        self.follower.close()
        if self.engine is not None:
            self.engine.close()


def main(argv: list[str] | None = None, *, wrap_engine: EngineWrapper | None = None,
         meter: Throughput | None = None) -> int:
    config = parse_args(argv)
    logs.configure(f"actor:{config.actor_id or config.region}", config.run)
    # Until run() enters "serving", SIGTERM/SIGINT unwind (connecting, waiting for the run, bootstrap); then
    # they set `leaving` and the main loop leaves gracefully (see workers.lifecycle).
    life = lifecycle.install("actor")

    def serve() -> int:
        actor = Actor(config, wrap_engine=wrap_engine, meter=meter)
        life.on_stop(actor.leaving.set)
        return actor.run()
    return life.run(serve)
