"""Baselines at the machine's limit, measured in the same run as the paths they judge.

Every ratio a benchmark reports divides by one of these, on the same bytes, with the thread count printed
beside it:

* ``numpy_scan_s`` — ``numpy.flatnonzero(a != b)`` over the int16 views of both versions (one thread);
* ``torch_scan_s`` — the ``torch.ne(a, b).nonzero()`` scan the older ratios divided by (kept, named as such);
* ``sha256_s`` — SHA-256 of the same bytes (one thread, OpenSSL);
* ``read_s`` — a streaming read of the arrays (xor of their 64-bit words, compiled): memory bandwidth;
* ``scatter_s`` — a bare ``index_put_`` of the same indices and values into the same tensors;
* :func:`raw_put_get` — boto3 PUT / GET of the same bytes, in 256 MiB objects over the same streams, against
  the same server.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
import numpy as np
import torch

from aurora_store.codec.layout import ModelLayout

RAW_OBJECT_BYTES = 256 << 20


def _np(a: torch.Tensor | np.ndarray) -> np.ndarray:
    return a.numpy() if isinstance(a, torch.Tensor) else a


def numpy_scan_s(pairs: Sequence[tuple[Any, Any]], block: int | None = None, *, threads: int = 1) -> float:
    """``flatnonzero(a != b)`` over each flat int16 pair, in blocks of ``block`` elements (as the publish path
    compares, where a whole-tensor mask would not fit the memory budget), on ``threads`` threads (numpy
    releases the GIL in both passes)."""
    arrays = [(_np(a), _np(b)) for a, b in pairs]
    blocks = []
    for a, b in arrays:
        step = block or max(a.size, 1)
        blocks.extend((a[lo: lo + step], b[lo: lo + step]) for lo in range(0, a.size, step))

    def scan(ab: tuple[np.ndarray, np.ndarray]) -> None:
        np.flatnonzero(ab[0] != ab[1])

    t0 = time.perf_counter()
    if threads == 1:
        for ab in blocks:
            scan(ab)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(scan, blocks))
    return time.perf_counter() - t0


def torch_scan_s(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], block: int | None = None) -> float:
    """The older baseline: ``torch.ne(a, b).nonzero()``."""
    t0 = time.perf_counter()
    for a, b in pairs:
        step = block or max(a.numel(), 1)
        for lo in range(0, a.numel(), step):
            torch.ne(a[lo: lo + step], b[lo: lo + step]).nonzero()
    return time.perf_counter() - t0


def sha256_s(arrays: Iterable[Any]) -> float:
    """SHA-256 of the arrays' bytes, one hasher fed in order."""
    views = [memoryview(np.ascontiguousarray(_np(a))).cast("B") for a in arrays]
    t0 = time.perf_counter()
    h = hashlib.sha256()
    for view in views:
        h.update(view)
    h.hexdigest()
    return time.perf_counter() - t0


@numba.njit(nogil=True, cache=True)
def _xor_words(words):  # pragma: no cover - compiled
    acc = np.uint64(0)
    for i in range(words.size):
        acc ^= words[i]
    return acc


def read_s(arrays: Iterable[Any]) -> float:
    """One streaming read of every array (their whole 64-bit words; a tail of < 8 bytes is skipped)."""
    words = []
    for a in arrays:
        raw = np.ascontiguousarray(_np(a)).reshape(-1).view(np.uint8)
        words.append(raw[: raw.size // 8 * 8].view(np.uint64))
    _xor_words(np.zeros(1, dtype=np.uint64))  # compiled before the clock starts
    t0 = time.perf_counter()
    for w in words:
        _xor_words(w)
    return time.perf_counter() - t0


def scatter_jobs(layout: ModelLayout, weights: dict[str, torch.Tensor],
                 updates: Iterable[Any]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(storage, local indices, bits)`` per training tensor: the same writes as an activation, already cut at
    the q/k/v and gate/up boundaries, so timing them is the floor — one ``scatter_`` per tensor."""
    jobs = []
    for update in updates:
        tensor = layout[update.tensor]
        for comp in tensor.components:
            lo, hi = tensor.component_span(comp)
            a, b = torch.searchsorted(update.indices, torch.tensor([lo, hi])).tolist()
            if b > a:
                storage = weights[comp.train_name].view(torch.int16).view(-1)
                jobs.append((storage, update.indices[a:b] - lo, update.bits[a:b].clone()))
    return jobs


def scatter_s(jobs: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], repeats: int = 3) -> float:
    """Best of ``repeats`` bare ``index_put_`` passes of ``(flat storage, indices, values)`` jobs (idempotent:
    the same values land every time)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for storage, idx, values in jobs:
            storage.index_put_((idx,), values)
        best = min(best, time.perf_counter() - t0)
    return best


def raw_put_get(client: Any, bucket: str, blobs: Sequence[Any], *, streams: int,
                prefix: str = "raw-baseline/") -> dict[str, float]:
    """PUT then GET the bytes of ``blobs`` through boto3 as :data:`RAW_OBJECT_BYTES` objects over ``streams``
    threads; the objects are deleted afterwards. Returns ``raw_put_s``, ``raw_get_s`` and ``raw_bytes``."""
    parts: list[memoryview] = []
    for blob in blobs:
        view = memoryview(np.ascontiguousarray(_np(blob)).reshape(-1).view(np.uint8)) \
            if not isinstance(blob, (bytes, bytearray, memoryview)) else memoryview(blob).cast("B")
        parts.extend(view[lo: lo + RAW_OBJECT_BYTES] for lo in range(0, len(view), RAW_OBJECT_BYTES))
    keys = [f"{prefix}{k:05d}" for k in range(len(parts))]
    with ThreadPoolExecutor(max_workers=streams) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1].tobytes()),
                      zip(keys, parts)))
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(pool.map(lambda key: client.get_object(Bucket=bucket, Key=key)["Body"].read(), keys))
        get_s = time.perf_counter() - t0
        list(pool.map(lambda key: client.delete_object(Bucket=bucket, Key=key), keys))
    return {"raw_put_s": put_s, "raw_get_s": get_s, "raw_bytes": float(sum(len(p) for p in parts)),
            "raw_object_bytes": float(RAW_OBJECT_BYTES), "raw_streams": float(streams)}
