"""The actor's event intake: ``staged`` / ``commit`` / ``segment`` events of the streams that announce its
bucket's versions, and — since notifications may be lost — a look at the bucket's listing every few seconds.
Segments of a newer version are offered to the follower's prefetcher as they are announced."""

from __future__ import annotations

import logging
import threading
import time

from aurora_store.bus import ControlPlane
from aurora_store.codec.manifest import SegmentRef
from aurora_store.errors import AuroraError
from aurora_store.follow import Follower
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

    def run(self) -> None:
        cursors = {r: self.plane.latest_event_id(r) for r in self.watch.event_regions()}
        last_poll = 0.0
        while not self.stopped.is_set():
            try:
                regions = self.watch.event_regions()
                for region in regions:
                    cursors.setdefault(region, self.plane.latest_event_id(region))
                for region, entry_id, event in self.plane.read_events({r: cursors[r] for r in regions},
                                                                      block_ms=500):
                    cursors[region] = entry_id
                    if event.kind == "segment":
                        if event.segment and event.size is not None:
                            self.follower.offer(event.version, SegmentRef(event.segment, event.size, ()))
                        continue
                    with self.view.changed:
                        if event.kind == "staged":
                            self.view.published(event.version)
                        elif event.kind == "commit":
                            self.view.committed = max(self.view.committed, event.version)
                        self.view.changed.notify_all()
                if time.monotonic() - last_poll > POLL_S:
                    last_poll = time.monotonic()
                    self._poll()
            except (AuroraError, OSError) as exc:
                log.warning("event loop error", extra={"error": str(exc)})
                self.stopped.wait(0.5)

    def _poll(self) -> None:
        newer = self.follower.chain.store().versions(after=self.view.known_latest)
        trainer = self.plane.trainer_state()
        with self.view.changed:
            for version in newer:
                self.view.published(version)
            if trainer is not None:
                self.view.committed = max(self.view.committed, trainer.committed)
            self.view.changed.notify_all()
