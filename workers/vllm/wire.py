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

from aurora_store.codec.digest import ZERO, WeightsDigest
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

#: One tensor's write on the wire: ``[name, index kind, index bytes, bits bytes]``.
WireUpdate = list[Any]


def pack_indices(indices: torch.Tensor) -> tuple[str, bytes]:
    """Sorted int64 flat indices as bytes; int32 when they fit (6 instead of 10 bytes per changed element)."""
    last = int(indices[-1]) if indices.numel() else 0
    if last < 2**31:
        return "i4", indices.to(torch.int32).numpy().tobytes()
    return "i8", indices.to(torch.int64).numpy().tobytes()


def unpack_indices(kind: str, data: bytes) -> torch.Tensor:
    dtype = {"i4": np.int32, "i8": np.int64}.get(kind)
    if dtype is None:
        raise LayoutError(f"unknown index encoding {kind!r}")
    return torch.from_numpy(np.frombuffer(data, dtype=dtype).astype(np.int64))


def unpack_bits(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy())


def pack_updates(updates: Iterable[tuple[str, torch.Tensor, torch.Tensor]]) -> list[WireUpdate]:
    """``(name, sorted flat indices, int16 bits)`` writes in wire form."""
    return [[name, *pack_indices(indices), bits.numpy().tobytes()] for name, indices, bits in updates]


def unpack_updates(wire: Sequence[WireUpdate]) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [(name, unpack_indices(kind, data), unpack_bits(bits)) for name, kind, data, bits in wire]


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
