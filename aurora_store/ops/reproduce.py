"""The expensive half of ``aurora verify --deep``: rebuild the weights from snapshots and deltas.

Walking the versions in order from the oldest snapshot, the weights are loaded from each snapshot (which
checks its tensors against its digest), every delta is decoded and applied on top (which checks each
version's digest before writing), and on reaching the next snapshot the replayed weights are hashed from
scratch and compared with that snapshot's digest. This is exactly what an actor does to catch up, so a
bucket that passes can bootstrap any actor from any snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping

from aurora_store.codec.decoder import activate, check_applicable, stage
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest
from aurora_store.codec.target import TensorTarget, WeightTarget
from aurora_store.errors import AuroraError, DigestMismatchError
from aurora_store.ops.inventory import Inventory
from aurora_store.ops.problems import Problem
from aurora_store.store.snapshots import load_snapshot
from aurora_store.store.transfer import fetch_segments
from aurora_store.store.versions import DeltaStore


def replay_between_snapshots(store: DeltaStore, inventory: Inventory, layouts: Mapping[str, ModelLayout],
                             problems: list[Problem]) -> tuple[int, int]:
    """Replay the chain from the oldest snapshot to the latest version, appending what fails to
    ``problems``. Returns ``(deltas replayed, snapshots reproduced by replay)``.

    After a failure the walk resumes at the next snapshot that loads, so one bad delta does not hide the
    state of the rest of the chain. Deltas before the oldest snapshot cannot be replayed (their base is
    not in the bucket) and are only checked segment by segment.
    """
    if not inventory.snapshots:
        return 0, 0
    last = max([*inventory.deltas, *inventory.snapshots])
    target: WeightTarget | None = None
    origin = min(inventory.snapshots)  # the snapshot the running target was loaded from (read while there is one)
    replayed = reproduced = 0
    for version in range(min(inventory.snapshots), last + 1):
        if target is not None and version in inventory.deltas and target.version == version - 1:
            failure = _apply(store, inventory.deltas[version], target, problems)
            if failure is None:
                replayed += 1
            else:
                problems.append(Problem("replay_failed", f"replay from snapshot {origin} stops here: {failure}",
                                        version))
                target = None
        snapshot = inventory.snapshots.get(version)
        if snapshot is None:
            continue
        if target is not None and target.version == version:
            actual = str(target.full_digest())
            if actual == snapshot.weights_digest:
                reproduced += 1
            else:
                problems.append(Problem("snapshot_replay", f"replaying {origin + 1}..{version} from snapshot "
                                                           f"{origin} gives weights digest {actual}, the snapshot "
                                                           f"declares {snapshot.weights_digest}", version))
        # Load every snapshot (that checks its tensors against its digest), but keep going with the replayed
        # weights when there are some: they were checked against every manifest on the way.
        loaded = _load(store, version, layouts.get(snapshot.layout_fingerprint), problems)
        if loaded is not None and (target is None or target.version != version):
            target, origin = loaded, version
    return replayed, reproduced


def _apply(store: DeltaStore, manifest: DeltaManifest, target: WeightTarget, problems: list[Problem]) -> str | None:
    """Apply one delta as a follower would (stage, then activate), but from the manifest the inventory read
    (the store's manifest cache could hold an older copy of a rewritten manifest). Returns
    why it could not be applied, or ``None``."""
    if any(p.version == manifest.version and p.code.startswith("segment_") for p in problems):
        return "its segments are damaged (see above)"  # no point fetching them again
    try:
        check_applicable(manifest, target)
        activate(stage(manifest, fetch_segments(store, manifest.segments), target), target)
    except AuroraError as exc:
        return f"cannot be applied on top of version {target.version}: {exc}"
    return None


def _load(store: DeltaStore, version: int, layout: ModelLayout | None,
          problems: list[Problem]) -> WeightTarget | None:
    if layout is None:  # reported by the layout check
        return None
    try:
        state, _ = load_snapshot(store, version, layout)
    except DigestMismatchError as exc:
        problems.append(Problem("snapshot_content", str(exc), version))
        return None
    except AuroraError as exc:  # missing or corrupt files: reported by the file checks
        if not any(p.version == version and p.code.startswith("snapshot_file") for p in problems):
            problems.append(Problem("snapshot_content", f"cannot be loaded: {exc}", version))
        return None
    return TensorTarget.from_state(layout, state, version=version)
