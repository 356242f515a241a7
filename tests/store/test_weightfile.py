"""Zero-copy weight files (``store.weightfile``): the same tensors as the safetensors library, as views of the
fetched buffer, and every malformed header refused with a typed error."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from aurora_store.errors import FormatError
from aurora_store.store.weightfile import tensor_views


def file_of(tensors: dict[str, torch.Tensor]) -> bytes:
    return save_safetensors(tensors, metadata={"format": "pt"})


def raw_file(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def test_views_equal_the_library_and_share_the_buffer():
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7, dtype=torch.int16),
               "c": torch.randn(2, 2, 3), "empty": torch.zeros(0, 4, dtype=torch.bfloat16),
               "odd": torch.arange(3, dtype=torch.uint8)}
    data = file_of(tensors)
    buffer = bytearray(data + b"\xff")  # a byte beyond the file, as the fetch leaves it
    views = tensor_views(buffer, len(data))
    reference = load_safetensors(data)
    assert set(views) == set(reference) == set(tensors)
    for name, tensor in reference.items():
        assert views[name].dtype == tensor.dtype and views[name].shape == tensor.shape
        assert torch.equal(views[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))
    views["b"][0] = 99  # a view: the write lands in the buffer
    assert load_safetensors(bytes(buffer[: len(data)]))["b"][0] == 99


@pytest.mark.parametrize("make", [
    lambda: b"\x01\x00",  # shorter than the header length
    lambda: struct.pack("<Q", 1 << 40) + b"{}",  # header longer than the file
    lambda: struct.pack("<Q", 2) + b"[]",  # not an object
    lambda: struct.pack("<Q", 3) + b"{x}",  # not JSON
    lambda: raw_file({"a": {"dtype": "Q99", "shape": [1], "data_offsets": [0, 2]}}, b"\0\0"),
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 2]}}, b"\0\0"),  # wrong length
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [-1], "data_offsets": [0, 2]}}, b"\0\0"),
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [2, 0]}}, b"\0\0"),
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2, 4]}}, b"\0\0"),
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [2, 4]}}, b"\0" * 4),  # a gap
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                      "b": {"dtype": "BF16", "shape": [1], "data_offsets": [2, 4]}}, b"\0" * 4),  # overlap
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}, b"\0" * 3),  # trailing
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}, b"\0"),  # truncated
    lambda: raw_file({"a": "BF16"}, b""),
    lambda: raw_file({"__metadata__": {"format": 1}}, b""),
    lambda: raw_file({"a": {"dtype": "BF16", "shape": [1.0], "data_offsets": [0, 2]}}, b"\0\0"),
])
def test_malformed_files_are_refused_typed(make):
    data = make()
    with pytest.raises(FormatError):
        tensor_views(bytearray(data), len(data))
