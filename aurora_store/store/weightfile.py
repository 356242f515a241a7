"""Zero-copy reading of a safetensors weight file: tensors as views over the buffer it was fetched into.

The safetensors library's loader copies every tensor out of the file's bytes — one more pass over a snapshot
(gigabytes) after its download and its SHA-256. A snapshot file is read into one writable buffer and its
tensors are views of it (:func:`tensor_views`); the buffer lives as long as any of them. The header is
checked as strictly as the safetensors library checks it: a bounded JSON object, known dtypes, shapes and
offsets of non-negative integers, each tensor's byte length its shape's, and the tensors tiling the data
section exactly (no gap, no overlap, nothing after). A file that fails raises :class:`FormatError`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from aurora_store.codec import jsondoc
from aurora_store.errors import FormatError

#: safetensors' dtype names → torch dtypes (those torch has).
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
    "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64, "F16": torch.float16,
    "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
#: A header longer than this is refused before it is parsed (the safetensors library's own bound).
MAX_HEADER_BYTES = 100 << 20


def tensor_views(buffer: bytearray | memoryview, size: int) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file held in ``buffer[:size]`` as views of ``buffer`` (writable when it
    is), in file order."""
    view = memoryview(buffer)
    if not 8 <= size <= len(view):
        raise FormatError(f"weight file of {size} bytes is shorter than its header length")
    header_len = int.from_bytes(view[:8], "little")
    if header_len > min(MAX_HEADER_BYTES, size - 8):
        raise FormatError(f"weight file header of {header_len} bytes does not fit the file")
    header = jsondoc.load_object(view[8: 8 + header_len], what="weight file header", error=FormatError,
                                 max_bytes=MAX_HEADER_BYTES)
    data_start = 8 + header_len
    entries = sorted((_entry(name, info) for name, info in header.items() if name != "__metadata__"),
                     key=lambda e: e[3])
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError("weight file metadata must map names to strings")
    end = 0
    out: dict[str, torch.Tensor] = {}
    for name, dtype, shape, begin, stop in entries:
        if begin != end:
            raise FormatError(f"weight file tensor {name[:80]!r} starts at {begin}, not at {end}: gap or overlap")
        end = stop
        if data_start + stop > size:
            raise FormatError(f"weight file tensor {name[:80]!r} runs past the end of the file")
        if stop == begin:  # an empty tensor: frombuffer refuses a zero count
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        out[name] = torch.frombuffer(view, dtype=dtype, count=math.prod(shape),
                                     offset=data_start + begin).view(shape)
    if data_start + end != size:
        raise FormatError(f"weight file holds {size - data_start - end} bytes after its last tensor")
    return out


def _entry(name: str, info: Any) -> tuple[str, torch.dtype, tuple[int, ...], int, int]:
    what = f"weight file tensor {name[:80]!r}"
    info = jsondoc.mapping(info, what, FormatError)
    dtype = DTYPES.get(str(info.get("dtype")))
    if dtype is None:
        raise FormatError(f"{what} has unknown dtype {str(info.get('dtype'))[:40]!r}")
    shape = tuple(jsondoc.integer(d, f"{what} shape", FormatError)
                  for d in jsondoc.array(info.get("shape"), f"{what} shape", FormatError))
    offsets = [jsondoc.integer(o, f"{what} offsets", FormatError)
               for o in jsondoc.array(info.get("data_offsets"), f"{what} offsets", FormatError)]
    if len(offsets) != 2 or offsets[0] > offsets[1]:
        raise FormatError(f"{what} has data offsets {offsets[:3]}, not [begin, end]")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if offsets[1] - offsets[0] != math.prod(shape) * itemsize:
        raise FormatError(f"{what} spans {offsets[1] - offsets[0]} bytes, its shape {shape} needs "
                          f"{math.prod(shape) * itemsize}")
    return name, dtype, shape, offsets[0], offsets[1]
