"""One consistent read of everything a bucket holds: listings plus every manifest, parsed leniently.

``aurora verify`` and ``aurora gc`` both start here. Reading is lenient on purpose: a manifest that does not
parse becomes a :class:`~aurora_store.ops.problems.Problem` instead of an exception, so one bad object
never hides the state of the rest of the bucket.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aurora_store.codec.manifest import DeltaManifest
from aurora_store.errors import FormatError, ObjectNotFoundError, StoreError
from aurora_store.ops.problems import Problem
from aurora_store.store import object_names, retry
from aurora_store.store.pool import shared_pool
from aurora_store.store.snapshot_manifest import SnapshotManifest
from aurora_store.store.versions import DeltaStore

T = TypeVar("T")
R = TypeVar("R")

_SNAPSHOT_DIR = re.compile(rf"^{object_names.SNAPSHOTS}(\d{{{object_names.VERSION_DIGITS}}})/")
_LAYOUT_KEY = re.compile(rf"^{object_names.LAYOUTS}([0-9a-f]{{64}})\.json$")


@dataclass(frozen=True)
class Inventory:
    """A bucket as listed and parsed at one moment.

    ``listed_deltas`` are the versions with a ``deltas/<v>.json`` object, ``deltas`` those among them that
    parsed and declare their own version. The same split holds for snapshots. ``snapshot_keys`` maps a
    snapshot version to every object under its directory, including directories without a manifest
    (a snapshot being written, or an abandoned one).
    """

    url: str
    listed_deltas: tuple[int, ...]
    deltas: Mapping[int, DeltaManifest]
    manifest_sizes: Mapping[int, int]
    listed_snapshots: tuple[int, ...]
    snapshots: Mapping[int, SnapshotManifest]
    snapshot_keys: Mapping[int, tuple[str, ...]]
    segments: frozenset[str]
    layouts: frozenset[str]
    problems: tuple[Problem, ...]

    @property
    def latest(self) -> int | None:
        """The newest version the bucket claims to reach (delta or snapshot), parsed or not."""
        candidates = self.listed_deltas[-1:] + self.listed_snapshots[-1:]
        return max(candidates) if candidates else None

    @property
    def empty(self) -> bool:
        return not self.listed_deltas and not self.listed_snapshots

    def referenced_layouts(self) -> dict[str, list[int]]:
        """Layout fingerprint → versions (deltas and snapshots) that name it."""
        out: dict[str, list[int]] = {}
        manifests: list[tuple[int, DeltaManifest | SnapshotManifest]] = [*self.deltas.items(),
                                                                       *self.snapshots.items()]
        for version, manifest in manifests:
            out.setdefault(manifest.layout_fingerprint, []).append(version)
        return {fp: sorted(set(vs)) for fp, vs in out.items()}


def parallel_map(store: DeltaStore, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``fn`` over ``items`` on the store's transfer streams (the process's one transfer pool, ``S`` at a time):
    remote buckets are latency-bound, so checking thousands of objects one request at a time would take
    minutes."""
    items = list(items)
    if len(items) <= 1 or store.settings.streams <= 1:
        return [fn(item) for item in items]
    lanes = shared_pool().lanes(store.settings.streams)
    futures = [lanes.submit(fn, item) for item in items]
    return [future.result() for future in futures]


def object_size(store: DeltaStore, key: str) -> int | None:
    """The object's size, or ``None`` when it does not exist."""
    try:
        return retry.call(store.settings, lambda: store.bucket.size(key))
    except ObjectNotFoundError:
        return None


def delete_object(store: DeltaStore, key: str) -> None:
    retry.call(store.settings, lambda: store.bucket.delete(key))


def read_inventory(store: DeltaStore) -> Inventory:
    """List the bucket and parse every delta and snapshot manifest (in parallel)."""
    problems: list[Problem] = []
    listed_deltas = tuple(store.versions())
    snapshot_keys: dict[int, list[str]] = {}
    for key in store.list_objects(object_names.SNAPSHOTS):
        match = _SNAPSHOT_DIR.match(key)
        if match:
            snapshot_keys.setdefault(int(match.group(1)), []).append(key)
    listed_snapshots = tuple(sorted(v for v, ks in snapshot_keys.items() if object_names.snapshot_manifest(v) in ks))
    segments = frozenset(store.segment_digests())
    layouts = frozenset("sha256:" + m.group(1) for k in store.list_objects(object_names.LAYOUTS)
                        if (m := _LAYOUT_KEY.match(k)))

    def read_delta(version: int) -> tuple[int, DeltaManifest | None, int, Problem | None]:
        key = object_names.delta(version)
        try:
            data = store.get_document(key)
        except ObjectNotFoundError:  # deleted since the listing (e.g. a concurrent gc)
            return version, None, 0, None
        except (FormatError, StoreError) as exc:  # oversized, or not a regular file
            return version, None, 0, Problem("manifest_malformed", f"{key} cannot be read: {exc}", version, key)
        try:
            manifest = DeltaManifest.from_bytes(data)
        except FormatError as exc:
            return version, None, len(data), Problem("manifest_malformed", f"{key} does not parse: {exc}",
                                                     version, key)
        if manifest.version != version:
            return version, None, len(data), Problem(
                "manifest_wrong_version", f"{key} declares version {manifest.version}", version, key)
        return version, manifest, len(data), None

    def read_snapshot(version: int) -> tuple[int, SnapshotManifest | None, Problem | None]:
        key = object_names.snapshot_manifest(version)
        try:
            data = store.get_document(key)
        except ObjectNotFoundError:
            return version, None, None
        except (FormatError, StoreError) as exc:
            return version, None, Problem("snapshot_malformed", f"{key} cannot be read: {exc}", version, key)
        try:
            manifest = SnapshotManifest.from_bytes(data)
        except FormatError as exc:
            return version, None, Problem("snapshot_malformed", f"{key} does not parse: {exc}", version, key)
        if manifest.version != version:
            return version, None, Problem("snapshot_wrong_version", f"{key} declares version {manifest.version}",
                                          version, key)
        return version, manifest, None

    deltas: dict[int, DeltaManifest] = {}
    sizes: dict[int, int] = {}
    for version, manifest, size, problem in parallel_map(store, read_delta, listed_deltas):
        sizes[version] = size
        if manifest is not None:
            deltas[version] = manifest
        if problem is not None:
            problems.append(problem)
    snapshots: dict[int, SnapshotManifest] = {}
    for version, snapshot, problem in parallel_map(store, read_snapshot, listed_snapshots):
        if snapshot is not None:
            snapshots[version] = snapshot
        if problem is not None:
            problems.append(problem)
    return Inventory(store.url, listed_deltas, deltas, sizes, listed_snapshots, snapshots,
                     {v: tuple(ks) for v, ks in sorted(snapshot_keys.items())}, segments, layouts, tuple(problems))
