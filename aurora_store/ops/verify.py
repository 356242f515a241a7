"""``aurora verify``: is every published version complete, intact and on one unbroken chain?

A bucket is healthy when a reader that lists a manifest can fetch and apply it: every segment the
manifest names exists with the right size (and, with ``deep``, the right bytes), each delta ``v`` is based
on ``v-1`` with the digest ``v-1`` ended on, every snapshot agrees with the chain, and every layout that is
named is stored. The check never stops at the first defect: it returns one :class:`VerifyReport` listing
all of them, which ``aurora gc`` also uses to refuse to delete from a bucket whose kept chain is broken.

Signatures are not checked here yet; ``verify_manifest`` is the hook for that (the same callable the relay
and actors take): it is called on every delta and snapshot manifest and a raised error becomes a
``manifest_rejected`` problem.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from aurora_store.codec.decoder import decode_segment
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.errors import (
    AuroraError,
    FormatError,
    LayoutError,
    ObjectNotFoundError,
    StoreError,
    VersionNotFoundError,
)
from aurora_store.ops.inventory import Inventory, object_size, parallel_map, read_inventory
from aurora_store.ops.problems import CODES, Problem
from aurora_store.ops.reproduce import replay_between_snapshots
from aurora_store.store import object_names
from aurora_store.store.snapshot_manifest import SnapshotFile, SnapshotManifest
from aurora_store.store.versions import DeltaStore

ManifestHook = Callable[[DeltaManifest | SnapshotManifest], None]


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of one check: ``problems`` in a stable order (by version, then code) and ``checked``,
    counts of what was looked at (so "no problems" can be told apart from "nothing checked")."""

    url: str
    deep: bool
    problems: tuple[Problem, ...]
    checked: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "bucket": self.url, "deep": self.deep,
                "problems": [p.to_json() for p in self.problems], "checked": dict(self.checked)}


def verify_bucket(store: DeltaStore | str, *, deep: bool = False,
                  verify_manifest: ManifestHook | None = None) -> VerifyReport:
    """Check a whole bucket; see the module docstring for what is checked.

    Without ``deep`` only listings, manifests and object sizes are read (cheap even for a large bucket);
    ``deep`` downloads and re-hashes every segment and snapshot file, decodes every segment, and replays
    the chain from each snapshot to the next (and on to the latest version), comparing the replayed
    weights with each snapshot's digest. Raises :class:`VersionNotFoundError` for a bucket that holds no
    version at all (usually a mistyped URL), and store errors (missing bucket, credentials) as they come.
    """
    store = DeltaStore(store) if isinstance(store, str) else store
    inventory = read_inventory(store)
    if inventory.empty:
        raise VersionNotFoundError(f"{store.url} holds no delta or snapshot manifests: is the URL right?")
    return check_inventory(store, inventory, deep=deep, verify_manifest=verify_manifest)


def check_inventory(store: DeltaStore, inventory: Inventory, *, deep: bool = False,
                    verify_manifest: ManifestHook | None = None) -> VerifyReport:
    """:func:`verify_bucket` on an inventory already read (``aurora gc`` checks and plans on one read)."""
    return _Verifier(store, inventory, deep, verify_manifest).run()


