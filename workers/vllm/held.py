"""Inside each vLLM worker: stage a version's own slice from the bucket while the engine generates, hold it,
and write it in place when the client says "activate" — so nothing proportional to the delta crosses a
process boundary at the batch boundary.

The client (:class:`~workers.vllm.engine.VllmWeightTarget`) has staged and verified the version itself (manifest
signature, segment SHA-256, base digest, the digest after applying). It then sends every worker the verified
manifest and where its segments are (:class:`StageRequest`: the bucket URL it staged from, its relay cache).
Each worker, on a background thread of its own (its main thread keeps generating):

* fetches the segments (relay cache first, then the bucket; each checked against its SHA-256),
* decodes every chunk, keeps the elements its TP rank holds (:mod:`workers.vllm.shards`), reads their old bits
  from its own parameters and decodes their new bits,
* hashes its share of the change (the elements it owns, as in :func:`~workers.vllm.worker.digest_local`), and
* holds int32 local indices and int16 bits on the weights' device, bounds checked there (:class:`HeldSlice`).

The client sums the shares: the workers' slices together must move the digest exactly as the manifest says,
and together cover exactly the manifest's changed elements. At the boundary it sends only the version and its
base; a worker writes its held slice (:func:`write_slice`) only if it holds that version, staged on exactly
the weights it has now (no write since: :attr:`HeldStager.generation`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aurora_store.codec.decoder import DecodedChunk, decode_segment
from aurora_store.codec.digest import ZERO, WeightsDigest, hash_change
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.codec.values import decode_values
from aurora_store.errors import AuroraError, BaseVersionMismatchError, CorruptSegmentError, LayoutError, MessageError
from workers.vllm.shards import Shard

#: A parameter's storage as flat int16 bits, by inference-tensor name, looked up afresh at every call and
#: checked against its shard (:func:`workers.vllm.worker.flat_bits`).
FlatBits = Callable[[str], torch.Tensor]
log = logging.getLogger("aurora.vllm.held")


@dataclass(frozen=True)
class StageRequest:
    """What a worker needs to stage a version the client verified: the manifest, the bucket it was staged
    from, the relay cache to try first (``(url, token)``, or none), and the base the client staged it on."""

    manifest: DeltaManifest
    bucket: str
    cache: tuple[str, str] | None = None

    def to_wire(self) -> list[Any]:
        return [self.manifest.to_bytes(), self.bucket, list(self.cache) if self.cache else None]

    @classmethod
    def from_wire(cls, wire: object) -> StageRequest:
        if not isinstance(wire, list | tuple) or len(wire) != 3:
            raise MessageError("a stage request is [manifest bytes, bucket URL, cache or None]")
        data, bucket, cache = wire
        if not isinstance(data, bytes) or not isinstance(bucket, str):
            raise MessageError("a stage request carries the manifest's bytes and a bucket URL")
        if cache is not None and not (isinstance(cache, list | tuple) and len(cache) == 2
                                      and all(isinstance(c, str) for c in cache)):
            raise MessageError("a stage request's cache is [url, token]")
        return cls(DeltaManifest.from_bytes(data), bucket, (cache[0], cache[1]) if cache else None)


@dataclass(frozen=True)
class HeldSlice:
    """One TP rank's part of a staged version, ready to write: per tensor, int32 indices into this rank's
    flat parameter and the new int16 bits, both on the weights' device."""

    version: int
    base_version: int
    weights_digest: str
    generation: int  # the worker's write count when the old bits were read
    writes: tuple[tuple[str, torch.Tensor, torch.Tensor], ...]
    held: int  # elements this rank writes (replicated tensors: on every rank)
    owned: int  # elements counted towards the digest (each changed element on exactly one rank)
    share: WeightsDigest  # the digest move of the owned elements
    stage_s: float = 0.0

    def summary(self) -> list[Any]:
        """What the client checks: ``[version, held, owned, digest share, seconds]``."""
        return [self.version, self.held, self.owned, str(self.share), round(self.stage_s, 6)]


