"""A chunk's index and value streams decoded by the compiled kernels, with every check of the reference.

:func:`.leb128.decode` and :func:`.values.decode_values` define the format (numpy, several passes each);
staging decodes with :func:`chunk_indices` and :func:`apply_values` instead: two compiled sweeps per stream,
the value sweep also summing the chunk's digest move (against a target in host memory,
:func:`chunk_indices_into` and :func:`apply_values_in_place`: into the tensor's own arrays, the old bits
read from the weights in the same sweep). A corrupt stream raises the same
:class:`~aurora_store.errors.CorruptSegmentError`, with the same message, as the reference path
(``tests/codec/test_streams.py`` holds them to that on valid and corrupt input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import numpy as np

from aurora_store.codec import kernels
from aurora_store.codec.digest import ZERO, WeightsDigest, hash_change, tensor_seeds
from aurora_store.codec.segment import ValueTransform
from aurora_store.codec.values import decode_values
from aurora_store.errors import CorruptSegmentError

if TYPE_CHECKING:
    from aurora_store.codec.target import HostStorage


def chunk_indices(tensor: str, raw: bytes | memoryview | np.ndarray, count: int, lo: int, hi: int) -> np.ndarray:
    """The int64 flat indices ``lo + cumsum(gaps)`` of a chunk ``[lo, hi)`` of ``tensor`` from its raw
    planar-LEB128 gap stream of ``count`` values, checked as :func:`.leb128.decode` and the decoder check
    them: the exact stream length, no value over 9 bytes, strictly increasing, inside ``[lo, hi)``."""
    if count < 0:
        raise CorruptSegmentError("negative value count")
    out = np.empty(max(count, 0), dtype=np.int64)
    chunk_indices_into(tensor, raw, count, lo, hi, out)
    return out


def chunk_indices_into(tensor: str, raw: bytes | memoryview | np.ndarray, count: int, lo: int, hi: int,
                       out: np.ndarray) -> None:
    """:func:`chunk_indices` decoded into ``out`` (int64, ``count`` long: a chunk's slice of its tensor's
    indices). Raises as :func:`chunk_indices` does; ``out`` is then partly written, nothing else."""
    if count < 0:
        raise CorruptSegmentError("negative value count")
    if not 0 <= lo <= hi < 1 << 63:  # the caller has bounded the range by its tensor's size
        raise ValueError(f"chunk range [{lo}, {hi}) is not within int64")
    if out.dtype != np.int64 or out.size != count:  # the kernel does not check bounds
        raise ValueError("out must be int64 and hold count values")
    stream = raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
    status = kernels.gap_indices_into(stream, count, lo, hi - lo, out)
    if status == kernels.LEB_OK:
        return
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
    _raise_value_error(status, stream)


def _raise_value_error(status: int, stream: np.ndarray) -> NoReturn:
    if status == kernels.VAL_LENGTH:
        raise CorruptSegmentError(f"value stream of {stream.size} bytes does not match its class table")
    raise CorruptSegmentError(_VALUE_ERRORS[status])


def apply_values_in_place(tensor: str, indices: np.ndarray, storage: HostStorage, raw: bytes | memoryview,
                          transform: ValueTransform, out: np.ndarray) -> WeightsDigest:
    """:func:`apply_values` reading the old bits from the target's own host ``storage`` of ``tensor`` at a
    chunk's ``indices`` (sorted, checked to lie in the tensor). A chunk inside one piece (nearly all) has
    its old bits gathered in the decoding sweep itself, its indices never cut; one that spans pieces is cut
    at them and gathered first."""
    if not indices.size == out.size:  # the kernels do not check bounds
        raise ValueError("indices and out must have the same size")
    if not indices.size:
        return ZERO
    first, last = storage.piece(int(indices[0])), storage.piece(int(indices[-1]))
    old = np.empty(indices.size, dtype=np.int16)
    if first == last and transform == ValueTransform.DELTA16:
        s0, s1 = tensor_seeds(tensor)
        stream = np.frombuffer(raw, dtype=np.uint8)
        status, lane0, lane1 = kernels.delta16_gather_apply(indices, storage.starts[first], storage.bits[first],
                                                            stream, old, out, s0, s1)
        if status == kernels.VAL_OK:
            return WeightsDigest((int(lane0), int(lane1)))
        _raise_value_error(status, stream)
    cuts = [0, *np.searchsorted(indices, storage.starts[first + 1: last + 1]).tolist(), indices.size]
    for number, a, b in zip(range(first, last + 1), cuts[:-1], cuts[1:]):
        start = storage.starts[number]
        kernels.take16(storage.bits[number], indices[a:b] - start if start else indices[a:b], old[a:b])
    return apply_values(tensor, indices, old, raw, transform, out)


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
