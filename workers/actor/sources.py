"""Where an actor reads versions from: its region's bucket (fed by the relay), or — when the region's relay
is gone — the trainer's source bucket, directly. Switching is automatic and reversible."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from aurora_store.bus import ControlPlane
from aurora_store.errors import CodecError, IntegrityError, ObjectNotFoundError, VersionNotFoundError
from aurora_store.store import DeltaStore

T = TypeVar("T")

#: What a bad copy of a version in a (relay-written, untrusted) regional bucket can cause: an unparseable,
#: unsigned, mis-signed or foreign-run manifest, corrupt or missing segments, a wrong base or layout. Each
#: sends the actor to the source bucket of its own configuration, never out of its loops.
BAD_COPY_ERRORS = (CodecError, IntegrityError, ObjectNotFoundError)

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
        self._cache_url: str | None = None  # the live relay's segment cache, as its heartbeat advertises it

    @property
    def is_home(self) -> bool:
        # Only this actor's own configuration decides: the run record naming a home region is unsigned.
        return self.source is None

    @property
    def fallback(self) -> bool:
        return self._fallback

    def refresh(self) -> bool:
        """Re-evaluate relay health; returns True when the mode changed."""
        if self.is_home:
            return False
        relay = self.plane.relay(self.region)
        relay_alive = relay is not None
        self._cache_url = relay.cache_url if relay is not None else None
        with self._lock:
            want = not relay_alive
            if want == self._fallback:
                return False
            self._fallback = want
        log.warning("relay for %s is %s: reading from the %s bucket", self.region,
                    "gone" if want else "back", "source" if want else "regional")
        self.plane.log_event("source_switch", actor=self.actor_id, region=self.region, fallback=int(want))
        return True

    def wait_for_relay(self, timeout_s: float) -> bool:
        """At start, give the region's relay as long as one heartbeat TTL to be seen, so that actors started
        together with their relay do not begin on the source bucket (and switch back seconds later). Returns
        whether a relay was seen; after the timeout :meth:`refresh` falls back as usual."""
        if self.is_home:
            return True
        deadline = time.monotonic() + timeout_s
        while (relay := self.plane.relay(self.region)) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        self._cache_url = relay.cache_url
        return True

    def store(self) -> DeltaStore:
        return self.source if (self._fallback and self.source is not None) else self.regional

    def read(self, version: int, fetch: Callable[[DeltaStore], T]) -> T:
        """``fetch(store)`` from the current bucket; if that copy of ``version`` is bad (see
        :data:`BAD_COPY_ERRORS`) and it is not the source bucket, log it and ``fetch(source)`` instead.
        A version not yet in the bucket (:class:`VersionNotFoundError`) is not a bad copy: the caller waits."""
        store = self.store()
        try:
            return fetch(store)
        except VersionNotFoundError:
            raise
        except BAD_COPY_ERRORS as exc:
            if self.source is None or self.source is store:
                raise
            log.warning("bad copy of version %d in %s (%s); reading the source bucket", version, store.url,
                        type(exc).__name__, extra={"error": str(exc)[:500]})
            self.plane.log_event("refetch_source", actor=self.actor_id, version=version, error=type(exc).__name__)
            return fetch(self.source)

    @property
    def cache_url(self) -> str | None:
        """The region's relay cache, while the relay is alive and this actor reads its region's bucket."""
        return None if self.is_home or self._fallback else self._cache_url

    @property
    def label(self) -> str:
        return "source" if self._fallback else "regional"

    def event_regions(self) -> list[str]:
        if self.is_home:
            return [self.home_region]
        return [self.region, self.home_region] if self._fallback else [self.region]