def stage_slice(layout: ModelLayout, shards: Mapping[str, Shard], flat_bits: FlatBits, manifest: DeltaManifest,
                segments: Iterable[tuple[SegmentRef, bytes]], *, generation: int = 0) -> HeldSlice:
    """Decode ``manifest``'s segments (each checked against its SHA-256 and its manifest entry) into this
    rank's :class:`HeldSlice`, reading old bits through ``flat_bits`` (nothing is written)."""
    started = time.perf_counter()
    if manifest.layout_fingerprint != layout.fingerprint:
        raise LayoutError(f"version {manifest.version} is for layout {manifest.layout_fingerprint}, the engine "
                          f"has {layout.fingerprint}")
    wanted = {ref.digest: ref for ref in manifest.segments}
    chunks: dict[str, list[DecodedChunk]] = {}
    seen: set[str] = set()
    for ref, data in segments:
        if ref.digest not in wanted or ref.digest in seen:
            continue
        seen.add(ref.digest)
        for chunk in decode_segment(layout, manifest.codec, wanted[ref.digest], data):
            chunks.setdefault(chunk.tensor, []).append(chunk)
    if len(seen) != len(wanted):
        raise CorruptSegmentError(f"{len(wanted) - len(seen)} segment(s) of version {manifest.version} missing")
    transform = manifest.codec.value_transform
    writes = []
    held = owned = 0
    share = ZERO
    for name in sorted(chunks, key=layout.names.index):
        parts = sorted(chunks[name], key=lambda c: c.header.lo)
        for before, after in itertools.pairwise(parts):
            if after.header.lo < before.header.hi:
                raise CorruptSegmentError(f"chunks of {name} overlap")
        if sum(c.header.count for c in parts) != manifest.changed.get(name, 0):
            raise CorruptSegmentError(f"{name}: decoded changes differ from the manifest's count")
        shard = shards[layout[name].name]
        flat = flat_bits(name)
        locals_, news = [], []
        for chunk in parts:
            positions, local = shard.select(chunk.indices)
            if not local.numel():
                continue
            old = flat.index_select(0, local.to(flat.device)).cpu().numpy()
            # The value stream decodes element by element given each element's old bits: elements of other
            # ranks get placeholder zeros and are dropped.
            base = np.zeros(chunk.header.count, dtype=np.int16)
            where = slice(None) if positions is None else positions.numpy()
            base[where] = old
            new = decode_values(base, chunk.values, chunk.header.count, transform)[where]
            if shard.owner:
                mine = chunk.indices if positions is None else chunk.indices[positions]
                share = share + hash_change(name, mine, old, new)
                owned += int(local.numel())
            locals_.append(local)
            news.append(torch.from_numpy(np.ascontiguousarray(new)))
        if not locals_:
            continue
        local = torch.cat(locals_).to(flat.device)
        lo, hi = torch.aminmax(local)  # on the weights' device: only two numbers come back
        if int(lo) < 0 or int(hi) >= shard.local_numel:
            raise LayoutError(f"{name}: flat index out of range [0, {shard.local_numel})")
        writes.append((name, local.to(torch.int32), torch.cat(news).to(flat.device)))
        held += int(local.numel())
    return HeldSlice(manifest.version, manifest.base_version, manifest.weights_digest, generation, tuple(writes),
                     held, owned, share, time.perf_counter() - started)


def write_slice(flat_bits: FlatBits, held: HeldSlice) -> tuple[int, float]:
    """Write a held slice in place: ``(elements written, seconds of the scatter calls alone)``. Its indices
    were bounds-checked against each parameter's size when staged, and every parameter is checked to still
    have that size before the first write."""
    plan = [(flat_bits(name), local, bits) for name, local, bits in held.writes]
    t0 = time.perf_counter()
    with torch.no_grad():
        for flat, local, bits in plan:
            # index_put_ with the int32 indices as held (unique: a bijection of the manifest's strictly
            # increasing ones), on the weights' device: no widening, no copy, no host round trip.
            flat.index_put_((local,), bits)
        if plan and plan[0][0].device.type == "cuda":
            torch.cuda.synchronize(plan[0][0].device)
    return held.held, time.perf_counter() - t0


