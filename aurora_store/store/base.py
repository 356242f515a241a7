"""The bucket interface every backend implements (local directory, memory, S3, GCS)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Capabilities:
    """What a backend guarantees; the conformance suite (:mod:`aurora_store.testing.conformance`) skips the
    tests of guarantees a backend does not declare.

    ``atomic_create``: :meth:`Bucket.create` is a single atomic conditional write (S3 ``If-None-Match: *``,
    GCS ``ifGenerationMatch=0``, ``link(2)`` locally) — never check-then-write. Publishing versions relies on
    it: without it two trainers could both "win" a version.

    ``single_writer``: the operator declared (``?single_writer=true`` in the URL) that exactly one process writes
    this bucket, so a check-then-write :meth:`Bucket.create` is enough. :class:`~aurora_store.store.DeltaStore`
    refuses every create-only write (manifests, layouts, snapshot manifests) on a bucket with neither, raising
    :class:`~aurora_store.errors.CreateOnlyUnsupportedError` before anything is written.
    """

    atomic_create: bool
    single_writer: bool = False

    @property
    def can_publish(self) -> bool:
        """Whether create-only writes (hence publishing) are safe on this bucket."""
        return self.atomic_create or self.single_writer


class Bucket(ABC):
    """A flat namespace of immutable-by-convention objects under one URL.

    Keys are ``/``-separated relative paths. Errors are Aurora's typed :class:`~aurora_store.errors.StoreError`
    subclasses: :class:`ObjectNotFoundError` (also ``FileNotFoundError``), :class:`ObjectExistsError`
    (also ``FileExistsError``), :class:`StoreAuthError`, :class:`BucketNotFoundError`,
    :class:`TransientStoreError`.
    """

    url: str
    capabilities: Capabilities

    @abstractmethod
    def get(self, key: str, limit: int | None = None) -> bytes:
        """The object's bytes; with ``limit``, at most ``limit + 1`` of them (a caller that knows the size
        it expects reads one byte more and so learns the object is too long without downloading all of it)."""

    def read_into(self, key: str, buffer: memoryview, sink: Callable[[memoryview], None] | None = None) -> int:
        """Read the object's first ``len(buffer)`` bytes (at most) into ``buffer`` and return how many there
        were; ``sink`` sees each piece as it lands, in order (to hash while the bytes stream in). A caller that
        knows the size it expects passes a buffer one byte longer (as :meth:`get`'s ``limit``). Backends that
        can stream override it; this default reads with :meth:`get` and copies once."""
        if len(buffer) < 1:
            raise ValueError("read_into needs a buffer of at least one byte")
        data = self.get(key, len(buffer) - 1)
        buffer[: len(data)] = data
        if sink is not None:
            sink(buffer[: len(data)])
        return len(data)

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write (or overwrite) an object atomically: readers see the old bytes or the new, never a mix."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> None:
        """Write an object only if no object exists under ``key``; else raise :class:`ObjectExistsError`."""

    @abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes; :class:`ObjectNotFoundError` if absent."""

    @abstractmethod
    def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        """All keys starting with ``prefix`` (and sorting after ``start_after``, if given), sorted.

        ``start_after`` lets a poller read only what is new (zero-padded version names sort numerically)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; absent objects are not an error (deletes are idempotent)."""

    def modified(self, key: str) -> float | None:
        """When the object was last written (POSIX seconds), or ``None`` if the backend cannot say. Every
        write, including an idempotent re-put of identical bytes, moves it forward: gc uses it to spare a
        segment a publisher has just (re)uploaded. :class:`ObjectNotFoundError` if absent."""
        self.size(key)
        return None

    def exists(self, key: str) -> bool:
        from aurora_store.errors import ObjectNotFoundError

        try:
            self.size(key)
        except ObjectNotFoundError:
            return False
        return True

    def fsspec_url(self) -> tuple[str, dict[str, Any]] | None:
        """This bucket's root as an fsspec URL plus the ``storage_options`` that reach it — what pandas
        (``read_parquet(url, storage_options=…)``), ``fsspec.core.url_to_fs`` (then ``pyarrow.dataset``), DuckDB
        (``register_filesystem``) and Polars take. Credentials are not included: the filesystems read them from
        the same places this backend does. None where no fsspec filesystem reaches the objects (``memory://``)."""
        return None

    def fsspec_filesystem(self) -> tuple[Any, str] | None:
        """The fsspec filesystem of :meth:`fsspec_url` and this bucket's root path in it (what
        ``pyarrow.dataset`` takes); None where :meth:`fsspec_url` is None."""
        found = self.fsspec_url()
        if found is None:
            return None
        import fsspec

        url, options = found
        return fsspec.core.url_to_fs(url, **options)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release connections (no-op by default)."""

    def __enter__(self) -> Bucket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def check_key(key: str) -> str:
    """Reject keys that could escape the bucket root or are ambiguous."""
    from aurora_store.errors import InvalidKeyError

    if not key or key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidKeyError(f"invalid object key {key!r}")
    return key
