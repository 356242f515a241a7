"""Additive multiset digest of full weights, updatable in O(changed elements).

``weights_digest(W) = Σ_{(tensor, i)} h(tensor, i, bits_i)`` over every element of every inference
tensor, computed lane-wise modulo 2**64 with two independent 64-bit lanes (128 bits). Because the sum is
over a multiset, a delta moves the digest by ``Σ h(t, i, new) − h(t, i, old)`` over the changed elements
only, and the result equals a from-scratch computation exactly.

``h`` is the MurmurHash3 64-bit finaliser (a bijection) applied to ``(i << 16 | bits) XOR seed(tensor,
lane)``. It detects accidental divergence (a wrong or missing update changes the digest except with
probability ~2**-128); it is *not* a cryptographic commitment against an adversary — that role belongs to
the SHA-256 segment names and the signed manifest.

On the host the sums run in the compiled kernels of :mod:`.kernels` (one read of each element, blocks
spread over threads); on an accelerator, with torch ops (``lanes_on_device``). Both give the same bits.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping

import numpy as np
import torch

from aurora_store.codec import kernels

# the value type lives in its own module (no numpy or torch for those who only pass digests along)
from aurora_store.codec.weights_digest import ALGORITHM as ALGORITHM
from aurora_store.codec.weights_digest import LANES, ZERO, WeightsDigest

_MASK = (1 << 64) - 1
_K1 = np.uint64(0xFF51AFD7ED558CCD)
_K2 = np.uint64(0xC4CEB9FE1A85EC53)


@functools.lru_cache(maxsize=1 << 14)  # asked once per chunk while staging: a model has at most a few thousand names
def _seeds(tensor_name: str) -> tuple[np.uint64, np.uint64]:
    raw = hashlib.sha256(tensor_name.encode()).digest()
    return np.uint64(int.from_bytes(raw[:8], "little")), np.uint64(int.from_bytes(raw[8:16], "little"))


def tensor_seeds(tensor_name: str) -> tuple[np.uint64, np.uint64]:
    """The two lanes' seeds of ``tensor_name`` (for kernels that fold the digest into another sweep)."""
    return _seeds(tensor_name)


def _host_bits(bits: torch.Tensor | np.ndarray) -> np.ndarray:
    """Contiguous int16 bit patterns on the host (int16 or uint16 input: the same 16 bits)."""
    arr = bits.numpy() if isinstance(bits, torch.Tensor) else np.asarray(bits)
    if arr.dtype.itemsize != 2 or arr.dtype.kind not in "iu":
        raise TypeError(f"bit patterns must be 16-bit integers, got {arr.dtype}")
    return np.ascontiguousarray(arr.reshape(-1)).view(np.int16)


def _host_indices(indices: torch.Tensor | np.ndarray) -> np.ndarray:
    arr = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got {arr.dtype}")
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)


def _lanes(pairs: Iterable[tuple[int, int]]) -> WeightsDigest:
    s0 = s1 = 0
    for a, b in pairs:
        s0, s1 = s0 + int(a), s1 + int(b)
    return WeightsDigest((s0 & _MASK, s1 & _MASK))


def hash_elements(tensor_name: str, indices: torch.Tensor | np.ndarray,
                  bits: torch.Tensor | np.ndarray, *, threads: int | None = None) -> WeightsDigest:
    """Σ h(tensor_name, index, bits) over the given elements (flat indices in the inference layout).
    Tensors that live on an accelerator are hashed there (:func:`lanes_on_device`); only the sum returns."""
    if _off_host(indices) or _off_host(bits):
        return _to_digest(lanes_on_device(tensor_name, torch.as_tensor(indices), torch.as_tensor(bits)))
    if tuple(np.shape(indices)) != tuple(np.shape(bits)):
        raise ValueError("indices and bits must have the same shape")
    idx, val = _host_indices(indices), _host_bits(bits)
    s0, s1 = _seeds(tensor_name)
    return _lanes(kernels.run_blocks(
        lambda lo, hi: kernels.element_lanes(idx[lo:hi], val[lo:hi], s0, s1), kernels.split(val.size), threads))


def hash_change(tensor_name: str, indices: torch.Tensor | np.ndarray, old: torch.Tensor | np.ndarray,
                new: torch.Tensor | np.ndarray, *, offset: int = 0) -> WeightsDigest:
    """The digest move of changing ``old`` to ``new`` bits at flat indices ``offset + indices``:
    ``hash_elements(new) − hash_elements(old)`` in one pass over the changed elements (host arrays)."""
    idx, before, after = _host_indices(indices), _host_bits(old), _host_bits(new)
    if not idx.size == before.size == after.size:
        raise ValueError("indices, old and new bits must have the same size")
    s0, s1 = _seeds(tensor_name)
    return _lanes([kernels.delta_lanes(idx, offset, before, after, s0, s1)])


def hash_range(tensor_name: str, offset: int, flat_bits: torch.Tensor | np.ndarray, *,
               threads: int | None = None) -> WeightsDigest:
    """Σ h over a contiguous run of elements starting at flat index ``offset``."""
    if _off_host(flat_bits):
        assert isinstance(flat_bits, torch.Tensor)
        return _to_digest(range_lanes_on_device(tensor_name, offset, flat_bits))
    return digest_pieces([(tensor_name, offset, flat_bits)], threads=threads)


