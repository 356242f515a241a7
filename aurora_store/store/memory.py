"""An in-process bucket (``memory://NAME``), shared by every opener of the same name in one process."""

from __future__ import annotations

import threading
import time

from aurora_store.config import TransferSettings
from aurora_store.errors import BucketNotFoundError, ObjectExistsError, ObjectNotFoundError
from aurora_store.store.base import Bucket, Capabilities, check_key
from aurora_store.store.registry import BucketURL

_REGISTRY: dict[str, dict[str, bytes]] = {}
_REGISTRY_LOCK = threading.Lock()
_MODIFIED: dict[tuple[str, str], float] = {}  # (bucket URL, key) → time of the last write


def from_url(url: BucketURL, *, create: bool, settings: TransferSettings | None) -> MemoryBucket:
    """``memory://NAME`` (``memory://`` alone is the bucket ``default``); options are ignored."""
    return MemoryBucket((url.netloc + url.path).strip("/") or "default", create=create)


class MemoryBucket(Bucket):
    capabilities = Capabilities(atomic_create=True)

    def __init__(self, name: str, *, create: bool = False) -> None:
        self.url = f"memory://{name}"
        with _REGISTRY_LOCK:
            if name not in _REGISTRY:
                if not create:
                    raise BucketNotFoundError(f"memory bucket {name!r} does not exist")
                _REGISTRY[name] = {}
            self._objects = _REGISTRY[name]
        # One lock per bucket: create-only writes are check-and-set under it, hence atomic.
        self._lock = _LOCKS.setdefault(name, threading.Lock())

    def get(self, key: str, limit: int | None = None) -> bytes:
        try:
            data = self._objects[check_key(key)]
            return data if limit is None else data[: limit + 1]
        except KeyError:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from None

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self._objects[check_key(key)] = bytes(data)
            _MODIFIED[(self.url, key)] = time.time()

    def create(self, key: str, data: bytes) -> None:
        with self._lock:
            if check_key(key) in self._objects:
                raise ObjectExistsError(f"{self.url}/{key} already exists")
            self._objects[key] = bytes(data)
            _MODIFIED[(self.url, key)] = time.time()

    def size(self, key: str) -> int:
        return len(self.get(key))

    def modified(self, key: str) -> float | None:
        self.get(key)
        return _MODIFIED.get((self.url, key))

    def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        with self._lock:
            return sorted(k for k in self._objects if k.startswith(prefix) and k > start_after)

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(check_key(key), None)


_LOCKS: dict[str, threading.Lock] = {}
