"""Sharded snapshot writing: every rank writes the weight files of the parameters it owns.

transformers, vLLM and our actors load a snapshot by whole tensors per name, so each parameter is assigned
to one *owner* rank (greedy by size, so owners write similar amounts); at snapshot time the owner gathers
that one parameter's bf16 rows from the other ranks, and writes its parameters into its own HF-named
safetensors file(s), uploaded in parallel with the other owners'. Rank 0 then uploads the side files
(``config.json``, tokenizer) and ``model.safetensors.index.json`` and creates the manifest last, from the
file entries the ranks report. Snapshots are periodic, so moving each parameter once per snapshot is fine;
per-step publishing never does it. With one rank the files are byte-identical to
:func:`aurora_store.store.snapshots.write_snapshot`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.sharding import LocalRows
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import AuroraError, RankAborted
from aurora_store.store.snapshots import (
    DEFAULT_SHARD_BYTES,
    SnapshotFile,
    SnapshotManifest,
    create_snapshot_manifest,
    encode_weight_file,
    put_snapshot_file,
    weight_file_names,
    weight_index,
)
from aurora_store.store.versions import DeltaStore
from workers.publish.ranks import Ranks


@dataclass(frozen=True)
class PlannedFile:
    """One weight file of a snapshot: its name, the rank that writes it and the tensors in it, in order."""

    name: str
    owner: int
    tensors: tuple[str, ...]


def owners(layout: ModelLayout, world: int) -> dict[str, int]:
    """Owner rank of every training tensor: largest first, each to the rank with the fewest bytes so far
    (ties to the lowest rank), so all ranks compute the same assignment without talking."""
    sizes = {c.train_name: 2 * t.row_size * c.rows for t in layout.tensors for c in t.components}
    load = [0] * world
    owner: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], layout.train_names.index(n))):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[name] = rank
        load[rank] += sizes[name]
    return owner


def plan_files(layout: ModelLayout, world: int, shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[PlannedFile]:
    """The weight files of a snapshot: each owner's tensors in layout order, split greedily at
    ``shard_bytes`` (as :func:`~aurora_store.store.snapshots.shard_state` splits), owners in rank order."""
    owner = owners(layout, world)
    groups: list[tuple[int, list[str]]] = []
    for rank in range(world):
        size = 0
        current: list[str] = []
        for tensor in layout.tensors:
            for comp in tensor.components:
                if owner[comp.train_name] != rank:
                    continue
                nbytes = 2 * tensor.row_size * comp.rows
                if current and size + nbytes > shard_bytes:
                    groups.append((rank, current))
                    current, size = [], 0
                current.append(comp.train_name)
                size += nbytes
        if current:
            groups.append((rank, current))
    names = weight_file_names(len(groups))
    return [PlannedFile(name, rank, tuple(tensors)) for name, (rank, tensors) in zip(names, groups)]


def write_sharded_snapshot(ranks: Ranks, store: DeltaStore, version: int, layout: ModelLayout,
                           rows: Mapping[str, LocalRows], weights_digest: WeightsDigest, *,
                           extra_files: Mapping[str, bytes] | None = None, shard_bytes: int = DEFAULT_SHARD_BYTES,
                           created_at: str = "", producer: Mapping[str, Any] | None = None,
                           sign=None) -> SnapshotManifest | None:
    """Write snapshot ``version`` of the published bf16 ``rows`` from every rank; the manifest (returned on
    rank 0, ``None`` elsewhere) is created last, after every rank's files are uploaded."""
    plan = plan_files(layout, ranks.world, shard_bytes)
    owner = {name: f.owner for f in plan for name in f.tensors}
    mine: dict[str, torch.Tensor] = {}
    for tensor in layout.tensors:
        for comp in tensor.components:  # every rank walks the same order: one gather per tensor
            name = comp.train_name
            whole = ranks.gather_rows(rows[name].tensor, comp.rows, owner[name])
            if whole is not None:
                mine[name] = whole.reshape(tensor.component_shape(comp))
    entries: list[SnapshotFile] = []
    failure: AuroraError | None = None
    try:
        for planned in plan:
            if planned.owner == ranks.rank:
                data = encode_weight_file({n: mine[n] for n in planned.tensors})
                entries.append(put_snapshot_file(store, version, planned.name, data))
    except AuroraError as exc:
        if not ranks.sharded:
            raise
        failure = exc
    gathered = ranks.gather({"files": [[e.name, e.sha256, e.size] for e in entries],
                             "error": str(failure) if failure else None}, "snapshot")
    manifest, error = None, None
    if gathered is not None:
        try:
            errors = [doc["error"] for doc in gathered if doc["error"]]
            if errors:
                raise RankAborted(f"snapshot {version}: a rank failed to upload its files: {errors[0]}")
            files = [SnapshotFile(n, sha, size) for doc in gathered for n, sha, size in doc["files"]]
            side = dict(extra_files or {})
            if len(plan) > 1:
                weight_map = {n: f.name for f in plan for n in f.tensors}
                total = sum(2 * t.row_size * c.rows for t in layout.tensors for c in t.components)
                side["model.safetensors.index.json"] = weight_index(weight_map, total)
            files += [put_snapshot_file(store, version, name, data) for name, data in sorted(side.items())]
            manifest = create_snapshot_manifest(store, version, layout, weights_digest, files,
                                                [f.name for f in plan], created_at=created_at,
                                                producer=producer, sign=sign)
        except AuroraError as exc:
            if not ranks.sharded:
                raise
            error = exc
    verdict = ranks.broadcast(str(error) if error else None, "snapshot_ack")
    if error is not None:
        raise error
    if failure is not None:
        raise failure
    if verdict:
        raise RankAborted(f"snapshot {version} failed on rank 0: {verdict}")
    return manifest
