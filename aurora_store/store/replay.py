"""Fetching and applying published versions onto a weight target."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aurora_store.codec.decoder import StagedDelta, activate, check_applicable, stage
from aurora_store.codec.manifest import DeltaManifest
from aurora_store.codec.target import WeightTarget
from aurora_store.progress import Progress
from aurora_store.store.transfer import fetch_segments
from aurora_store.store.versions import DeltaStore

ManifestCheck = Callable[[DeltaManifest], None]


def stage_version(store: DeltaStore, version: int, target: WeightTarget, *, streams: int | None = None,
                  verify_manifest: ManifestCheck | None = None, progress: bool = False,
                  on_fetched: Callable[[int], None] | None = None) -> StagedDelta:
    """Fetch ``version`` over parallel streams and stage it against ``target`` (no writes).

    The manifest is checked (signature via ``verify_manifest``, base, layout, base digest) before any
    segment is downloaded.
    """
    manifest = store.manifest(version)
    if verify_manifest is not None:
        verify_manifest(manifest)
    check_applicable(manifest, target)
    bar = Progress(manifest.segment_bytes, f"v{version}", interactive=None if progress else False)
    with bar:
        segments = fetch_segments(store, manifest.segments, streams=streams, progress=bar,
                                  on_fetched=(lambda _ref, n: on_fetched(n)) if on_fetched else None)
        return stage(manifest, segments, target)


def replay(store: DeltaStore, target: WeightTarget, versions: Iterable[int], **kwargs) -> list[DeltaManifest]:
    """Apply ``versions`` in order (each must be based on the previous)."""
    applied = []
    for version in versions:
        staged = stage_version(store, version, target, **kwargs)
        activate(staged, target)
        applied.append(staged.manifest)
    return applied
