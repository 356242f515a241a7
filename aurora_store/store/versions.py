"""The versioned delta store over a bucket: segments, manifests, layouts and the run record.

Invariants kept here:
* segments are content-addressed — the name is the SHA-256 of the bytes, so rewriting is harmless and a
  reader verifies what it got;
* a manifest is written create-only and only after all its segments are durable, so a listed version is
  always complete; two writers racing for one version: exactly one wins, the other gets
  :class:`VersionExistsError`; a retried create that finds its own earlier write succeeds;
* the listing is the truth for "which versions exist".
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from aurora_store.codec import jsondoc
from aurora_store.codec.document import canonical_json
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.config import TransferSettings
from aurora_store.errors import (
    CreateOnlyUnsupportedError,
    IntegrityError,
    LayoutError,
    ManifestError,
    ObjectExistsError,
    ObjectNotFoundError,
    VersionExistsError,
    VersionNotFoundError,
)
from aurora_store.store import object_names, retry
from aurora_store.store.base import Bucket
from aurora_store.store.url import open_bucket

if TYPE_CHECKING:  # torch-free at import: relays and the CLI read stores without the codec's tensors
    from aurora_store.codec.layout import ModelLayout


class DeltaStore:
    """Typed access to one bucket's versions. Thread-safe (used from parallel transfer streams)."""

    def __init__(self, bucket: Bucket | str, settings: TransferSettings | None = None, *,
                 create: bool = False, manifest_cache: int = 256) -> None:
        self.settings = settings or TransferSettings()
        self.bucket = open_bucket(bucket, create=create, settings=self.settings) if isinstance(bucket, str) else bucket
        self._manifests: OrderedDict[int, DeltaManifest] = OrderedDict()
        self._cache_size = manifest_cache
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.bucket.url

    def _call(self, fn):
        return retry.call(self.settings, fn)

    # --- raw objects (with semantic retries) -----------------------------------------------------

    def get_object(self, key: str, limit: int | None = None) -> bytes:
        """The object's bytes; with ``limit``, at most ``limit + 1`` of them (see :meth:`Bucket.get`)."""
        return self._call(lambda: self.bucket.get(key, limit))

    def read_hashed(self, key: str, buffer: memoryview) -> tuple[int, str]:
        """:meth:`Bucket.read_into` with semantic retries, hashing while the bytes stream in: how many bytes
        landed in ``buffer`` and their SHA-256 (hex). A retried read starts again with a fresh hash."""
        def attempt() -> tuple[int, str]:
            hasher = hashlib.sha256()
            count = self.bucket.read_into(key, buffer, hasher.update)
            return count, hasher.hexdigest()

        return self._call(attempt)

    def get_document(self, key: str) -> bytes:
        """A JSON document's bytes, refused once longer than the parse gate accepts (never read further)."""
        data = self._call(lambda: self.bucket.get(key, jsondoc.MAX_DOCUMENT_BYTES))
        if len(data) > jsondoc.MAX_DOCUMENT_BYTES:
            raise ManifestError(f"{self.url}/{key} is larger than the {jsondoc.MAX_DOCUMENT_BYTES} bytes a "
                                f"document may have")
        return data

    def put_object(self, key: str, data: bytes) -> None:
        self._call(lambda: self.bucket.put(key, data))

    def list_objects(self, prefix: str, start_after: str = "") -> list[str]:
        return self._call(lambda: self.bucket.list(prefix, start_after))

    def create_object(self, key: str, data: bytes, *, error: type[ObjectExistsError] = ObjectExistsError,
                      message: str | None = None) -> None:
        """Create-only write. If the object exists with identical bytes (e.g. our own earlier attempt whose
        response was lost) this succeeds; otherwise ``error`` is raised. A bucket that can neither create
        atomically nor was declared single-writer is refused before anything is written."""
        capabilities = self.bucket.capabilities
        if not capabilities.can_publish:
            raise CreateOnlyUnsupportedError(
                f"{self.url} has no atomic create-only write ({type(self.bucket).__name__}), so two writers could "
                f"both publish {key}; use a backend that has one (s3, gs, az, file) or, if exactly one process "
                f"writes this bucket, add single_writer=true to its URL")
        try:
            self._call(lambda: self.bucket.create(key, data))
        except ObjectExistsError:
            existing = self._call(lambda: self.bucket.get(key))
            if hashlib.sha256(existing).digest() != hashlib.sha256(data).digest():
                raise error(message or f"{self.url}/{key} already exists with different content") from None

    # --- segments --------------------------------------------------------------------------------

    def has_segment(self, digest: str) -> bool:
        return self._call(lambda: self.bucket.exists(object_names.segment(digest)))

    def put_segment(self, ref: SegmentRef, data: bytes) -> None:
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
            raise IntegrityError(f"refusing to store segment bytes that do not hash to {ref.digest[:12]}…")
        self._call(lambda: self.bucket.put(object_names.segment(ref.digest), data))

    def get_segment(self, ref: SegmentRef) -> bytes:
        """Fetch and verify a segment; a mismatch is re-fetched, and raises :class:`IntegrityError` if it
        persists (e.g. a corrupted object)."""

        def fetch_verified() -> bytes:
            # At most size + 1 bytes: a huge object in a segment's place is refused after reading one byte more.
            data = self._call(lambda: self.bucket.get(object_names.segment(ref.digest), ref.size))
            if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
                held = f"more than {ref.size}" if len(data) > ref.size else str(len(data))
                raise IntegrityError(f"segment {ref.digest[:12]}… in {self.url} does not match its digest "
                                     f"({held} bytes, expected {ref.size})")
            return data

        attempts = retry.retrying(TransferSettings(retries=1, retry_wait_s=self.settings.retry_wait_s),
                                  exceptions=(IntegrityError,))
        for attempt in attempts:
            with attempt:
                return fetch_verified()
        raise AssertionError("unreachable")  # pragma: no cover

    def segment_digests(self) -> list[str]:
        listed = self._call(lambda: self.bucket.list(object_names.SEGMENTS))
        return [d for d in (object_names.segment_digest(k) for k in listed) if d]

    # --- manifests -------------------------------------------------------------------------------

    def publish_manifest(self, manifest: DeltaManifest | bytes) -> DeltaManifest:
        """Create ``deltas/<version>.json``. Idempotent for identical bytes; :class:`VersionExistsError` if a
        different manifest already holds the version."""
        data = manifest.to_bytes() if isinstance(manifest, DeltaManifest) else bytes(manifest)
        parsed = manifest if isinstance(manifest, DeltaManifest) else DeltaManifest.from_bytes(data)
        self.create_object(object_names.delta(parsed.version), data, error=VersionExistsError,
                           message=f"version {parsed.version} was already published in {self.url} by another writer")
        self._remember(parsed)
        return parsed

    def manifest_bytes(self, version: int) -> bytes:
        try:
            return self.get_document(object_names.delta(version))
        except ObjectNotFoundError:
            raise VersionNotFoundError(f"version {version} is not published in {self.url}") from None

    def manifest(self, version: int) -> DeltaManifest:
        with self._lock:
            cached = self._manifests.get(version)
            if cached is not None:
                self._manifests.move_to_end(version)
                return cached
        parsed = DeltaManifest.from_bytes(self.manifest_bytes(version))
        if parsed.version != version:
            raise ManifestError(f"{object_names.delta(version)} in {self.url} holds a manifest for version "
                                f"{parsed.version}")
        self._remember(parsed)
        return parsed

    def _remember(self, manifest: DeltaManifest) -> None:
        with self._lock:
            self._manifests[manifest.version] = manifest
            while len(self._manifests) > self._cache_size:
                self._manifests.popitem(last=False)

    def versions(self, after: int | None = None) -> list[int]:
        """Published delta versions (``> after`` if given), ascending — from the listing, which is the truth."""
        start = object_names.delta(after) if after is not None and after >= 0 else ""
        found = (object_names.delta_version(k) for k in self.list_objects(object_names.DELTAS, start))
        return sorted(v for v in found if v is not None)

    def snapshot_versions(self) -> list[int]:
        found = (object_names.snapshot_version(k) for k in self._call(lambda: self.bucket.list(object_names.SNAPSHOTS)))
        return sorted(v for v in found if v is not None)

    def latest_version(self) -> int | None:
        """The newest version reachable from this bucket (delta or snapshot)."""
        candidates = self.versions()[-1:] + self.snapshot_versions()[-1:]
        return max(candidates) if candidates else None

    def delta_bytes(self, version: int) -> int:
        """Bytes a reader downloads to replay ``version``: its segments plus its manifest."""
        manifest = self.manifest(version)
        return manifest.segment_bytes + len(manifest.to_bytes())

    # --- layouts ---------------------------------------------------------------------------------

    def put_layout(self, layout: ModelLayout) -> None:
        data = canonical_json(layout.to_json())
        self.create_object(object_names.layout(layout.fingerprint), data)

    def layout(self, fingerprint: str) -> ModelLayout:
        try:
            data = self.get_document(object_names.layout(fingerprint))
        except ObjectNotFoundError:
            raise LayoutError(f"layout {fingerprint} is not stored in {self.url}") from None
        try:
            doc = jsondoc.load_object(data, what=f"layout {fingerprint[:80]}", error=LayoutError)
            from aurora_store.codec.layout import ModelLayout

            layout = ModelLayout.from_json(doc)
        except ValueError as exc:
            raise LayoutError(f"layout {fingerprint} in {self.url} is malformed: {exc}") from exc
        if layout.fingerprint != fingerprint:
            raise LayoutError(f"layout document {object_names.layout(fingerprint)} hashes to {layout.fingerprint}")
        return layout

    # --- run record --------------------------------------------------------------------

    def put_run_info(self, info: dict[str, Any]) -> None:
        self._call(lambda: self.bucket.put(object_names.RUN_INFO, canonical_json(info)))

    def run_info(self) -> dict[str, Any] | None:
        """The run record (advisory, unsigned: never a source of keys or of where to fetch from)."""
        try:
            data = self.get_document(object_names.RUN_INFO)
        except ObjectNotFoundError:
            return None
        return jsondoc.load_object(data, what=f"{self.url}/{object_names.RUN_INFO}")

    def missing_segments(self, refs: Iterable[SegmentRef]) -> list[SegmentRef]:
        present = set(self.segment_digests())
        return [r for r in refs if r.digest not in present]

    def close(self) -> None:
        self.bucket.close()
