"""The client of a relay's hot cache: a :class:`~aurora_store.follow.sources.SegmentSource` serving segments
before the regional write completes (cut-through). Every byte is checked against the segment's SHA-256: a
cache that answers wrong bytes, slowly or not at all only costs the bucket read."""

from __future__ import annotations

import hashlib
import http.client
import logging
from urllib.parse import urlsplit

from aurora_store.codec.manifest import SegmentRef
from aurora_store.metrics import Metrics

log = logging.getLogger("aurora.follow.cache")


class RelayCache:
    """Client of a relay's ``/segments/<sha256>`` endpoint (served by the relay process)."""

    label = "relay_cache"

    def __init__(self, url: str, token: str, metrics: Metrics, timeout_s: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a cache URL: {url!r}")
        self.url = url
        self.host, self.port = parts.hostname, parts.port or 80
        self.token = token  # handed on to an engine's workers that read this cache themselves
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
