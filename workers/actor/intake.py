"""The actor's event intake: ``staged`` / ``commit`` / ``segment`` events of the streams that announce its
bucket's versions, and — since notifications may be lost — a look at the bucket's listing every few seconds.
Segments of a newer version are offered to the follower's prefetcher as they are announced.

Events are notifications, not facts: a ``staged`` or ``commit`` moves what the actor knows only for a version
whose manifest its bucket holds (one look, none for versions it knows already), so a forged event with a huge
version cannot make it wait for a version that never comes, nor stop it seeing the real ones."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from aurora_store.bus import ControlPlane
from aurora_store.codec.manifest import SegmentRef
from aurora_store.errors import AuroraError
from aurora_store.follow import Follower
from aurora_store.store import object_names
from workers.actor.relay_watch import RelayWatch
from workers.actor.versions import VersionView

log = logging.getLogger("aurora.actor.events")

#: The bucket is the truth: list it this often even when events arrive.
POLL_S = 2.0


class EventIntake:
    def __init__(self, plane: ControlPlane, watch: RelayWatch, follower: Follower, view: VersionView,
                 stopped: threading.Event) -> None:
        self.plane = plane
        self.watch = watch
        self.follower = follower
        self.view = view
        self.stopped = stopped
        self.dropped: Counter[str] = Counter()  # events not acted on, by reason

    def run(self) -> None:
        cursors = {r: self.plane.latest_event_id(r) for r in self.watch.event_regions()}
        last_poll = 0.0
        while not self.stopped.is_set():
            try:
                regions = self.watch.event_regions()
                for region in regions:
                    cursors.setdefault(region, self.plane.latest_event_id(region))
                events, advanced = self.plane.read_event_batch({r: cursors[r] for r in regions}, block_ms=500)
                cursors.update(advanced)  # past malformed entries too: each is dropped once
                for _, _, event in events:
                    if event.kind == "segment":
                        if event.segment and event.size is not None:
                            self.follower.offer(event.version, SegmentRef(event.segment, event.size, ()))
                        continue
                    if event.kind in ("staged", "commit"):
                        self._version_event(event.kind, event.version)
                if time.monotonic() - last_poll > POLL_S:
                    last_poll = time.monotonic()
                    self._poll()
            except (AuroraError, OSError) as exc:
                log.warning("event loop error", extra={"error": str(exc)})
                self.stopped.wait(0.5)

    def _in_bucket(self, version: int) -> bool:
        """Whether the bucket the actor reads holds ``version`` (a delta or a snapshot manifest)."""
        if version <= self.view.known_latest:
            return True
        bucket = self.follower.chain.store().bucket
        return bucket.exists(object_names.delta(version)) or bucket.exists(object_names.snapshot_manifest(version))

    def _version_event(self, kind: str, version: int) -> None:
        with self.view.changed:
            if (version <= self.view.committed if kind == "commit" else version <= self.view.known_latest):
                return  # nothing new: no look at the bucket
        if not self._in_bucket(version):
            self.dropped[f"{kind}_not_in_bucket"] += 1
            count = self.dropped[f"{kind}_not_in_bucket"]
            if count & (count - 1) == 0:  # 1st, 2nd, 4th, …: a flood logs little
                log.warning("a %s event names a version the bucket does not hold; ignored", kind,
                            extra={"version": version, "count": count})
            return
        with self.view.changed:
            self.view.published(version)
            if kind == "commit":
                self.view.committed = max(self.view.committed, version)
            self.view.changed.notify_all()

    def _poll(self) -> None:
        newer = self.follower.chain.store().versions(after=self.view.known_latest)
        trainer = self.plane.trainer_state()
        with self.view.changed:
            for version in newer:
                self.view.published(version)
            self.view.changed.notify_all()
        if trainer is not None and trainer.committed > self.view.committed:
            self._version_event("commit", trainer.committed)  # a state in Redis is a message like any other
