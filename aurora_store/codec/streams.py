"""A chunk's index and value streams decoded by the compiled kernels, with every check of the reference.

:func:`.leb128.decode` and :func:`.values.decode_values` define the format (numpy, several passes each);
staging decodes with :func:`chunk_indices` and :func:`apply_values` instead: two compiled sweeps per stream,
the value sweep also summing the chunk's digest move. A corrupt stream raises the same
:class:`~aurora_store.errors.CorruptSegmentError`, with the same message, as the reference path
(``tests/codec/test_streams.py`` holds them to that on valid and corrupt input).
"""

from __future__ import annotations

import numpy as np

from aurora_store.codec import kernels
from aurora_store.codec.digest import ZERO, WeightsDigest, hash_change, tensor_seeds
from aurora_store.codec.segment import ValueTransform
from aurora_store.codec.values import decode_values
from aurora_store.errors import CorruptSegmentError


def chunk_indices(tensor: str, raw: bytes | memoryview | np.ndarray, count: int, lo: int, hi: int) -> np.ndarray:
    """The int64 flat indices ``lo + cumsum(gaps)`` of a chunk ``[lo, hi)`` of ``tensor`` from its raw
    planar-LEB128 gap stream of ``count`` values, checked as :func:`.leb128.decode` and the decoder check
    them: the exact stream length, no value over 9 bytes, strictly increasing, inside ``[lo, hi)``."""
    if count < 0:
        raise CorruptSegmentError("negative value count")
    if not 0 <= lo <= hi < 1 << 63:  # the caller has bounded the range by its tensor's size
        raise ValueError(f"chunk range [{lo}, {hi}) is not within int64")
    stream = raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
    indices, status = kernels.gap_indices(stream, count, lo, hi - lo)
    if status == kernels.LEB_OK:
        return indices
    if status == kernels.LEB_SHORT:
        raise CorruptSegmentError(f"LEB128 stream of {stream.size} bytes cannot hold {count} values")
    if status == kernels.LEB_OVERLONG:
        raise CorruptSegmentError("LEB128 value longer than 9 bytes")
    if status == kernels.LEB_TRUNCATED:
        raise CorruptSegmentError("LEB128 stream is truncated inside a value")
    if status == kernels.LEB_LEFTOVER:
        # The reference reports how many bytes follow the last level: recount them for the same message.
        raise CorruptSegmentError(f"{stream.size - _levels_end(stream, count)} bytes left over after {count} "
                                  "LEB128 values")
    if status == kernels.LEB_NOT_INCREASING:
        raise CorruptSegmentError(f"chunk {tensor}: indices are not strictly increasing")
    raise CorruptSegmentError(f"chunk {tensor}: index out of range")


def apply_values(tensor: str, indices: np.ndarray, old: np.ndarray, raw: bytes | memoryview,
                 transform: ValueTransform, out: np.ndarray) -> WeightsDigest:
    """Decode a chunk's value stream against the ``old`` int16 bits at flat ``indices`` of ``tensor`` into
    ``out`` (int16, the same length), and return the digest move of writing them. Raises as
    :func:`.values.decode_values` does; ``out`` is then partly written, nothing else."""
    if transform != ValueTransform.DELTA16:
        new = decode_values(old, raw, old.size, transform)
        out[:] = new
        return hash_change(tensor, indices, old, new) if old.size else ZERO
    if not indices.size == old.size == out.size:  # the kernel does not check bounds
        raise ValueError("indices, old and out must have the same size")
    stream = np.frombuffer(raw, dtype=np.uint8)
    s0, s1 = tensor_seeds(tensor)
    status, lane0, lane1 = kernels.delta16_apply(indices, old, stream, out, s0, s1)
    if status == kernels.VAL_OK:
        return WeightsDigest((int(lane0), int(lane1)))
    if status == kernels.VAL_LENGTH:
        raise CorruptSegmentError(f"value stream of {stream.size} bytes does not match its class table")
    raise CorruptSegmentError(_VALUE_ERRORS[status])


_VALUE_ERRORS = {
    kernels.VAL_SHORT: "value stream is shorter than its class table",
    kernels.VAL_CLASS_PADDING: "non-zero padding in the value class table",
    kernels.VAL_SIDE_PADDING: "non-zero padding in the value side stream",
    kernels.VAL_ESCAPE: "escaped value word is zero or should have used a short class",
}


def _levels_end(stream: np.ndarray, count: int) -> int:
    """Where the last level of ``count`` planar LEB128 values ends (the stream is known to be well formed up
    to there)."""
    start, size = 0, count
    while size:
        size, start = int(np.count_nonzero(stream[start: start + size] & 0x80)), start + size
    return start
