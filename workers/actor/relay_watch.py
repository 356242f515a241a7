"""Whether the actor's region still has a relay: while its heartbeat is live the actor reads the regional bucket
(and the relay's hot cache it advertises); once it is gone, the trainer's source bucket directly. Switching is
automatic and reversible; only the actor's own configuration (a source bucket or not) decides whether a
fallback exists — the run record naming a home region is unsigned."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from aurora_store.bus import ControlPlane
from aurora_store.follow import BucketChain, RelayCache, SegmentSource
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore

log = logging.getLogger("aurora.actor.relay")


class RelayWatch:
    def __init__(self, plane: ControlPlane, chain: BucketChain, region: str, home_region: str, actor_id: str, *,
                 cache_token: str | None, cache_timeout_s: float, metrics: Metrics) -> None:
        self.plane = plane
        self.chain = chain
        self.region = region
        self.home_region = home_region
        self.actor_id = actor_id
        self._token = cache_token
        self._timeout_s = cache_timeout_s
        self._metrics = metrics
        self._cache_url: str | None = None  # the live relay's segment cache, as its heartbeat advertises it
        self._cache: RelayCache | None = None

    def wait_for_relay(self, timeout_s: float) -> bool:
        """At start, give the region's relay as long as one heartbeat TTL to be seen, so that actors started
        together with their relay do not begin on the source bucket (and switch back seconds later)."""
        if self.chain.is_home:
            return True
        deadline = time.monotonic() + timeout_s
        while (relay := self.plane.relay(self.region)) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        self._cache_url = relay.cache_url
        return True

    def refresh(self) -> bool:
        """Re-evaluate relay health; returns True when the bucket read from changed."""
        if self.chain.is_home:
            return False
        relay = self.plane.relay(self.region)
        self._cache_url = relay.cache_url if relay is not None else None
        gone = relay is None
        if not self.chain.use_source(gone):
            return False
        log.warning("relay for %s is %s: reading from the %s bucket", self.region,
                    "gone" if gone else "back", "source" if gone else "regional")
        self.plane.log_event("source_switch", actor=self.actor_id, region=self.region, fallback=int(gone))
        return True

    def event_regions(self) -> list[str]:
        """The event streams that announce what the actor's current bucket will hold."""
        if self.chain.is_home:
            return [self.home_region]
        return [self.region, self.home_region] if self.chain.on_source else [self.region]

    def sources_for(self, store: DeltaStore) -> Sequence[SegmentSource]:
        """The relay's cache, for reads from the regional bucket while the relay is alive (never for the
        source bucket: the cache serves only what its relay copied into this region)."""
        url = None if self.chain.is_home or self.chain.on_source or store is self.chain.source else self._cache_url
        if url is None or not self._token:
            return ()
        cache = self._cache
        if cache is None or cache.url != url:
            try:
                cache = self._cache = RelayCache(url, self._token, self._metrics, self._timeout_s)
            except ValueError:
                log.warning("ignoring the relay's unusable cache URL", extra={"url": url[:200]})
                return ()
        return (cache,)
