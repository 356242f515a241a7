"""The published bf16 rows of a version, rebuilt from the bucket on resume (checkpoints do not hold them).

Each rank rebuilds the whole policy of ``version`` the way an actor catching up would — the cheapest
snapshot at or below it (its digest checked from scratch) and the deltas after it (each staged against its
manifest's digest) — and keeps the rows it owns. The ranks' rows, hashed and summed, must then equal the
manifest's ``weights_digest`` (:meth:`Publishing.sum_digest`, checked by the bootstrap): a mismatch is a
:class:`~aurora_store.errors.DigestMismatchError`. Every rank reads the bucket itself, so no weights move
between ranks; each holds one bf16 copy of the model on the host while it rebuilds.
"""

from __future__ import annotations

from aurora_store.codec import ModelLayout, TensorTarget
from aurora_store.codec.sharding import LocalRows
from aurora_store.follow import follow, plan_catch_up
from aurora_store.store import DeltaStore
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot
from workers.trainer.policy import ShardedPolicy


def published_rows(store: DeltaStore, layout: ModelLayout, version: int, policy: ShardedPolicy,
                   ) -> dict[str, LocalRows]:
    """This rank's bf16 rows of ``version`` as the bucket holds it."""
    snapshots = {s: read_snapshot_manifest(store, s).total_bytes for s in store.snapshot_versions() if s <= version}
    deltas = {v: store.delta_bytes(v) for v in store.versions() if v <= version}
    plan = plan_catch_up(None, version, deltas, snapshots)
    assert plan.snapshot is not None  # from nothing, every plan starts at a snapshot
    state, _ = load_snapshot(store, plan.snapshot, layout)
    if plan.deltas:
        follow(store, TensorTarget.from_state(layout, state, version=plan.snapshot), version, snapshots=False)
    rows = {}
    for name, local in policy.master_rows().items():
        start = policy.starts[name]
        rows[name] = state[name][start:start + int(local.shape[0])].to(local.device).contiguous()
    return policy.rows_of(rows)
