import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.codec import leb128
from aurora_store.errors import CorruptSegmentError


def reference_leb128(value: int) -> bytes:
    """Plain, one-value-at-a-time unsigned LEB128 (the textbook definition)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_paper_example_198_is_c6_01():
    assert leb128.encode(np.array([198])) == bytes([0xC6, 0x01])
    assert leb128.decode(bytes([0xC6, 0x01]), 1).tolist() == [198]


def test_planar_order_groups_bytes_by_level():
    # values 5, 300 (2 bytes), 7: level 0 = [05, AC|80, 07], level 1 = [02]
    assert leb128.encode(np.array([5, 300, 7])) == bytes([0x05, 0xAC, 0x07, 0x02])


@given(st.lists(st.integers(0, 2**63 - 1), max_size=300))
def test_roundtrip_and_permutation_of_standard_leb128(values):
    encoded = leb128.encode(np.array(values, dtype=np.uint64))
    assert leb128.decode(encoded, len(values)).tolist() == values
    standard = b"".join(reference_leb128(v) for v in values)
    assert sorted(encoded) == sorted(standard)
    assert len(encoded) == len(standard)


def test_truncated_stream_is_rejected():
    encoded = leb128.encode(np.array([1, 1 << 20, 3]))
    with pytest.raises(CorruptSegmentError):
        leb128.decode(encoded[:-1], 3)


def test_leftover_bytes_and_wrong_count_are_rejected():
    encoded = leb128.encode(np.array([1, 2, 3]))
    with pytest.raises(CorruptSegmentError):
        leb128.decode(encoded, 2)
    with pytest.raises(CorruptSegmentError):
        leb128.decode(encoded, 4)


def test_overlong_value_is_rejected():
    with pytest.raises(CorruptSegmentError):
        leb128.decode(bytes([0x80] * 9 + [0x01]), 1)  # 10 levels


def test_negative_and_non_integer_input_is_rejected():
    with pytest.raises(ValueError):
        leb128.encode(np.array([-1]))
    with pytest.raises(TypeError):
        leb128.encode(np.array([1.5]))
