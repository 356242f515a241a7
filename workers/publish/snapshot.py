"""Sharded snapshot writing: every rank writes the weight files of the parameters it owns.

transformers, vLLM and our actors load a snapshot by whole tensors per name, so each parameter is assigned
to one *owner* rank (greedy by size, so owners write similar amounts); at snapshot time the owner gathers
that one parameter's bf16 rows from the other ranks, and writes its parameters into its own HF-named
safetensors file(s), uploaded in parallel with the other owners'. Rank 0 then uploads the side files
(``config.json``, tokenizer) and ``model.safetensors.index.json`` and creates the manifest last, from the
file entries the ranks report. Snapshots are periodic, so moving each parameter once per snapshot is fine;
per-step publishing never does it. With one rank the files are byte-identical to
:func:`aurora_store.store.snapshots.write_snapshot`'s.

Where the files name tensors otherwise than the trainer (``files_layout``: DeepSeek's per-expert tensors), an
engine tensor the two cut differently is one unit: one owner gathers all of it and cuts it into the files'
tensors. Rank 0 writes the layout's engine-only constants (``constants``, e.g. a router's correction bias) after
its weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.namesets import check_same_engine
from aurora_store.codec.sharding import LocalRows
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import AuroraError, LayoutError, RankAborted
from aurora_store.store.snapshots import (
    DEFAULT_SHARD_BYTES,
    SnapshotFile,
    SnapshotManifest,
    check_constants,
    constant_names,
    create_snapshot_manifest,
    encode_weight_file,
    file_tensors,
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


def _recut(layout: ModelLayout, files_layout: ModelLayout | None) -> list[bool]:
    """Per engine tensor of ``layout``: whether ``files_layout`` cuts it into other training tensors."""
    if files_layout is None or files_layout.fingerprint == layout.fingerprint:
        return [False] * len(layout.tensors)
    check_same_engine(layout, files_layout)
    return [have.components != want.components for have, want in zip(layout.tensors, files_layout.tensors)]


def owners(layout: ModelLayout, world: int, files_layout: ModelLayout | None = None) -> dict[str, int]:
    """Owner rank of every training tensor: largest unit first (a training tensor, or a whole engine tensor
    ``files_layout`` cuts otherwise), each to the rank with the fewest bytes so far (ties to the lowest rank), so
    all ranks compute the same assignment without talking."""
    units: list[tuple[list[str], int]] = []
    for tensor, recut in zip(layout.tensors, _recut(layout, files_layout)):
        names = [c.train_name for c in tensor.components]
        units += [(names, 2 * tensor.numel)] if recut else \
            [([c.train_name], 2 * tensor.row_size * c.rows) for c in tensor.components]
    index = {name: i for i, name in enumerate(layout.train_names)}
    load = [0] * world
    owner: dict[str, int] = {}
    for names, size in sorted(units, key=lambda u: (-u[1], index[u[0][0]])):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner.update(dict.fromkeys(names, rank))
        load[rank] += size
    return owner


def plan_files(layout: ModelLayout, world: int, shard_bytes: int = DEFAULT_SHARD_BYTES, *,
               files_layout: ModelLayout | None = None,
               constants: Mapping[str, int] | None = None) -> list[PlannedFile]:
    """The weight files of a snapshot (tensors under ``files_layout``'s names, then rank 0's ``constants``:
    name → bytes): each owner's tensors in layout order, split greedily at ``shard_bytes`` (as
    :func:`~aurora_store.store.snapshots.shard_state` splits), owners in rank order."""
    owner = owners(layout, world, files_layout)
    files = files_layout if files_layout is not None else layout
    sized: list[tuple[str, int, int]] = []  # (name in the files, owner, bytes), in the files' order
    for have, want, recut in zip(layout.tensors, files.tensors, _recut(layout, files_layout)):
        for comp in want.components:
            rank = owner[have.components[0].train_name] if recut else owner[comp.train_name]
            sized.append((comp.train_name, rank, 2 * want.row_size * comp.rows))
    sized += [(name, 0, nbytes) for name, nbytes in (constants or {}).items()]
    groups: list[tuple[int, list[str]]] = []
    for rank in range(world):
        size = 0
        current: list[str] = []
        for name, at, nbytes in sized:
            if at != rank:
                continue
            if current and size + nbytes > shard_bytes:
                groups.append((rank, current))
                current, size = [], 0
            current.append(name)
            size += nbytes
        if current:
            groups.append((rank, current))
    names = weight_file_names(len(groups))
    return [PlannedFile(name, rank, tuple(tensors)) for name, (rank, tensors) in zip(names, groups)]


def held_constants(model: torch.nn.Module, layout: ModelLayout) -> dict[str, torch.Tensor]:
    """The layout's engine-only constants as ``model`` holds them (buffers, in their own dtype, on the host), for
    a snapshot an engine boots from; :class:`~aurora_store.errors.LayoutError` naming any the model lacks (an
    engine would boot on uninitialised values)."""
    held = dict(model.named_buffers())
    held.update(model.named_parameters())
    names = constant_names(layout)
    missing = [n for n in names if n not in held]
    if missing:
        raise LayoutError(f"the model holds no {len(missing)} engine-only constants the snapshot needs: {missing[:8]}")
    return {n: held[n].detach().cpu().contiguous() for n in names}


def write_sharded_snapshot(ranks: Ranks, store: DeltaStore, version: int, layout: ModelLayout,
                           rows: Mapping[str, LocalRows], weights_digest: WeightsDigest, *,
                           extra_files: Mapping[str, bytes] | None = None, shard_bytes: int = DEFAULT_SHARD_BYTES,
                           created_at: str = "", producer: Mapping[str, Any] | None = None,
                           sign=None, files_layout: ModelLayout | None = None,
                           constants: Mapping[str, torch.Tensor] | None = None) -> SnapshotManifest | None:
    """Write snapshot ``version`` of the published bf16 ``rows`` from every rank; the manifest (returned on
    rank 0, ``None`` elsewhere) is created last, after every rank's files are uploaded. ``files_layout`` and
    ``constants`` as for :func:`~aurora_store.store.snapshots.write_snapshot` (every rank passes the same
    names and sizes; rank 0's constants are written)."""
    constants = dict(constants or {})
    check_constants(layout, constants)
    plan = plan_files(layout, ranks.world, shard_bytes, files_layout=files_layout,
                      constants={n: t.numel() * t.element_size() for n, t in constants.items()})
    owner = owners(layout, ranks.world, files_layout)
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
        tensors = file_tensors(mine, layout, files_layout, constants if ranks.rank == 0 else None)
        del mine
        for planned in plan:
            if planned.owner == ranks.rank:
                data = encode_weight_file({n: tensors[n] for n in planned.tensors})
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
                total = sum(2 * t.row_size * c.rows for t in layout.tensors for c in t.components) + \
                    sum(t.numel() * t.element_size() for t in constants.values())
                side["model.safetensors.index.json"] = weight_index(weight_map, total)
            files += [put_snapshot_file(store, version, name, data) for name, data in sorted(side.items())]
            manifest = create_snapshot_manifest(store, version, layout, weights_digest, files,
                                                [f.name for f in plan], created_at=created_at,
                                                producer=producer, sign=sign, files_layout=files_layout)
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
