"""What crosses the boundary between our engine client and vLLM's worker: names and encodings.

vLLM's msgpack transport rebuilds tensors only for typed fields, and ``collective_rpc``'s ``args`` are
untyped, so tensors would arrive as opaque lists; everything therefore crosses the process boundary as plain
``bytes`` (little-endian int32/int64 indices, int16 bit patterns), strings and lists. The same encoding
carries a push update (``update_weights({"update_info": {"scatter": ...}})``) to the ``aurora`` backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.target import check_indices, check_values
from aurora_store.codec.weights_digest import ZERO, WeightsDigest
from aurora_store.errors import LayoutError

#: The ``aurora`` weight-transfer backend's name (``weight_transfer_config={"backend": "aurora"}``).
BACKEND_NAME = "aurora"
#: The worker extension's import path (``worker_extension_cls``).
EXTENSION_PATH = "workers.vllm.worker.AuroraWorkerExtension"

#: Worker-extension methods reached through ``collective_rpc`` (prefixed so they cannot clash with vLLM's).
RPC_ATTACH = "aurora_attach"
RPC_GATHER = "aurora_gather"
RPC_DIGEST = "aurora_digest"
RPC_READ = "aurora_read"
RPC_PARAMETERS = "aurora_parameters"
RPC_STAGE = "aurora_stage"  # start staging a verified version in every worker (workers.vllm.held)
RPC_STAGED = "aurora_staged"  # poll: each worker's summary once it holds its slice
RPC_ACTIVATE = "aurora_activate"  # the batch boundary: write the held version (version and base only)
# the version and digest the weights are at, checked by the caller (a bootstrap verified them from scratch)
RPC_DECLARE = "aurora_declare"

#: One tensor's write on the wire: ``[name, index kind, index bytes, bits bytes]``.
WireUpdate = list[Any]


def payload_bytes(value: object) -> int:
    """Bytes an RPC's arguments carry, counted the way msgpack lays them out (within a few bytes per item):
    the length of every ``bytes`` and string, 8 per number, summed through lists, tuples and dicts."""
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list | tuple):
        return sum(payload_bytes(item) for item in value)
    if isinstance(value, dict):
        return sum(payload_bytes(k) + payload_bytes(v) for k, v in value.items())
    return 8


def pack_indices(indices: torch.Tensor) -> tuple[str, bytes]:
    """Sorted int64 flat indices as bytes; int32 when they fit (6 instead of 10 bytes per changed element)."""
    last = int(indices[-1]) if indices.numel() else 0
    if last < 2**31:
        return "i4", indices.to(torch.int32).numpy().tobytes()
    return "i8", indices.to(torch.int64).numpy().tobytes()


_INDEX_DTYPES = {"i4": np.int32, "i8": np.int64}


def unpack_indices(kind: str, data: bytes) -> torch.Tensor:
    dtype = _INDEX_DTYPES.get(kind) if isinstance(kind, str) else None
    if dtype is None:
        raise LayoutError(f"unknown index encoding {kind!r:.40}")
    if not isinstance(data, bytes) or len(data) % np.dtype(dtype).itemsize:
        raise LayoutError(f"index bytes must be a whole number of {kind} values")
    return torch.from_numpy(np.frombuffer(data, dtype=dtype).astype(np.int64))


def unpack_bits(data: bytes) -> torch.Tensor:
    if not isinstance(data, bytes) or len(data) % 2:
        raise LayoutError("value bytes must be a whole number of int16 bit patterns")
    return torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy())


def pack_updates(updates: Iterable[tuple[str, torch.Tensor, torch.Tensor]]) -> list[WireUpdate]:
    """``(name, sorted flat indices, int16 bits)`` writes in wire form."""
    return [[name, *pack_indices(indices), bits.numpy().tobytes()] for name, indices, bits in updates]


def unpack_updates(wire: object) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Wire writes back as ``(name, flat indices, int16 bits)``; :class:`~aurora_store.errors.LayoutError` for
    anything not shaped like :func:`pack_updates`' output (it may come from outside the process)."""
    if not isinstance(wire, list | tuple):
        raise LayoutError(f"a scatter is a list of [name, index kind, index bytes, bits bytes], not "
                          f"{type(wire).__name__}")
    out = []
    for entry in wire:
        if not isinstance(entry, list | tuple) or len(entry) != 4 or not isinstance(entry[0], str):
            raise LayoutError(f"a scatter entry is [name, index kind, index bytes, bits bytes], not {entry!r:.80}")
        name, kind, data, bits = entry
        out.append((name, unpack_indices(kind, data), unpack_bits(bits)))
    return out


def check_updates(layout: ModelLayout, updates: Sequence[tuple[str, torch.Tensor, torch.Tensor]]
                  ) -> Sequence[tuple[str, torch.Tensor, torch.Tensor]]:
    """Refuse (:class:`~aurora_store.errors.LayoutError`) an update that is not wholly writable: a name
    outside the layout or named twice, a count of values unlike the count of indices, indices not strictly
    increasing (a repeated index would make the written value depend on write order) or outside the tensor.
    Checked before anything is written; returns ``updates``."""
    seen: set[str] = set()
    for name, indices, bits in updates:
        if name in seen:
            raise LayoutError(f"{name}: named twice in one update")
        seen.add(name)
        check_indices(layout, name, indices)
        check_values(name, indices, bits)
        if indices.numel() > 1 and not bool((indices[1:] > indices[:-1]).all()):
            raise LayoutError(f"{name}: flat indices must be strictly increasing")
    return updates


def merge_gathered(count: int, replies: Iterable[list[bytes | None]]) -> torch.Tensor:
    """Assemble one request's ``[positions, bits]`` replies from every rank into ``count`` bit patterns."""
    out = torch.empty(count, dtype=torch.int16)
    for positions, data in replies:
        bits = unpack_bits(data or b"")
        if positions is None:
            out.copy_(bits)
        elif bits.numel():
            out[torch.from_numpy(np.frombuffer(positions, dtype=np.int64).copy())] = bits
    return out


def sum_digests(replies: Iterable[str]) -> WeightsDigest:
    """The engine's weights digest from every rank's share."""
    total = ZERO
    for reply in replies:
        total = total + WeightsDigest.parse(reply)
    return total
