"""The actor's stager: in the background, stage the next version (or the snapshot a catch-up plan chose) while
the engine generates on the active one. Staging never writes the weights; a staged version waits in the
:class:`~workers.actor.versions.VersionView` for a batch boundary."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from aurora_store.bus import ControlPlane
from aurora_store.codec import Staged, StagedDelta
from aurora_store.errors import AuroraError, VersionNotFoundError
from aurora_store.follow import Follower, Step
from aurora_store.metrics import Metrics
from workers.actor.versions import VersionView

log = logging.getLogger("aurora.actor.stager")


class Stager:
    def __init__(self, follower: Follower, view: VersionView, plane: ControlPlane, metrics: Metrics, *,
                 actor_id: str, region: str, full_sync: bool, stopped: threading.Event,
                 changed: Callable[[], None]) -> None:
        self.follower = follower
        self.view = view
        self.plane = plane
        self.metrics = metrics
        self.actor_id = actor_id
        self.region = region
        self.full_sync = full_sync  # the full-broadcast baseline: every version from its snapshot
        self.stopped = stopped
        self._changed = changed  # tell the trainer now (a heartbeat), not at the next tick

    def run(self) -> None:
        missing = False  # the last attempt found the next delta absent from the bucket
        target = self.follower.target
        while not self.stopped.is_set():
            with self.view.changed:
                want = (target.version or 0) + 1
                if self.view.staged is not None or self.view.known_latest < want:
                    self.view.changed.wait(0.5)
                    continue
                behind = self.view.known_latest > want
                committed = self.view.committed
            step: Step | None = Step(want)
            if (behind or missing) and not self.full_sync:
                try:
                    # Not past the committed version: a snapshot beyond it waits for its commit, and meanwhile
                    # this actor is on no version the trainer dispatches on.
                    step = self.follower.next_step(want, "missing" if missing else "behind", ceiling=committed)
                except AuroraError as exc:
                    log.warning("catch-up planning failed", extra={"error": str(exc)})
                    step = None
                if step is None:  # nothing reachable yet: look again with a fresh listing
                    missing = False
                    self.stopped.wait(0.5)
                    continue
            assert step is not None
            missing = self._stage(step)

    def _stage(self, step: Step) -> bool:
        """Stage ``step`` and hand it to the view; returns whether the version was missing from the bucket."""
        self.view.staging = step.version
        self._changed()
        started = time.perf_counter()
        try:
            staged = self.follower.stage(step, full_sync=self.full_sync)
            self.metrics.fetch_seconds.observe(time.perf_counter() - started)
            self._report(step.version, started, staged)
        except VersionNotFoundError:
            # Announced but not in this bucket yet (relay still copying), or gone (gc): the next pass plans
            # from the listing, which tells the two apart.
            self.stopped.wait(0.3)
            return True
        except AuroraError as exc:
            # Corrupt or tampered input is refused; the weights are untouched. Try again later (a re-fetch,
            # or the source bucket if the relay is gone).
            log.error("staging version %d failed", step.version, extra={"error": str(exc),
                                                                       "kind": type(exc).__name__})
            self.plane.log_event("stage_failed", actor=self.actor_id, version=step.version,
                                 error=type(exc).__name__)
            self.stopped.wait(1.0)
            return False
        finally:
            self.view.staging = None
        with self.view.changed:
            if staged.base_version == self.follower.target.version:
                self.view.staged = staged
                self.view.changed.notify_all()
        self._changed()
        return False

    def _report(self, version: int, started: float, staged: Staged) -> None:
        """Time from learning of the manifest to staged (the part cut-through shortens), with where the
        bytes came from so far and how many of its segments were decoded before the manifest."""
        seen = self.view.seconds_since_manifest(version)
        seconds = seen if seen is not None else time.perf_counter() - started
        self.metrics.staged_after_manifest_seconds.observe(seconds)
        reads = self.follower.reader.bytes_by_source
        p = self.follower.prefetcher
        self.plane.log_event("stage", actor=self.actor_id, region=self.region, version=version,
                             after_manifest_s=round(seconds, 4), cache_bytes=reads.get("relay_cache", 0),
                             bucket_bytes=reads.get("bucket", 0), prefetched_bytes=p.prefetched_bytes if p else 0,
                             prefetch_used_bytes=p.used_bytes if p else 0,
                             prefetch_dropped_bytes=p.dropped_bytes if p else 0,
                             segments=len(staged.manifest.segments) if isinstance(staged, StagedDelta) else 0,
                             decoded_ahead=self.follower.decoded_ahead)
