"""Vectorised unsigned LEB128 varints in *level-major* ("planar") byte order.

Each value is written as 7-bit groups, least significant first, with the high bit of a byte set when
more bytes follow (198 → ``C6 01``) — standard unsigned LEB128. The bytes of all values are then grouped
by level: first byte 0 of every value, then byte 1 of the values that have one, and so on. Grouping is a
pure permutation of the LEB128 bytes, fully determined by the continuation bits, and it keeps bytes with
the same statistics together so the optional entropy stage compresses them better (≈5 % smaller indices
on Adam-step deltas).

Encoding and decoding are a handful of array passes per level — no Python loop per element. Values are
limited to 63 bits (at most 9 bytes), which bounds the work and rejects overlong input.
"""

from __future__ import annotations

import numpy as np

from aurora_store.errors import CorruptSegmentError

MAX_BYTES = 9  # 9 × 7 = 63 bits
_SEVEN = np.uint64(7)
_LOW7 = np.uint64(0x7F)


def encode(values: np.ndarray) -> bytes:
    """Encode non-negative integers (< 2**63) as planar unsigned LEB128."""
    values = _as_u64(values)
    if values.size == 0:
        return b""
    if int(values.max()) >= 1 << 63:
        raise ValueError("LEB128 values must be < 2**63")
    levels = []
    remaining = values
    for _ in range(MAX_BYTES):
        rest = remaining >> _SEVEN
        more = rest != 0
        byte = (remaining & _LOW7).astype(np.uint8)
        byte[more] |= 0x80
        levels.append(byte)
        remaining = rest[more]
        if remaining.size == 0:
            break
    return b"".join(level.tobytes() for level in levels)


def decode(data: bytes | memoryview | np.ndarray, count: int) -> np.ndarray:
    """Decode exactly ``count`` planar LEB128 values into uint64.

    Raises :class:`CorruptSegmentError` if the stream is too short or too long for ``count`` values, or a
    value continues past 9 bytes.
    """
    raw = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    if count < 0:
        raise CorruptSegmentError("negative value count")
    if raw.size < count:
        raise CorruptSegmentError(f"LEB128 stream of {raw.size} bytes cannot hold {count} values")
    level = raw[:count]
    values = (level & 0x7F).astype(np.uint64)
    pos = count
    # ``owners`` are the positions (in ``values``) of the values that continue into the next level.
    owners = np.flatnonzero(level & 0x80)
    shift = 7
    while owners.size:
        if shift >= 7 * MAX_BYTES:
            raise CorruptSegmentError("LEB128 value longer than 9 bytes")
        if pos + owners.size > raw.size:
            raise CorruptSegmentError("LEB128 stream is truncated inside a value")
        level = raw[pos: pos + owners.size]
        pos += owners.size
        values[owners] |= (level & 0x7F).astype(np.uint64) << np.uint64(shift)
        owners = owners[(level & 0x80) != 0]
        shift += 7
    if pos != raw.size:
        raise CorruptSegmentError(f"{raw.size - pos} bytes left over after {count} LEB128 values")
    return values


def _as_u64(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.dtype.kind == "i":
        if values.size and int(values.min()) < 0:
            raise ValueError("LEB128 values must be non-negative")
        return values.astype(np.uint64, copy=False)
    if values.dtype.kind == "u":
        return values.astype(np.uint64, copy=False)
    raise TypeError(f"LEB128 needs an integer array, got {values.dtype}")
