"""Where an actor reads versions from: its region's bucket (fed by the relay), or — when the region's relay
is gone — the trainer's source bucket, directly. Switching is automatic and reversible."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from aurora_store.bus import ControlPlane
from aurora_store.store import DeltaStore

log = logging.getLogger("aurora.actor.sources")


@dataclass
class VersionSources:
    regional: DeltaStore
    source: DeltaStore | None
    region: str
    home_region: str
    plane: ControlPlane
    actor_id: str = ""

    def __post_init__(self) -> None:
        self._fallback = False
        self._lock = threading.Lock()

    @property
    def is_home(self) -> bool:
        return self.region == self.home_region or self.source is None

    @property
    def fallback(self) -> bool:
        return self._fallback

    def refresh(self) -> bool:
        """Re-evaluate relay health; returns True when the mode changed."""
        if self.is_home:
            return False
        relay_alive = self.plane.relay(self.region) is not None
        with self._lock:
            want = not relay_alive
            if want == self._fallback:
                return False
            self._fallback = want
        log.warning("relay for %s is %s: reading from the %s bucket", self.region,
                    "gone" if want else "back", "source" if want else "regional")
        self.plane.log_event("source_switch", actor=self.actor_id, region=self.region, fallback=int(want))
        return True

    def store(self) -> DeltaStore:
        return self.source if (self._fallback and self.source is not None) else self.regional

    @property
    def label(self) -> str:
        return "source" if self._fallback else "regional"

    def event_regions(self) -> list[str]:
        if self.is_home:
            return [self.home_region]
        return [self.region, self.home_region] if self._fallback else [self.region]
