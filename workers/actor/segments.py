"""Where an actor reads one segment from: its relay's hot cache first (cut-through, before the regional write
completes), then its bucket. Every byte is checked against the segment's SHA-256 whatever served it: a
cache that answers wrong bytes, slowly or not at all only costs the bucket read."""

from __future__ import annotations

import hashlib
import http.client
import logging
from urllib.parse import urlsplit

from aurora_store.codec.manifest import SegmentRef
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore

log = logging.getLogger("aurora.actor.segments")


class RelayCache:
    """Client of a relay's ``/segments/<sha256>`` endpoint (see :mod:`workers.relay.serve`)."""

    def __init__(self, url: str, token: str, metrics: Metrics, timeout_s: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a cache URL: {url!r}")
        self.url = url
        self.host, self.port = parts.hostname, parts.port or 80
        self._auth = f"Bearer {token}"
        self.metrics = metrics
        self.timeout_s = timeout_s

    def get(self, ref: SegmentRef) -> bytes | None:
        """The segment's bytes when the cache has them right; ``None`` on a miss, an error, a timeout or bytes
        that do not hash to the name (each counted by outcome)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("GET", f"/segments/{ref.digest}", headers={"Authorization": self._auth})
            response = conn.getresponse()
            if response.status == 404:
                self.metrics.relay_cache_reads.labels("miss").inc()
                return None
            if response.status != 200:
                self.metrics.relay_cache_reads.labels("error").inc()
                log.debug("relay cache answered %d", response.status)
                return None
            data = response.read(ref.size + 1)  # a longer answer is wrong: read one byte more to tell
        except (OSError, http.client.HTTPException) as exc:
            self.metrics.relay_cache_reads.labels("error").inc()
            log.debug("relay cache unreachable", extra={"error": str(exc)})
            return None
        finally:
            conn.close()
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
            self.metrics.relay_cache_reads.labels("corrupt").inc()
            log.warning("relay cache served bytes that do not match segment %s…; reading the bucket",
                        ref.digest[:12], extra={"url": self.url})
            return None
        self.metrics.relay_cache_reads.labels("hit").inc()
        return data


def read_segment(ref: SegmentRef, store: DeltaStore, cache: RelayCache | None) -> tuple[bytes, str]:
    """``ref``'s bytes, verified, and what served them (``relay_cache`` or ``bucket``): the cache first, the
    bucket on a miss, an error, a timeout or wrong bytes. The bucket's own failures raise (its caller falls
    back to the source bucket)."""
    data = cache.get(ref) if cache is not None else None
    if data is not None:
        return data, "relay_cache"
    return store.get_segment(ref), "bucket"