class HeldStager:
    """One worker's staging: at most one version staging (on a background thread) or held at a time.

    ``generation`` counts writes to the worker's weights; every writer bumps it before writing (:meth:`wrote`),
    so a slice whose old bits were read before a write — or while one was in progress — is never written."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.generation = 0
        self._thread: threading.Thread | None = None
        self._result: HeldSlice | BaseException | None = None
        self._version: int | None = None
        self._stores: dict[str, Any] = {}

    def wrote(self) -> None:
        with self._lock:
            self.generation += 1
            if isinstance(self._result, HeldSlice):  # staged on weights that are gone
                self._result = BaseVersionMismatchError(f"the weights were written after version "
                                                        f"{self._result.version} staged")

    def start(self, request: StageRequest, layout: ModelLayout, shards: Mapping[str, Shard],
              flat_bits: FlatBits) -> None:
        """Stage ``request`` in the background (a staging or held version before it is dropped)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise MessageError(f"version {self._version} is still staging in this worker")
            self._result, self._version = None, request.manifest.version
            generation = self.generation
            thread = threading.Thread(target=self._run, args=(request, layout, shards, flat_bits, generation),
                                      name="aurora-held-stage", daemon=True)
            self._thread = thread
        thread.start()

    def _run(self, request: StageRequest, layout: ModelLayout, shards: Mapping[str, Shard], flat_bits: FlatBits,
             generation: int) -> None:
        try:
            result: HeldSlice | BaseException = stage_slice(layout, shards, flat_bits, request.manifest,
                                                            self._fetch(request), generation=generation)
        except BaseException as exc:  # handed to the client by poll()
            log.warning("staging version %d in the worker failed: %s", request.manifest.version, exc)
            result = exc
        with self._lock:
            if isinstance(result, HeldSlice) and result.generation != self.generation:
                result = BaseVersionMismatchError(f"the weights were written while version {result.version} staged")
            self._result = result

    def _fetch(self, request: StageRequest) -> Iterable[tuple[SegmentRef, bytes]]:
        from aurora_store.follow.cache import RelayCache
        from aurora_store.follow.sources import SegmentReader, SegmentSource
        from aurora_store.metrics import Metrics
        from aurora_store.store import DeltaStore, open_bucket
        from aurora_store.store.transfer import fetch_segments

        store = self._stores.get(request.bucket)
        if store is None:
            store = self._stores[request.bucket] = DeltaStore(open_bucket(request.bucket))
        sources: tuple[SegmentSource, ...] = ()
        if request.cache is not None:
            sources = (RelayCache(request.cache[0], request.cache[1], Metrics("vllm_worker", "")),)
        reader = SegmentReader(lambda _store: sources)
        return fetch_segments(store, request.manifest.segments, read=lambda ref: reader.read(store, ref))

    def poll(self, version: int) -> list[Any] | None:
        """``None`` while ``version`` stages; its summary once held; raises what its staging raised."""
        with self._lock:
            if self._version != version:
                raise MessageError(f"this worker is not staging version {version}")
            result = self._result
        if result is None:
            return None
        if isinstance(result, BaseException):
            raise result if isinstance(result, AuroraError) else AuroraError(f"staging failed: {result!r}")
        return result.summary()

    def take(self, version: int, base_version: int) -> HeldSlice:
        """The held slice of ``version`` staged on ``base_version`` with no write since; it is dropped."""
        with self._lock:
            result = self._result
            if not isinstance(result, HeldSlice) or result.version != version or result.base_version != base_version:
                raise BaseVersionMismatchError(f"this worker holds no version {version} staged on {base_version}")
            if result.generation != self.generation:
                raise BaseVersionMismatchError(f"version {version} was staged on weights written since")
            self._result, self._version = None, None
            self.generation += 1  # the caller writes it now
            return result

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()
