"""A hostile notifier for the chaos suite: it holds a relay's Redis credentials (as a compromised relay host
would: the role that may write version events) and floods the home and a remote region's event streams with
everything a forger can send —

* malformed events: segment names that are paths, negative and absurd sizes, unknown kinds, megabyte fields;
* ``commit`` and ``staged`` for a version far ahead that no bucket holds;
* ``segment`` events naming segments that do not exist, for the next versions;
* the run's real segments (read from the bucket's listing) re-announced for versions that never come.

It runs as a thread beside the cluster's real processes and counts what it sent."""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import Counter

from aurora_store.bus import ControlPlane, VersionEvent
from aurora_store.bus.messages import MAX_VERSION
from aurora_store.errors import AuroraError
from aurora_store.store import DeltaStore, object_names

#: Versions ahead of the trainer's that forged segment events name (inside the relay's and actors' windows).
AHEAD = 2


class HostileNotifier(threading.Thread):
    def __init__(self, url: str, run: str, regions: list[str], source: DeltaStore, *, period_s: float = 0.2) -> None:
        super().__init__(daemon=True, name="hostile-notifier")
        self.plane = ControlPlane(url, run)
        self.regions = regions
        self.source = source
        self.period_s = period_s
        self.sent: Counter[str] = Counter()
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self._names = (hashlib.sha256(b"forged %d" % i).hexdigest() for i in itertools.count())

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                for region in self.regions:
                    self._flood(region)
                self.stopped.wait(self.period_s)
        except AuroraError as exc:  # reported by the scenario
            self.error = exc

    def _flood(self, region: str) -> None:
        trainer = self.plane.trainer_state()
        version = trainer.version if trainer is not None else 0
        stream = self.plane.keys.events(region)
        raw = [{"kind": "segment", "version": str(version + 1), "region": region, "segment": "../../run.json",
                "size": "13"},
               {"kind": "segment", "version": str(version + 1), "region": region, "segment": "a" * 64, "size": "-7"},
               {"kind": "launch", "version": str(version + 1), "region": region},
               {"kind": "staged", "version": str(version + 1), "region": "x" * 100_000}]
        self.plane.call(lambda r: [r.xadd(stream, fields) for fields in raw])  # type: ignore[arg-type]
        self.sent["malformed"] += len(raw)
        for kind in ("commit", "staged"):
            self.plane.announce(VersionEvent(kind, MAX_VERSION - version, region))
            self.sent[f"{kind}_far_ahead"] += 1
        for _ in range(20):
            self.plane.announce(VersionEvent("segment", version + AHEAD, region, segment=next(self._names), size=4096))
            self.sent["segment_unknown"] += 1
        for digest in self.source.segment_digests()[:10]:  # real bytes, for a version that never comes
            size = self.source.bucket.size(object_names.segment(digest))
            if size:
                self.plane.announce(VersionEvent("segment", version + AHEAD, region, segment=digest, size=size))
                self.sent["segment_replayed"] += 1

    def leave(self) -> None:
        self.stopped.set()
        self.join(timeout=10)
        self.plane.close()
