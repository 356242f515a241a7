"""Staging one published version against a weight target: a delta (manifest checked, segments fetched and
verified, decoded, the digest after applying checked) or a full snapshot (diffed against the target's bits).
Nothing here writes the target; :func:`~aurora_store.codec.activate` does, at the caller's boundary. Only
:class:`~aurora_store.follow.Follower` sequences these steps."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from aurora_store.codec.decoder import StagedDelta, StagedSnapshot, TensorUpdate, check_applicable, stage
from aurora_store.codec.digest import WeightsDigest, hash_elements
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.codec.target import SupportsScatterPlan, WeightTarget
from aurora_store.errors import BaseVersionMismatchError, DigestMismatchError, LayoutMismatchError
from aurora_store.store.pool import shared_pool
from aurora_store.store.snapshot_manifest import SnapshotManifest, read_snapshot_manifest
from aurora_store.store.snapshots import fetch_snapshot_file, files_layout_of, weights_of
from aurora_store.store.transfer import fetch_segments
from aurora_store.store.versions import DeltaStore
from aurora_store.store.weightfile import tensor_views

ManifestCheck = Callable[[DeltaManifest], None]
SnapshotCheck = Callable[[SnapshotManifest], None]
#: Fetches a checked manifest's segments (each verified against its SHA-256), yielding them in any order:
#: ``(version, refs) -> (ref, bytes)…``. The default downloads them all from the store.
SegmentFetcher = Callable[[int, Sequence[SegmentRef]], Iterator[tuple[SegmentRef, bytes]]]
#: Verifies and decodes a checked manifest's segments against the target (default: :func:`stage`).
Decode = Callable[[DeltaManifest, Iterable[tuple[SegmentRef, bytes]]], StagedDelta]


def stage_version(store: DeltaStore, version: int, target: WeightTarget, *,
                  verify_manifest: ManifestCheck | None = None, fetch: SegmentFetcher | None = None,
                  decode: Decode | None = None) -> StagedDelta:
    """Stage delta ``version`` of ``store`` against ``target`` (no writes).

    The manifest is checked (signature via ``verify_manifest``, base, layout, base digest) before any
    segment is fetched. ``fetch`` fetches the segments (the follower's: prefetched bytes, a relay's cache,
    the bucket; default: the bucket, over its configured streams). ``decode`` replaces :func:`stage`
    (decode-ahead); it must make every check ``stage`` makes.
    """
    manifest = store.manifest(version)
    if verify_manifest is not None:
        verify_manifest(manifest)
    check_applicable(manifest, target)
    if decode is None:
        decode = lambda checked, segments: stage(checked, segments, target)  # noqa: E731
    if fetch is None:
        fetch = lambda _version, refs: fetch_segments(store, refs)  # noqa: E731
    return decode(manifest, fetch(version, manifest.segments))


def stage_snapshot(store: DeltaStore, version: int, target: WeightTarget, *,
                   verify_manifest: SnapshotCheck | None = None, streams: int | None = None) -> StagedSnapshot:
    """Download ``version``'s full snapshot and stage it against ``target`` (a :class:`StagedSnapshot`).

    The full-broadcast baseline: every weight file is downloaded (one file per stream, each checked against its
    SHA-256), the snapshot's bits are diffed against the target's current bits, and the digest after applying
    the difference must equal the snapshot's ``weights_digest`` — the same check a delta gets.
    :func:`activate` applies it like a delta. No writes to ``target``.
    """
    snapshot = read_snapshot_manifest(store, version)
    if verify_manifest is not None:
        verify_manifest(snapshot)
    layout = target.layout
    if snapshot.layout_fingerprint != layout.fingerprint:
        raise LayoutMismatchError(f"snapshot {version} has layout {snapshot.layout_fingerprint}, "
                                  f"target has {layout.fingerprint}")
    if target.version is None or target.version >= version:
        raise BaseVersionMismatchError(f"snapshot {version} cannot be staged on a target at version {target.version}")
    files_layout = files_layout_of(store, snapshot, layout)  # the same engine tensors, maybe other names
    entries = [f for f in snapshot.files if f.name in snapshot.weight_files]
    lanes = shared_pool().lanes(max(1, min(streams or store.settings.streams, len(entries))))
    state: dict[str, torch.Tensor] = {}
    for future in [lanes.submit(fetch_snapshot_file, store, snapshot, entry.name) for entry in entries]:
        data = future.result()  # hashed while it streamed in; the tensors are views of it (no copy)
        state.update(weights_of(tensor_views(data, len(data)), layout))
    new_fused: dict[str, list[torch.Tensor]] = {}
    for tensor, _offset, bits in files_layout.pieces(state):  # checks names, shapes and dtypes
        new_fused.setdefault(tensor.name, []).append(bits)
    updates = []
    delta = WeightsDigest()
    for tensor in layout.tensors:
        parts = new_fused[tensor.name]
        new = parts[0] if len(parts) == 1 else torch.cat(parts)
        old = target.fused_bits(tensor.name)
        indices = torch.ne(old, new).nonzero().flatten()
        if not indices.numel():
            continue
        new_bits, old_bits = new[indices].contiguous(), old[indices].contiguous()
        delta = delta + hash_elements(tensor.name, indices, new_bits) - hash_elements(tensor.name, indices, old_bits)
        plan = target.plan_scatter(tensor.name, indices) if isinstance(target, SupportsScatterPlan) else None
        updates.append(TensorUpdate(tensor.name, indices, new_bits, plan))
    if str(target.digest + delta) != snapshot.weights_digest:
        raise DigestMismatchError(f"snapshot {version} would give weights digest {target.digest + delta}, "
                                  f"its manifest says {snapshot.weights_digest}")
    return StagedSnapshot(version=version, base_version=target.version, layout_fingerprint=layout.fingerprint,
                          elements=layout.numel, base_weights_digest=str(target.digest),
                          weights_digest=snapshot.weights_digest, updates=tuple(updates),
                          snapshot_bytes=sum(f.size for f in entries))
