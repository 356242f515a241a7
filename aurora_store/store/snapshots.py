"""Full-weight snapshots for bootstrap: HuggingFace-named safetensors shards plus a manifest.

``snapshots/<version>/`` holds ``model.safetensors`` (or ``model-0000k-of-0000n.safetensors`` shards with a
``model.safetensors.index.json``), any side files (``config.json``, tokenizer files), and — written last,
create-only — ``manifest.json`` with every file's SHA-256, the layout fingerprint and the weights digest.
The directory loads directly into transformers or vLLM once downloaded: the weight files hold the names the
engine's loader reads (the run layout's training names, or those of the family's snapshot layout, recorded in the
manifest as ``files_layout``: per-expert tensors for DeepSeek-V3), and the constants the engine loads with them
(the layout's engine-only constants as the trainer holds them, e.g. DeepSeek's float32 router correction bias),
which are not weights: no digest covers them and readers hand back only the weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_safetensors

from aurora_store.codec.digest import ZERO, WeightsDigest, digest_pieces
from aurora_store.codec.families import CONSTANT
from aurora_store.codec.layout import ModelLayout, engine_bits
from aurora_store.codec.namesets import check_same_engine, convert
from aurora_store.errors import (
    DigestMismatchError,
    IntegrityError,
    LayoutError,
    LayoutMismatchError,
    ManifestError,
)
from aurora_store.store import object_names
from aurora_store.store.snapshot_manifest import (
    SnapshotFile,
    SnapshotManifest,
    create_snapshot_manifest,
    read_snapshot_manifest,
)
from aurora_store.store.versions import DeltaStore
from aurora_store.store.weightfile import tensor_views

DEFAULT_SHARD_BYTES = 2 << 30


def shard_state(state: Mapping[str, torch.Tensor], shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Greedy, order-preserving split of tensors into shards of at most ``shard_bytes`` (one tensor may exceed)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def encode_snapshot_files(state: Mapping[str, torch.Tensor], shard_bytes: int = DEFAULT_SHARD_BYTES,
                          ) -> tuple[dict[str, bytes], tuple[str, ...]]:
    """Serialise training-layout tensors as HF-style safetensors shard files."""
    shards = shard_state({k: v.detach().contiguous() for k, v in state.items()}, shard_bytes)
    files: dict[str, bytes] = {}
    metadata = {"format": "pt"}
    if len(shards) == 1:
        files["model.safetensors"] = save_safetensors(shards[0], metadata=metadata)
        return files, ("model.safetensors",)
    weight_map = {}
    total = 0
    names = []
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        files[name] = save_safetensors(shard, metadata=metadata)
        names.append(name)
        for tensor_name, tensor in shard.items():
            weight_map[tensor_name] = name
            total += tensor.numel() * tensor.element_size()
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    return files, tuple(names)


def constant_names(layout: ModelLayout) -> list[str]:
    """The layout's engine-only constants (loaded once by the engine, never shipped), in layout order."""
    return [e.name for e in layout.engine_only if e.rule == CONSTANT]


def check_constants(layout: ModelLayout, constants: Mapping[str, torch.Tensor]) -> None:
    """:class:`LayoutError` unless every tensor of ``constants`` is one of the layout's engine-only constants."""
    unknown = sorted(set(constants) - set(constant_names(layout)))
    if unknown:
        raise LayoutError(f"{len(unknown)} snapshot constants are not engine-only constants of the layout: "
                          f"{unknown[:8]}")