# --- the same sums with torch ops, on whatever device the tensors live on ---------------------------
#
# torch has no full uint64 arithmetic on every device, so lanes are int64: two's-complement addition,
# multiplication and xor are the same bit operations as their uint64 counterparts mod 2**64 (torch wraps on
# overflow on CPU and CUDA), and a logical right shift is an arithmetic one with the sign-extended bits
# masked off. The result is bit-identical to the numpy path (a test compares them).

_TORCH_K1 = int(_K1) - (1 << 64)  # the same 64 bits as signed integers
_TORCH_K2 = int(_K2) - (1 << 64)
_LOW31 = (1 << 31) - 1  # what remains of a 64-bit word shifted right by 33
_DEVICE_BLOCK = 1 << 24  # elements hashed at once: bounds temporaries (~0.5 GiB of int64 at most)


def _off_host(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "cpu"


def _signed(seed: np.uint64) -> int:
    value = int(seed)
    return value - (1 << 64) if value >= 1 << 63 else value


def _fmix_lanes(keys: torch.Tensor, seeds: tuple[int, ...]) -> torch.Tensor:
    """``[Σ fmix64(keys ^ seed) mod 2**64 for seed in seeds]`` as an int64 tensor on the keys' device."""
    sums = []
    for seed in seeds:
        y = keys ^ seed
        y ^= (y >> 33) & _LOW31
        y *= _TORCH_K1
        y ^= (y >> 33) & _LOW31
        y *= _TORCH_K2
        y ^= (y >> 33) & _LOW31
        sums.append(y.sum(dtype=torch.int64))
    return torch.stack(sums)


def lanes_on_device(tensor_name: str, indices: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """:func:`hash_elements` as a ``[LANES]`` int64 tensor on ``bits``' device, computed with torch ops
    there (no host copy of the elements; summing lanes of several calls is adding digests)."""
    if indices.shape != bits.shape:
        raise ValueError("indices and bits must have the same shape")
    seeds = tuple(_signed(s) for s in _seeds(tensor_name))
    total = torch.zeros(LANES, dtype=torch.int64, device=bits.device)
    idx, val = indices.reshape(-1), bits.reshape(-1)
    for start in range(0, val.numel(), _DEVICE_BLOCK):
        i = idx[start: start + _DEVICE_BLOCK].to(device=bits.device, dtype=torch.int64)
        b = val[start: start + _DEVICE_BLOCK].view(torch.int16).to(torch.int64) & 0xFFFF
        total += _fmix_lanes((i << 16) | b, seeds)
    return total


def range_lanes_on_device(tensor_name: str, offset: int, flat_bits: torch.Tensor) -> torch.Tensor:
    """:func:`hash_range` as a ``[LANES]`` int64 tensor on ``flat_bits``' device."""
    seeds = tuple(_signed(s) for s in _seeds(tensor_name))
    total = torch.zeros(LANES, dtype=torch.int64, device=flat_bits.device)
    val = flat_bits.reshape(-1)
    for start in range(0, val.numel(), _DEVICE_BLOCK):
        b = val[start: start + _DEVICE_BLOCK].view(torch.int16).to(torch.int64) & 0xFFFF
        i = torch.arange(offset + start, offset + start + b.numel(), dtype=torch.int64, device=b.device)
        total += _fmix_lanes((i << 16) | b, seeds)
    return total


def digest_of_lanes(lanes: torch.Tensor) -> WeightsDigest:
    """The digest a ``[LANES]`` int64 tensor holds (one 16-byte copy to the host)."""
    return _to_digest(lanes)


def _to_digest(lanes: torch.Tensor) -> WeightsDigest:
    values = lanes.cpu().tolist()
    return WeightsDigest(tuple(v & _MASK for v in values))


def digest_pieces(pieces: Iterable[tuple[str, int, torch.Tensor | np.ndarray]], *,
                  threads: int | None = None) -> WeightsDigest:
    """From-scratch digest over ``(inference name, flat offset, flat int16 bits)`` pieces: host pieces are
    cut into blocks hashed by the compiled kernel on up to ``threads`` threads (default
    :data:`~aurora_store.codec.kernels.DEFAULT_THREADS`); pieces on an accelerator are hashed there."""
    total = ZERO
    tasks: list[tuple[np.ndarray, int, np.uint64, np.uint64]] = []
    for name, offset, flat_bits in pieces:
        if _off_host(flat_bits):
            assert isinstance(flat_bits, torch.Tensor)
            total = total + _to_digest(range_lanes_on_device(name, offset, flat_bits))
            continue
        bits = _host_bits(flat_bits)
        s0, s1 = _seeds(name)
        tasks.extend((bits[lo:hi], offset + lo, s0, s1) for lo, hi in kernels.split(bits.size) if hi > lo)
    return total + _lanes(kernels.run_blocks(kernels.range_lanes, tasks, threads))


def digest_state(layout, state: Mapping[str, torch.Tensor], *, threads: int | None = None) -> WeightsDigest:
    """From-scratch digest of a training-layout state dict (see :class:`ModelLayout`)."""
    return digest_pieces(((t.name, offset, bits) for t, offset, bits in layout.pieces(state)), threads=threads)


def digest_fused(layout, fused: Mapping[str, torch.Tensor], *, threads: int | None = None) -> WeightsDigest:
    """From-scratch digest of inference-layout tensors."""
    from aurora_store.codec.layout import bits_view

    return digest_pieces(((t.name, 0, bits_view(fused[t.name])[: t.numel]) for t in layout.tensors),
                         threads=threads)
