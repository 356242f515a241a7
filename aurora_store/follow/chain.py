"""The buckets a follower reads versions from: the region's bucket (relay-fed, untrusted) and, as fallback,
the trainer's source bucket. Which one is current is the caller's decision (e.g. its region's relay is gone);
a bad copy in the regional bucket always sends that one read to the source."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from aurora_store.errors import CodecError, IntegrityError, ObjectNotFoundError, VersionNotFoundError
from aurora_store.store.versions import DeltaStore

T = TypeVar("T")

#: What a bad copy of a version in a (relay-written, untrusted) regional bucket can cause: an unparseable,
#: unsigned, mis-signed or foreign-run manifest, corrupt or missing segments, a wrong base or layout. Each
#: sends the read to the source bucket, never out of the follower's caller.
BAD_COPY_ERRORS = (CodecError, IntegrityError, ObjectNotFoundError)

#: Told when a bad copy of ``version`` sent a read to the source bucket: ``(version, error)``.
OnRefetch = Callable[[int, BaseException], None]

log = logging.getLogger("aurora.follow.chain")


class BucketChain:
    """``regional`` first; ``source`` (if any, and a different bucket) when told to or for a bad copy."""

    def __init__(self, regional: DeltaStore, source: DeltaStore | None = None, *,
                 on_refetch: OnRefetch | None = None) -> None:
        if source is not None and source.url == regional.url:  # compared as opened: a path and its file:// URL
            source = None
        self.regional = regional
        self.source = source
        self._on_refetch = on_refetch
        self._use_source = False
        self._lock = threading.Lock()

    @property
    def is_home(self) -> bool:
        """Reading the trainer's own bucket: no fallback exists (only the caller's configuration decides)."""
        return self.source is None

    @property
    def on_source(self) -> bool:
        return self._use_source and self.source is not None

    def use_source(self, flag: bool) -> bool:
        """Read from the source bucket (``True``) or the regional one; returns whether that changed."""
        with self._lock:
            flag = flag and self.source is not None
            changed, self._use_source = flag != self._use_source, flag
        return changed

    def store(self) -> DeltaStore:
        return self.source if self.on_source and self.source is not None else self.regional

    @property
    def label(self) -> str:
        return "source" if self.on_source else "regional"

    def read(self, version: int, fetch: Callable[[DeltaStore], T]) -> T:
        """``fetch(store)`` from the current bucket; if that copy of ``version`` is bad (see
        :data:`BAD_COPY_ERRORS`) and it is not the source bucket, ``fetch(source)`` instead. A version not in
        the bucket yet (:class:`VersionNotFoundError`) is not a bad copy: it raises for the caller to wait."""
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
            if self._on_refetch is not None:
                self._on_refetch(version, exc)
            return fetch(self.source)

    def close(self) -> None:
        self.regional.close()
        if self.source is not None:
            self.source.close()