class _Verifier:
    def __init__(self, store: DeltaStore, inventory: Inventory, deep: bool, hook: ManifestHook | None) -> None:
        self.store = store
        self.inv = inventory
        self.deep = deep
        self.hook = hook
        self.problems: list[Problem] = list(inventory.problems)
        self.checked: dict[str, int] = {"deltas": len(inventory.listed_deltas),
                                        "snapshots": len(inventory.listed_snapshots)}
        self.layouts: dict[str, ModelLayout] = {}

    def run(self) -> VerifyReport:
        self.check_hook()
        self.check_layouts()
        self.check_segments()
        self.check_chain()
        self.check_snapshots()
        if self.deep:
            replayed, reproduced = replay_between_snapshots(self.store, self.inv, self.layouts, self.problems)
            self.checked["replayed_versions"] = replayed
            self.checked["snapshots_reproduced"] = reproduced
        order = {code: i for i, code in enumerate(CODES)}
        problems = sorted(self.problems, key=lambda p: (p.version if p.version is not None else -1,
                                                        order.get(p.code, 0), p.key or ""))
        return VerifyReport(self.store.url, self.deep, tuple(problems), MappingProxyType(dict(self.checked)))

    def add(self, code: str, message: str, version: int | None = None, key: str | None = None) -> None:
        self.problems.append(Problem(code, message, version, key))

    # --- manifests and layouts -------------------------------------------------------------------

    def check_hook(self) -> None:
        if self.hook is None:
            return
        manifests: list[tuple[int, DeltaManifest | SnapshotManifest]] = [*self.inv.deltas.items(),
                                                                       *self.inv.snapshots.items()]
        for version, manifest in manifests:
            kind = "delta" if isinstance(manifest, DeltaManifest) else "snapshot"
            try:
                self.hook(manifest)
            except (AuroraError, ValueError) as exc:
                self.add("manifest_rejected", f"{kind} manifest rejected: {exc}", version)

    def check_layouts(self) -> None:
        referenced = self.inv.referenced_layouts()
        self.checked["layouts"] = len(referenced)
        for fingerprint, versions in sorted(referenced.items()):
            try:
                self.layouts[fingerprint] = self.store.layout(fingerprint)
            except (LayoutError, FormatError, StoreError) as exc:  # one bad layout is one problem, never fatal
                code = "layout_invalid" if fingerprint in self.inv.layouts else "layout_missing"
                detail = str(exc) if code == "layout_invalid" else f"layout {fingerprint} is not stored"
                self.add(code, f"{detail} (named by version(s) {_span(versions)})", versions[0], fingerprint)
        for version, manifest in sorted(self.inv.deltas.items()):
            layout = self.layouts.get(manifest.layout_fingerprint)
            if layout is not None:
                self._check_against_layout(version, manifest, layout)

    def _check_against_layout(self, version: int, manifest: DeltaManifest, layout: ModelLayout) -> None:
        if manifest.elements != layout.numel:
            self.add("manifest_layout_mismatch", f"manifest covers {manifest.elements} elements, its layout has "
                                                 f"{layout.numel}", version)
        for seg in manifest.segments:
            for chunk in seg.chunks:
                if chunk.tensor not in layout or chunk.hi > layout[chunk.tensor].numel:
                    self.add("manifest_layout_mismatch", f"segment {seg.digest} chunk {chunk.tensor} "
                                                         f"[{chunk.lo}, {chunk.hi}) is outside the layout",
                             version, seg.digest)
                    return

    # --- segments --------------------------------------------------------------------------------

    def check_segments(self) -> None:
        users: dict[str, list[tuple[int, SegmentRef]]] = {}
        for version, manifest in sorted(self.inv.deltas.items()):
            for ref in manifest.segments:
                users.setdefault(ref.digest, []).append((version, ref))
        self.checked["segments"] = len(users)
        self.checked["segment_bytes"] = sum(refs[0][1].size for refs in users.values())
        self.checked["unreferenced_segments"] = len(self.inv.segments - users.keys())
        results = parallel_map(self.store, lambda item: self._check_segment(*item), users.items())
        self.checked["hashed_bytes"] = sum(hashed for hashed, _ in results)
        for _, found in results:
            self.problems.extend(found)

    def _check_segment(self, digest: str, uses: list[tuple[int, SegmentRef]]) -> tuple[int, list[Problem]]:
        key = object_names.segment(digest)
        first_version, ref = uses[0]
        if digest not in self.inv.segments:
            return 0, [Problem("segment_missing", f"segment {digest} ({ref.size} bytes) is not in the bucket",
                               v, digest) for v, _ in uses]
        size = object_size(self.store, key)
        if size is None:
            return 0, [Problem("segment_missing", f"segment {digest} disappeared while checking", v, digest)
                       for v, _ in uses]
        if size != ref.size:
            return 0, [Problem("segment_size", f"segment {digest} holds {size} bytes, manifest says {ref.size}",
                               v, digest) for v, _ in uses]
        if not self.deep:
            return 0, []
        try:
            data = self.store.get_object(key, ref.size)
        except ObjectNotFoundError:
            return 0, [Problem("segment_missing", f"segment {digest} disappeared while checking", first_version,
                               digest)]
        except StoreError as exc:  # e.g. not a regular file
            return 0, [Problem("segment_corrupt", f"segment {digest} cannot be read: {exc}", v, digest)
                       for v, _ in uses]
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            return len(data), [Problem("segment_digest", f"segment {digest} hashes to {actual}", v, digest)
                               for v, _ in uses]
        layout = self.layouts.get(self.inv.deltas[first_version].layout_fingerprint)
        problems = []
        if layout is not None:
            for version, version_ref in uses:
                try:
                    decode_segment(layout, self.inv.deltas[version].codec, version_ref, data, check_values=True)
                except AuroraError as exc:
                    problems.append(Problem("segment_corrupt", f"segment {digest}: {exc}", version, digest))
        return len(data), problems

    # --- the chain -------------------------------------------------------------------------------

    def check_chain(self) -> None:
        listed = set(self.inv.listed_deltas) | set(self.inv.listed_snapshots)
        first = self.inv.listed_deltas[0] if self.inv.listed_deltas else None
        for version, manifest in sorted(self.inv.deltas.items()):
            base = version - 1
            if manifest.base_version != base:
                self.add("chain_base", f"based on version {manifest.base_version}, expected {base}", version)
                continue
            if base in self.inv.deltas:
                expected, source = self.inv.deltas[base].weights_digest, f"delta {base}"
            elif base in self.inv.snapshots:
                expected, source = self.inv.snapshots[base].weights_digest, f"snapshot {base}"
            elif base in listed or version == first:
                continue  # the predecessor is unreadable (reported), or the chain starts outside the bucket
            else:
                self.add("chain_gap", f"base version {base} is neither a published delta nor a snapshot", version)
                continue
            if manifest.base_weights_digest != expected:
                self.add("chain_digest", f"base_weights_digest {manifest.base_weights_digest} differs from "
                                         f"{source}'s weights_digest {expected}", version)

    # --- snapshots -------------------------------------------------------------------------------

    def check_snapshots(self) -> None:
        files = [(version, entry) for version, snap in sorted(self.inv.snapshots.items()) for entry in snap.files]
        self.checked["snapshot_files"] = len(files)
        for found in parallel_map(self.store, lambda item: self._check_file(*item), files):
            self.problems.extend(found)
        listed = set(self.inv.listed_deltas)
        latest = self.inv.latest or 0
        for version, snap in sorted(self.inv.snapshots.items()):
            delta = self.inv.deltas.get(version)
            if delta is not None and delta.weights_digest != snap.weights_digest:
                self.add("snapshot_digest", f"snapshot weights_digest {snap.weights_digest} differs from delta "
                                            f"{version}'s {delta.weights_digest}", version)
            missing = next((v for v in range(version + 1, latest + 1) if v not in listed), None)
            if missing is not None:
                self.add("snapshot_stranded", f"cannot reach the latest version {latest}: delta {missing} is "
                                              f"not published", version)

    def _check_file(self, version: int, entry: SnapshotFile) -> list[Problem]:
        key = object_names.snapshot_dir(version) + entry.name
        size = object_size(self.store, key)
        if size is None:
            return [Problem("snapshot_file_missing", f"{key} ({entry.size} bytes) is not in the bucket", version,
                            entry.name)]
        if size != entry.size:
            return [Problem("snapshot_file_size", f"{key} holds {size} bytes, manifest says {entry.size}", version,
                            entry.name)]
        if self.deep:
            try:
                actual = hashlib.sha256(self.store.get_object(key, entry.size)).hexdigest()
            except StoreError as exc:
                return [Problem("snapshot_file_digest", f"{key} cannot be read: {exc}", version, entry.name)]
            if actual != entry.sha256:
                return [Problem("snapshot_file_digest", f"{key} hashes to {actual}, manifest says {entry.sha256}",
                                version, entry.name)]
        return []


def _span(versions: list[int]) -> str:
    return ", ".join(map(str, versions)) if len(versions) <= 4 else f"{versions[0]}…{versions[-1]}"