def file_tensors(state: Mapping[str, torch.Tensor], layout: ModelLayout, files_layout: ModelLayout | None = None,
                 constants: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a snapshot's weight files, in order: ``state``'s (all or whole engine tensors of
    ``layout``'s training names) under ``files_layout``'s names, then ``constants``."""
    weights = {n: state[n] for n in layout.train_names if n in state}
    if files_layout is not None and files_layout.fingerprint != layout.fingerprint:
        weights = convert(weights, layout, files_layout)
    check_constants(layout, constants or {})
    return {**weights, **(constants or {})}


def write_snapshot(store: DeltaStore, version: int, state: Mapping[str, torch.Tensor], layout: ModelLayout,
                   weights_digest: WeightsDigest, *, extra_files: Mapping[str, bytes] | None = None,
                   shard_bytes: int = DEFAULT_SHARD_BYTES, created_at: str = "",
                   producer: Mapping[str, Any] | None = None,
                   sign=None, streams: int = 1, files_layout: ModelLayout | None = None,
                   constants: Mapping[str, torch.Tensor] | None = None) -> SnapshotManifest:
    """Upload a snapshot of ``state`` (training names) and create its manifest last.

    Weight files are serialised in order and uploaded (with their SHA-256) on ``streams`` parallel streams,
    the next file serialised while earlier ones upload; the writer holds at most ``streams`` + 1 files' bytes
    beside ``state`` (the files are byte-identical to :func:`encode_snapshot_files`'). ``sign`` optionally
    turns the manifest into a signed one before it is written. ``files_layout`` names the tensors in the files
    (:func:`~aurora_store.codec.namesets.snapshot_layout`; default: ``layout``'s names) and ``constants``
    (engine-only constants of ``layout``, in any dtype) are written after the weights.
    """
    if streams < 1:
        raise ValueError(f"streams must be ≥ 1, not {streams}")
    layout.check_state(state)
    shards = shard_state(file_tensors(state, layout, files_layout, constants), shard_bytes)
    weight_files = weight_file_names(len(shards))
    weight_map, total = {}, 0
    in_flight: deque[Future[SnapshotFile]] = deque()
    entries: list[SnapshotFile] = []
    with ThreadPoolExecutor(max_workers=streams, thread_name_prefix="aurora-snapshot") as pool:
        for name, shard in zip(weight_files, shards):
            data = encode_weight_file(shard)
            while len(in_flight) >= streams:
                entries.append(in_flight.popleft().result())
            in_flight.append(pool.submit(put_snapshot_file, store, version, name, data))
            del data
            for tensor_name, tensor in shard.items():
                weight_map[tensor_name] = name
                total += tensor.numel() * tensor.element_size()
        entries.extend(f.result() for f in in_flight)
    side = dict(extra_files or {})
    if len(shards) > 1:
        side["model.safetensors.index.json"] = weight_index(weight_map, total)
    for name, data in side.items():
        if name in weight_files:
            raise ManifestError(f"snapshot {version}: extra file {name!r} would replace a weight file")
        entries.append(put_snapshot_file(store, version, name, data))
    return create_snapshot_manifest(store, version, layout, weights_digest, entries, weight_files,
                                    created_at=created_at, producer=producer, sign=sign, files_layout=files_layout)


def weight_file_names(count: int) -> list[str]:
    """HF names for ``count`` weight files: ``model.safetensors`` alone, else ``model-0000k-of-0000n.safetensors``
    (the names :func:`encode_snapshot_files` uses), so writers that produce files separately agree on them."""
    if count < 1:
        raise ManifestError("a snapshot needs at least one weight file")
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def encode_weight_file(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """One safetensors weight file, byte-identical to what :func:`encode_snapshot_files` writes for the same
    tensors in the same order."""
    return save_safetensors({k: v.detach().contiguous() for k, v in tensors.items()}, metadata={"format": "pt"})


def weight_index(weight_map: Mapping[str, str], total_size: int) -> bytes:
    """``model.safetensors.index.json`` for sharded weight files (same format as :func:`encode_snapshot_files`)."""
    return json.dumps({"metadata": {"total_size": total_size}, "weight_map": dict(weight_map)}, indent=2).encode()


def put_snapshot_file(store: DeltaStore, version: int, name: str, data: bytes) -> SnapshotFile:
    """Upload one file of snapshot ``version`` and return its manifest entry. Several writers (e.g. the ranks
    of a sharded trainer) may each upload their own files; one of them then calls
    :func:`create_snapshot_manifest` with all entries."""
    store.put_object(object_names.snapshot_dir(version) + name, data)
    return SnapshotFile(name, hashlib.sha256(data).hexdigest(), len(data))


def read_snapshot_file(store: DeltaStore, manifest: SnapshotManifest, name: str) -> bytes:
    entry = next((f for f in manifest.files if f.name == name), None)
    if entry is None:
        raise ManifestError(f"snapshot {manifest.version} has no file {name!r}")
    for _ in range(2):  # one re-fetch on mismatch (e.g. a torn read), then give up
        data = store.get_object(object_names.snapshot_dir(manifest.version) + name, entry.size)
        if len(data) == entry.size and hashlib.sha256(data).hexdigest() == entry.sha256:
            return data
    raise IntegrityError(f"snapshot {manifest.version} file {name} in {store.url} does not match its digest")


def fetch_snapshot_file(store: DeltaStore, manifest: SnapshotManifest, name: str) -> memoryview:
    """:func:`read_snapshot_file` into one writable buffer, hashed while the bytes stream in (no second pass
    over them, no join of the response's chunks): a view of exactly the file's bytes, verified against its
    size and SHA-256 (one re-fetch on mismatch, then :class:`IntegrityError`)."""
    entry = next((f for f in manifest.files if f.name == name), None)
    if entry is None:
        raise ManifestError(f"snapshot {manifest.version} has no file {name!r}")
    key = object_names.snapshot_dir(manifest.version) + name
    for _ in range(2):
        buffer = memoryview(bytearray(entry.size + 1))  # one byte more: an overlong object shows
        count, sha256 = store.read_hashed(key, buffer)
        if count == entry.size and sha256 == entry.sha256:
            return buffer[:count]
    raise IntegrityError(f"snapshot {manifest.version} file {name} in {store.url} does not match its digest")


def files_layout_of(store: DeltaStore, manifest: SnapshotManifest, layout: ModelLayout) -> ModelLayout:
    """The layout whose training names ``manifest``'s weight files hold (``layout`` unless the manifest names
    another), checked to be a name set of ``layout``'s engine tensors."""
    if not manifest.files_layout:
        return layout
    files = store.layout(manifest.files_layout)  # checked against the fingerprint the manifest names
    check_same_engine(layout, files)
    return files


def weights_of(tensors: Mapping[str, torch.Tensor], layout: ModelLayout) -> dict[str, torch.Tensor]:
    """``tensors`` of a snapshot's weight files without the layout's engine-only constants (not weights)."""
    constants = set(constant_names(layout))
    return {n: t for n, t in tensors.items() if n not in constants}


def load_snapshot(store: DeltaStore, version: int, layout: ModelLayout, *,
                  download_dir: str | os.PathLike | None = None, verify_digest: bool = True,
                  verify_manifest=None, streams: int = 1,
                  threads: int | None = None) -> tuple[dict[str, torch.Tensor], SnapshotManifest]:
    """Download and verify a snapshot; return its training-layout tensors (and optionally keep the files).
    Tensors the files hold under other names (the manifest's ``files_layout``) come back under ``layout``'s
    (copies of those engine tensors); constants the files hold beside the weights are left out.

    Files are downloaded (each hashed with SHA-256 while it streams in, then checked) and parsed on
    ``streams`` parallel streams; the returned tensors are views of the downloaded buffers (no copy). Each
    file's share of the weights digest is computed on ``threads`` threads as soon as it is in.
    ``verify_manifest`` (e.g. a signature check) runs on the manifest before any file is downloaded."""
    if streams < 1:
        raise ValueError(f"streams must be ≥ 1, not {streams}")
    manifest = read_snapshot_manifest(store, version)
    if verify_manifest is not None:
        verify_manifest(manifest)
    if manifest.layout_fingerprint != layout.fingerprint:
        raise LayoutMismatchError(f"snapshot {version} has layout {manifest.layout_fingerprint}, "
                                  f"expected {layout.fingerprint}")
    state: dict[str, torch.Tensor] = {}
    target_dir = Path(download_dir) if download_dir is not None else None
    if target_dir is not None:
        target_dir.mkdir(parents=True, exist_ok=True)
    # Where each training tensor lies in its inference tensor: a file's share of the digest is hashed as soon
    # as the file is in, while the other files are still downloading (the digest is a sum).
    files_layout = files_layout_of(store, manifest, layout)
    placed = {c.train_name: (t, c) for t in files_layout.tensors for c in t.components}

    def fetch(entry: SnapshotFile) -> tuple[dict[str, torch.Tensor], WeightsDigest]:
        data = fetch_snapshot_file(store, manifest, entry.name)
        if target_dir is not None:
            _atomic_write(target_dir / entry.name, data)
        if entry.name not in manifest.weight_files:
            return {}, ZERO
        tensors = weights_of(tensor_views(data, len(data)), layout)  # views of the fetched buffer: no copy
        del data
        pieces = []
        for name, tensor in tensors.items() if verify_digest else ():
            where = placed.get(name)
            # Anything of the wrong shape or width is left to check_state below, which names the problem.
            if where is not None and tensor.element_size() == 2 and \
                    tuple(tensor.shape) == tuple(where[0].component_shape(where[1])):
                pieces.append((where[0].name, where[0].component_span(where[1])[0], engine_bits(where[1], tensor)))
        return tensors, digest_pieces(pieces, threads=threads)

    actual = ZERO
    with ThreadPoolExecutor(max_workers=streams, thread_name_prefix="aurora-snapshot") as pool:
        for tensors, share in pool.map(fetch, manifest.files):
            state.update(tensors)
            actual = actual + share
    if verify_digest:
        files_layout.check_state(state)
        if str(actual) != manifest.weights_digest:
            raise DigestMismatchError(f"snapshot {version} tensors hash to {actual}, manifest says "
                                      f"{manifest.weights_digest}")
    if files_layout is not layout:
        state = convert(state, files_layout, layout)
    return state, manifest


def _atomic_write(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
