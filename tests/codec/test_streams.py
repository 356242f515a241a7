"""The compiled stream decoders (``codec.streams``) against the numpy reference they replace in staging: on
valid input the same indices, new bits and digest move; on corrupt input the same error class with the same
message (hypothesis draws both, corrupt streams mostly as mutations of valid ones)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aurora_store.codec import leb128
from aurora_store.codec.digest import hash_change
from aurora_store.codec.segment import ValueTransform
from aurora_store.codec.streams import apply_values, chunk_indices
from aurora_store.codec.values import decode_values, encode_values
from aurora_store.errors import CorruptSegmentError

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_indices(tensor: str, raw: bytes, count: int, lo: int, hi: int) -> np.ndarray:
    """The gap decoding and checks as ``decode_segment`` made them before the compiled sweep (numpy)."""
    gaps = leb128.decode(raw, count)
    if gaps.size > 1 and int(gaps[1:].min()) < 1:
        raise CorruptSegmentError(f"chunk {tensor}: indices are not strictly increasing")
    span = hi - lo
    largest = int(gaps.max())
    if largest >= span or (largest * gaps.size >= 1 << 63 and float(gaps.sum(dtype=np.float64)) >= span):
        raise CorruptSegmentError(f"chunk {tensor}: index out of range")
    local = np.cumsum(gaps.astype(np.int64))
    if int(local[-1]) >= span:
        raise CorruptSegmentError(f"chunk {tensor}: index out of range")
    return local + lo


def outcome(fn, *args):
    """``("ok", result)`` or ``(error class, message)``: what the two decoders must agree on."""
    try:
        return "ok", fn(*args)
    except CorruptSegmentError as exc:
        return type(exc), str(exc)


def assert_same(compiled, reference) -> None:
    assert compiled[0] == reference[0], (compiled, reference)
    if compiled[0] == "ok":
        pairs = zip(compiled[1], reference[1]) if isinstance(compiled[1], tuple) else [(compiled[1], reference[1])]
        for a, b in pairs:
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
    else:
        assert compiled[1] == reference[1]


@st.composite
def chunk(draw):
    """A valid chunk ``[lo, hi)``: sorted distinct indices, with gaps of every LEB128 length."""
    lo = draw(st.integers(0, 1 << 40))
    gaps = draw(st.lists(st.one_of(st.integers(1, 3), st.integers(1, 1 << 20), st.integers(1, 1 << 45)),
                         min_size=1, max_size=60))
    first = draw(st.integers(0, 1 << 30))
    local = np.cumsum(np.array([first, *gaps[1:]], dtype=np.int64))
    hi = lo + int(local[-1]) + 1 + draw(st.integers(0, 1 << 30))
    return lo, hi, local + lo


def mutate(draw, data: bytes) -> bytes:
    out = bytearray(data)
    kind = draw(st.sampled_from(["flip", "byte", "truncate", "extend", "same"]))
    if kind == "flip" and out:
        for _ in range(draw(st.integers(1, 4))):
            out[draw(st.integers(0, len(out) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif kind == "byte" and out:
        out[draw(st.integers(0, len(out) - 1))] = draw(st.sampled_from([0, 0x7F, 0x80, 0xFF, 1, 2, 3]))
    elif kind == "truncate":
        out = out[: draw(st.integers(0, len(out)))]
    elif kind == "extend":
        out += bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=12)))
    return bytes(out)


@SETTINGS
@given(chunk())
def test_valid_gap_streams_decode_to_the_same_indices(spec):
    lo, hi, indices = spec
    raw = leb128.encode(np.diff(indices, prepend=lo))
    got = chunk_indices("t", raw, indices.size, lo, hi)
    assert got.dtype == np.int64 and np.array_equal(got, indices)
    assert np.array_equal(got, reference_indices("t", raw, indices.size, lo, hi))


@SETTINGS
@given(st.data(), chunk())
def test_corrupt_gap_streams_fail_alike(data, spec):
    lo, hi, indices = spec
    raw = mutate(data.draw, leb128.encode(np.diff(indices, prepend=lo)))
    count = max(1, indices.size + data.draw(st.sampled_from([0, 0, 0, -1, 1, 5])))
    hi = data.draw(st.sampled_from([hi, hi, lo + 1, lo + 2, int(indices[-1]), (1 << 62) + lo]))
    assert_same(outcome(chunk_indices, "t", raw, count, lo, hi), outcome(reference_indices, "t", raw, count, lo, hi))


@SETTINGS
@given(st.binary(min_size=0, max_size=40), st.integers(1, 40), st.integers(1, (1 << 63) - 1))
def test_random_bytes_as_gap_streams_fail_alike(raw, count, span):
    assert_same(outcome(chunk_indices, "t", raw, count, 0, span), outcome(reference_indices, "t", raw, count, 0, span))


def test_each_gap_stream_fault_is_named_as_the_reference_names_it():
    cases = {  # raw, count, span → the reference's message
        (bytes([1]), 2, 10): "cannot hold 2 values",
        (bytes([0x80] * 9 + [0x01]), 1, 10): "longer than 9 bytes",
        (leb128.encode(np.array([1, 1 << 20, 3]))[:-1], 3, 1 << 30): "truncated inside a value",
        (leb128.encode(np.array([1, 2, 3])), 2, 10): "1 bytes left over after 2",
        (bytes([1, 0, 1]), 3, 10): "not strictly increasing",
        (bytes([1, 9]), 2, 10): "index out of range",
        (bytes([1, 0, 0x7F]), 3, 0x7F): "not strictly increasing",  # both faults: the order first
        (leb128.encode(np.array([(1 << 63) - 1] * 3)), 3, 1 << 62): "index out of range",  # no wrap-around
    }
    for (raw, count, span), message in cases.items():
        reference = outcome(reference_indices, "t", raw, count, 0, span)
        assert reference[0] is CorruptSegmentError and message in reference[1]
        assert outcome(chunk_indices, "t", raw, count, 0, span) == reference


def reference_values(indices, old, raw, transform):
    new = decode_values(old, raw, old.size, transform)
    return new, hash_change("t", indices, old, new)


def compiled_values(indices, old, raw, transform):
    out = np.empty_like(old)
    moved = apply_values("t", indices, old, raw, transform, out)
    return out, moved


@st.composite
def values(draw):
    """Changed elements with every class of word: ±1, ±2 ulp, escapes of both signs, wrap-around."""
    n = draw(st.integers(0, 70))
    old = np.array(draw(st.lists(st.integers(-(1 << 15), (1 << 15) - 1), min_size=n, max_size=n)), dtype=np.int16)
    steps = draw(st.lists(st.one_of(st.sampled_from([-2, -1, 1, 2]), st.integers(-(1 << 15), (1 << 15) - 1)
                                    .filter(lambda d: d != 0)), min_size=n, max_size=n))
    new = (old.astype(np.int64) + np.array(steps, dtype=np.int64)).astype(np.int16)  # wraps
    indices = np.sort(np.array(draw(st.lists(st.integers(0, 1 << 40), min_size=n, max_size=n, unique=True)),
                               dtype=np.int64))
    return indices, old, new


@SETTINGS
@given(values(), st.sampled_from(list(ValueTransform)))
def test_valid_value_streams_decode_to_the_same_bits_and_digest_move(spec, transform):
    indices, old, new = spec
    raw = encode_values(old, new, transform)
    got = compiled_values(indices, old, raw, transform)
    assert np.array_equal(got[0], new)
    assert_same(("ok", got), ("ok", reference_values(indices, old, raw, transform)))


@SETTINGS
@given(st.data(), values(), st.sampled_from(list(ValueTransform)))
def test_corrupt_value_streams_fail_alike(data, spec, transform):
    indices, old, new = spec
    raw = mutate(data.draw, encode_values(old, new, transform))
    assert_same(outcome(compiled_values, indices, old, raw, transform),
                outcome(reference_values, indices, old, raw, transform))


@SETTINGS
@given(st.binary(max_size=40), st.integers(0, 40))
def test_random_bytes_as_value_streams_fail_alike(raw, count):
    indices, old = np.arange(count, dtype=np.int64), np.zeros(count, dtype=np.int16)
    assert_same(outcome(compiled_values, indices, old, raw, ValueTransform.DELTA16),
                outcome(reference_values, indices, old, raw, ValueTransform.DELTA16))


def test_each_value_stream_fault_is_named_as_the_reference_names_it():
    old = np.zeros(5, dtype=np.int16)
    idx = np.arange(5, dtype=np.int64)
    cases = {
        bytes([0]): "shorter than its class table",
        bytes([0, 0x04]): "padding in the value class table",
        bytes([0, 0, 7]): "does not match its class table",
        bytes([0xAA, 0x00, 0xF0]): "padding in the value side stream",  # four mid classes: 4 side bits
        bytes([0xC0, 0x00, 0x03, 0x00]): "should have used a short class",  # escape of word 3
    }
    for raw, message in cases.items():
        reference = outcome(reference_values, idx, old, raw, ValueTransform.DELTA16)
        assert reference[0] is CorruptSegmentError and message in reference[1], (raw, reference)
        assert outcome(compiled_values, idx, old, raw, ValueTransform.DELTA16) == reference


def test_mismatched_lengths_are_refused_before_the_kernel_runs():
    with pytest.raises(ValueError):
        chunk_indices("t", b"\x00", 1, 0, 1 << 63)
    with pytest.raises(ValueError):
        apply_values("t", np.arange(3, dtype=np.int64), np.zeros(4, dtype=np.int16), b"\x00",
                     ValueTransform.DELTA16, np.zeros(4, dtype=np.int16))
