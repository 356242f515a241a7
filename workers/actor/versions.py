"""What an actor knows of the run's versions, shared by its threads under one condition variable: the newest
published and committed versions it has heard of, the version being staged and the one staged and waiting."""

from __future__ import annotations

import threading
import time

from aurora_store.codec import Staged


class VersionView:
    def __init__(self) -> None:
        self.changed = threading.Condition()  # notified on every change below
        self.known_latest = -1  # newest version the actor knows is published
        self.committed = -1  # newest version the trainer committed (actors may activate it)
        self.staged: Staged | None = None  # staged, waiting for a batch boundary
        self.staging: int | None = None  # being fetched / decoded now
        self._manifest_seen: dict[int, float] = {}  # version → when the actor learned its manifest exists

    def published(self, version: int) -> None:
        """``version``'s manifest exists (a ``staged`` event, a listing, or a lease on it). Under the lock."""
        self._manifest_seen.setdefault(version, time.monotonic())
        self.known_latest = max(self.known_latest, version)

    def seconds_since_manifest(self, version: int) -> float | None:
        """How long ago the actor learned of ``version``'s manifest (forgetting it and every older one)."""
        with self.changed:
            seen = self._manifest_seen.pop(version, None)
            for old in [v for v in self._manifest_seen if v < version]:
                self._manifest_seen.pop(old, None)
        return time.monotonic() - seen if seen is not None else None
