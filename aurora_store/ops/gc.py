"""``aurora gc``: delete what no retained snapshot chain needs, never what an actor could still need.

Policy. The newest ``N`` snapshots are kept; let ``s₀`` be the oldest of them. Everything an actor needs to
reach the latest version from any kept snapshot is kept: the deltas ``s₀+1 … latest``, every segment they
name, and every layout a kept manifest names. Deleted: snapshots older than ``s₀`` (manifest and files),
delta manifests ``≤ s₀``, the segments only those deltas named, layouts only deleted manifests named, and
snapshot directories below ``s₀`` that never got a manifest (abandoned writes).

Kept on purpose:

* **all history rows** (``history/``): a few KiB per version, not needed to catch up, but they are the
  record of the run that ``aurora log`` and the notebooks read — after a gc they still describe every
  version ever published;
* ``run.json`` and run-log exports (``runlog/``);
* **orphan segments** (named by no manifest at all) unless ``prune_orphans``: a publisher uploads a
  version's segments *before* creating its manifest, so an orphan may belong to a version being published
  right now; prune them only when no trainer is writing to the bucket.

Safety. The plan is made from one inventory that is first checked like ``aurora verify`` (without
``--deep``); if any problem concerns a kept version or a shared layout, or the chain ``s₀+1 … latest`` is
not complete, gc refuses (:class:`GcRefusedError`) and deletes nothing. Deletions run in an order that
keeps every listed manifest complete at every instant: snapshot manifests, then delta manifests, then the
snapshot files and segments they named, then layouts. A reader therefore never lists a manifest whose
objects are gone (one that read a manifest just before it was deleted may still fail to fetch; it
re-plans from the listing, as after any failed fetch).

Racing a publish. Segments are content-addressed, so a version published while gc runs may name a segment
gc planned to delete (identical bytes as an old version's). Three rules keep every committed manifest
complete: (1) right before deleting segments gc re-lists the delta manifests and spares every segment named
by one created after its plan; (2) it spares every segment written (or re-written) less than ``grace_s``
before the plan was made — a publisher re-puts every segment it uses, reused or not, so a publish in
progress always looks young (publishing must finish within the grace period; 10 minutes by default);
(3) the publisher checks that all its segments exist right before creating its manifest
(:meth:`~aurora_store.store.publisher.VersionPublisher.publish_parts`), so a segment deleted earlier makes
the publish fail instead of committing an incomplete version.

Relays re-copy what their region lacks from the source listing, so collect the source bucket first and
the regional buckets after. On a live run keep at least two snapshots: an actor that falls behind the
oldest kept snapshot can only catch up by loading a snapshot.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from aurora_store.errors import ConfigError, FormatError, GcRefusedError, ObjectNotFoundError, VersionNotFoundError
from aurora_store.ops.inventory import Inventory, delete_object, object_size, parallel_map, read_inventory
from aurora_store.ops.problems import Problem
from aurora_store.ops.verify import check_inventory
from aurora_store.store import object_names, retry
from aurora_store.store.versions import DeltaStore

Kind = Literal["snapshot_manifest", "delta_manifest", "snapshot_file", "segment", "orphan_segment", "layout"]
#: The order deletions run in (see the module docstring for why).
ORDER: tuple[Kind, ...] = ("snapshot_manifest", "delta_manifest", "snapshot_file", "segment", "orphan_segment",
                           "layout")
#: Segments written less than this long before the plan are never deleted (a publish may be using them).
DEFAULT_GRACE_S = 600.0

log = logging.getLogger("aurora.gc")




@dataclass(frozen=True)
class Deletion:
    key: str
    size: int
    kind: Kind

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "size": self.size, "kind": self.kind}


@dataclass(frozen=True)
class GcPlan:
    """What gc keeps and deletes. ``deletions`` are in the order they run; sizes of segments and snapshot
    files are the ones their manifests declare."""

    url: str
    keep_snapshots: int
    retained_snapshots: tuple[int, ...]
    kept_deltas: tuple[int, ...]
    removed_snapshots: tuple[int, ...]
    removed_deltas: tuple[int, ...]
    deletions: tuple[Deletion, ...]
    orphan_segments: tuple[str, ...]
    prune_orphans: bool
    planned_at: float = field(default_factory=time.time)  # POSIX time before the inventory was read

    @property
    def bytes_freed(self) -> int:
        return sum(d.size for d in self.deletions)

    def of_kind(self, kind: Kind) -> tuple[Deletion, ...]:
        return tuple(d for d in self.deletions if d.kind == kind)


@dataclass(frozen=True)
class GcReport:
    plan: GcPlan
    dry_run: bool
    deleted: int
    spared: tuple[str, ...] = ()  # planned segment keys kept: named by a newer manifest, or written recently

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {"ok": True, "bucket": p.url, "dry_run": self.dry_run, "keep_snapshots": p.keep_snapshots,
                "retained_snapshots": list(p.retained_snapshots), "kept_deltas": _range_json(p.kept_deltas),
                "removed_snapshots": list(p.removed_snapshots), "removed_deltas": list(p.removed_deltas),
                "deletions": [d.to_json() for d in p.deletions], "orphan_segments": list(p.orphan_segments),
                "prune_orphans": p.prune_orphans, "bytes_freed": p.bytes_freed, "deleted": self.deleted,
                "spared": list(self.spared)}


def plan_gc(store: DeltaStore | str, keep_snapshots: int, *, prune_orphans: bool = False) -> GcPlan:
    """Decide what to delete (nothing is deleted). Raises :class:`GcRefusedError` when the kept chain has
    problems, :class:`ConfigError` for ``keep_snapshots < 1`` and :class:`VersionNotFoundError` for a bucket
    without versions."""
    if keep_snapshots < 1:
        raise ConfigError(f"--keep-snapshots must be at least 1, got {keep_snapshots}")
    store = DeltaStore(store) if isinstance(store, str) else store
    planned_at = time.time()
    inv = read_inventory(store)
    if inv.empty:
        raise VersionNotFoundError(f"{store.url} holds no delta or snapshot manifests: is the URL right?")
    retained = inv.listed_snapshots[-keep_snapshots:]
    oldest = retained[0] if retained else None
    _check_kept_chain(store, inv, oldest)
    if oldest is None:  # no snapshot: every delta is someone's only way to the latest version
        removed_deltas: tuple[int, ...] = ()
        removed_snapshots: tuple[int, ...] = ()
    else:
        removed_deltas = tuple(v for v in inv.listed_deltas if v <= oldest)
        removed_snapshots = tuple(v for v in inv.listed_snapshots if v < oldest)
    kept_deltas = tuple(v for v in inv.listed_deltas if v not in removed_deltas)
    deletions = _deletions(store, inv, oldest, removed_deltas, removed_snapshots, kept_deltas, retained)
    referenced = {ref.digest for m in inv.deltas.values() for ref in m.segments}
    orphans = tuple(sorted(inv.segments - referenced))
    if prune_orphans:
        sizes = parallel_map(store, lambda d: object_size(store, object_names.segment(d)), orphans)
        deletions += [Deletion(object_names.segment(d), s or 0, "orphan_segment") for d, s in zip(orphans, sizes)]
    deletions.sort(key=lambda d: ORDER.index(d.kind))  # stable: keeps version order within a kind
    return GcPlan(store.url, keep_snapshots, tuple(retained), kept_deltas, removed_snapshots, removed_deltas,
                  tuple(deletions), orphans, prune_orphans, planned_at)


def collect_garbage(store: DeltaStore | str, keep_snapshots: int, *, dry_run: bool = False,
                    prune_orphans: bool = False, grace_s: float = DEFAULT_GRACE_S) -> GcReport:
    """Plan, then (unless ``dry_run``) delete in the safe order. An interrupted gc leaves a consistent
    bucket: running it again finishes the manifests and snapshot files; segments whose manifests were
    already gone are orphans by then, which ``prune_orphans`` removes (when no trainer is publishing)."""
    store = DeltaStore(store) if isinstance(store, str) else store
    plan = plan_gc(store, keep_snapshots, prune_orphans=prune_orphans)
    if dry_run:
        return GcReport(plan, True, 0)
    return execute_plan(store, plan, grace_s=grace_s)


def execute_plan(store: DeltaStore, plan: GcPlan, *, grace_s: float = DEFAULT_GRACE_S) -> GcReport:
    """Carry out ``plan`` (see the module docstring for the order and for what is spared)."""
    if grace_s < 0:
        raise ConfigError(f"grace period must be >= 0 seconds, got {grace_s}")
    deleted = 0
    spared: list[str] = []
    for kind in ORDER:  # one kind at a time: a kind starts only once the previous one is fully deleted
        batch = plan.of_kind(kind)
        if kind in ("segment", "orphan_segment"):
            removed, kept = _delete_unused_segments(store, plan, batch, grace_s) if batch else ((), [])
            spared += kept
            deleted += len(removed)
            continue
        parallel_map(store, lambda d: delete_object(store, d.key), batch)
        deleted += len(batch)
    if spared:
        log.info("gc spared %d segment(s) a newer or in-progress publish uses", len(spared))
    return GcReport(plan, False, deleted, tuple(spared))


def _delete_unused_segments(store: DeltaStore, plan: GcPlan, batch: tuple[Deletion, ...],
                            grace_s: float) -> tuple[tuple[Deletion, ...], list[str]]:
    """Delete the part of ``batch`` that no manifest created after the plan names and that no publisher wrote
    recently; returns ``(deleted, spared keys)``."""
    known = set(plan.kept_deltas) | set(plan.removed_deltas)
    in_use: set[str] = set()
    for version in store.versions():
        if version in known:
            continue
        try:
            manifest = DeltaStore(store.bucket, store.settings).manifest(version)
        except (FormatError, ObjectNotFoundError):
            # A new manifest we cannot read may name any segment: delete none this time.
            return (), [d.key for d in batch]
        in_use |= {object_names.segment(ref.digest) for ref in manifest.segments}
    cutoff = plan.planned_at - grace_s

    def delete_if_old(deletion: Deletion) -> bool:
        # Checked and deleted in one step per object, so the gap a concurrent re-put could slip into is one
        # request long, and the publisher's own check before its manifest covers the rest.
        try:
            stamp = retry.call(store.settings, lambda: store.bucket.modified(deletion.key))
        except ObjectNotFoundError:
            return True
        # S3's LastModified is an HTTP date, truncated to whole seconds: a segment re-put 0.9 s ago reads as up
        # to 1.9 s old. A whole-second stamp is taken as the latest instant it may stand for (sparing more,
        # never less); sub-second stamps (local files) are exact.
        if stamp is not None and stamp == int(stamp):
            stamp += 1.0
        if stamp is not None and stamp >= cutoff:
            return False
        delete_object(store, deletion.key)
        return True

    candidates = [d for d in batch if d.key not in in_use]
    done = parallel_map(store, delete_if_old, candidates)
    deleted = {d.key for d, ok in zip(candidates, done) if ok}
    return tuple(d for d in batch if d.key in deleted), [d.key for d in batch if d.key not in deleted]


def _check_kept_chain(store: DeltaStore, inv: Inventory, oldest: int | None) -> None:
    report = check_inventory(store, inv)
    blocking = [p for p in report.problems if _blocks(p, oldest)]
    latest = inv.latest or 0
    if oldest is not None:
        gaps = [v for v in range(oldest + 1, latest + 1) if v not in inv.deltas]
        if gaps and not blocking:
            blocking.append(Problem("snapshot_stranded", f"cannot reach the latest version {latest}: delta "
                                                         f"{gaps[0]} is missing or unreadable", oldest))
    if blocking:
        raise GcRefusedError(f"refusing to collect {store.url}: {len(blocking)} problem(s) in what would be kept "
                             f"(run aurora verify); nothing was deleted", blocking)


#: Problems that concern only a delta manifest or its segments: harmless at the oldest kept snapshot's
#: version, whose delta gc deletes (the snapshot takes its place as the chain's start).
_DELTA_ONLY = frozenset({"manifest_malformed", "manifest_wrong_version", "manifest_layout_mismatch", "segment_missing",
                         "segment_size", "segment_digest", "segment_corrupt", "chain_base", "chain_digest",
                         "chain_gap", "replay_failed"})


def _blocks(problem: Problem, oldest: int | None) -> bool:
    """Whether ``problem`` touches what gc keeps. Layout problems always do (a layout is shared by versions
    on both sides); so does everything when there is no snapshot to keep."""
    if oldest is None or problem.version is None or problem.code.startswith("layout_"):
        return True
    if problem.version != oldest:
        return problem.version > oldest
    return problem.code not in _DELTA_ONLY


def _deletions(store: DeltaStore, inv: Inventory, oldest: int | None, removed_deltas: tuple[int, ...],
               removed_snapshots: tuple[int, ...], kept_deltas: tuple[int, ...],
               retained: tuple[int, ...]) -> list[Deletion]:
    out: list[Deletion] = []
    for version in removed_snapshots:
        snap = inv.snapshots.get(version)
        manifest_key = object_names.snapshot_manifest(version)
        size = len(snap.to_bytes()) if snap is not None else object_size(store, manifest_key) or 0
        out.append(Deletion(manifest_key, size, "snapshot_manifest"))
    for version in removed_deltas:
        out.append(Deletion(object_names.delta(version), inv.manifest_sizes.get(version, 0), "delta_manifest"))
    abandoned = [v for v in inv.snapshot_keys if v not in inv.listed_snapshots and oldest is not None and v < oldest]
    for version in sorted([*removed_snapshots, *abandoned]):
        declared = {f.name: f.size for f in inv.snapshots[version].files} if version in inv.snapshots else {}
        files = [k for k in inv.snapshot_keys[version] if k != object_names.snapshot_manifest(version)]
        prefix = object_names.snapshot_dir(version)
        listed = [declared.get(k[len(prefix):]) for k in files]
        sizes = [s if s is not None else object_size(store, k) or 0 for k, s in zip(files, listed)]
        out += [Deletion(k, s, "snapshot_file") for k, s in zip(files, sizes)]
    kept_segments = {ref.digest for v in kept_deltas if v in inv.deltas for ref in inv.deltas[v].segments}
    dropped: dict[str, int] = {}
    for version in removed_deltas:
        for ref in inv.deltas[version].segments if version in inv.deltas else ():
            if ref.digest not in kept_segments and ref.digest in inv.segments:
                dropped.setdefault(ref.digest, ref.size)
    out += [Deletion(object_names.segment(d), s, "segment") for d, s in dropped.items()]
    kept_layouts = {inv.deltas[v].layout_fingerprint for v in kept_deltas if v in inv.deltas}
    # A snapshot names its run's layout and, where its files hold other names, that layout too.
    kept_layouts |= {f for v in retained if v in inv.snapshots
                     for f in (inv.snapshots[v].layout_fingerprint, inv.snapshots[v].files_layout) if f}
    dropped_layouts = {inv.deltas[v].layout_fingerprint for v in removed_deltas if v in inv.deltas}
    dropped_layouts |= {f for v in removed_snapshots if v in inv.snapshots
                        for f in (inv.snapshots[v].layout_fingerprint, inv.snapshots[v].files_layout) if f}
    for fingerprint in sorted(dropped_layouts - kept_layouts):
        if fingerprint in inv.layouts:
            key = object_names.layout(fingerprint)
            out.append(Deletion(key, object_size(store, key) or 0, "layout"))
    return out


def _range_json(versions: tuple[int, ...]) -> dict[str, Any]:
    return {"first": versions[0] if versions else None, "last": versions[-1] if versions else None,
            "count": len(versions)}
