"""Binary segment format (``AURS`` v1): self-describing containers of encoded chunks.

A *chunk* holds the changed elements of one inference tensor inside the flat index range ``[lo, hi)``:
their positions as planar LEB128 gaps (:mod:`.leb128`) and their values (:mod:`.values`), each stream
optionally zstd-compressed. A *segment* packs one or more chunks behind a small table; its name in a
bucket is the SHA-256 of its bytes. The exact byte layout is specified in ``docs/FORMAT.md``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from aurora_store.errors import CorruptSegmentError

MAGIC = b"AURS"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<4sHHII")  # magic, version, flags, chunk count, table bytes
_NAME_LEN = struct.Struct("<H")
_CHUNK_FIXED = struct.Struct("<QQQBBBBQQQQ")  # lo hi count | idx-ent transform val-ent 0 | 4 lengths
MAX_NAME_BYTES = 1024


class Entropy(IntEnum):
    NONE = 0
    ZSTD = 1


class ValueTransform(IntEnum):
    """How 16-bit values are stored: the new bits, or their zigzagged wrapping difference to the old bits."""

    RAW = 0
    DELTA16 = 1


@dataclass(frozen=True)
class ChunkHeader:
    tensor: str
    lo: int
    hi: int
    count: int
    index_entropy: Entropy
    value_transform: ValueTransform
    value_entropy: Entropy
    index_raw_len: int
    index_len: int
    value_raw_len: int
    value_len: int


@dataclass(frozen=True)
class EncodedChunk:
    header: ChunkHeader
    index_bytes: bytes
    value_bytes: bytes

    @property
    def nbytes(self) -> int:
        return len(self.index_bytes) + len(self.value_bytes) + _NAME_LEN.size + len(
            self.header.tensor.encode()) + _CHUNK_FIXED.size


def pack(chunks: list[EncodedChunk]) -> bytes:
    """Serialise chunks into one segment."""
    table = bytearray()
    for chunk in chunks:
        h = chunk.header
        name = h.tensor.encode()
        if len(name) > MAX_NAME_BYTES:
            raise ValueError(f"tensor name too long: {h.tensor[:64]}…")
        if len(chunk.index_bytes) != h.index_len or len(chunk.value_bytes) != h.value_len:
            raise ValueError("chunk header lengths do not match its payload")
        table += _NAME_LEN.pack(len(name)) + name
        table += _CHUNK_FIXED.pack(h.lo, h.hi, h.count, h.index_entropy, h.value_transform,
                                   h.value_entropy, 0, h.index_raw_len, h.index_len, h.value_raw_len,
                                   h.value_len)
    parts = [_PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(chunks), len(table)), bytes(table)]
    for chunk in chunks:
        parts += [chunk.index_bytes, chunk.value_bytes]
    return b"".join(parts)


def unpack(data: bytes | memoryview) -> list[tuple[ChunkHeader, memoryview, memoryview]]:
    """Parse a segment into ``(header, index stream, value stream)`` triples (zero-copy views).

    Structural problems raise :class:`CorruptSegmentError`; semantic checks (tensor known, range inside the
    tensor) are the decoder's.
    """
    view = memoryview(data)
    if len(view) < _PREAMBLE.size:
        raise CorruptSegmentError(f"segment of {len(view)} bytes is shorter than its preamble")
    magic, version, flags, count, table_len = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptSegmentError(f"bad segment magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise CorruptSegmentError(f"unsupported segment format version {version}")
    if flags != 0:
        raise CorruptSegmentError(f"unknown segment flags {flags:#x}")
    pos = _PREAMBLE.size
    table_end = pos + table_len
    if table_end > len(view):
        raise CorruptSegmentError("segment chunk table runs past the end")
    headers = []
    try:
        for _ in range(count):
            (name_len,) = _NAME_LEN.unpack_from(view, pos)
            pos += _NAME_LEN.size
            if name_len > MAX_NAME_BYTES or pos + name_len > table_end:
                raise CorruptSegmentError("chunk name runs past the chunk table")
            name = bytes(view[pos: pos + name_len]).decode()
            pos += name_len
            if pos + _CHUNK_FIXED.size > table_end:
                raise CorruptSegmentError("chunk header runs past the chunk table")
            lo, hi, n, ie, vt, ve, reserved, iraw, ilen, vraw, vlen = _CHUNK_FIXED.unpack_from(view, pos)
            pos += _CHUNK_FIXED.size
            if reserved != 0:
                raise CorruptSegmentError("reserved chunk header byte is not zero")
            headers.append(ChunkHeader(name, lo, hi, n, Entropy(ie), ValueTransform(vt), Entropy(ve),
                                       iraw, ilen, vraw, vlen))
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, CorruptSegmentError):
            raise
        raise CorruptSegmentError(f"malformed chunk table: {exc}") from exc
    if pos != table_end:
        raise CorruptSegmentError("chunk table length does not match its entries")
    out = []
    for h in headers:
        if not (0 <= h.lo < h.hi) or not (0 < h.count <= h.hi - h.lo):
            raise CorruptSegmentError(f"chunk {h.tensor}: invalid range [{h.lo}, {h.hi}) with {h.count} values")
        index_end = pos + h.index_len
        value_end = index_end + h.value_len
        if value_end > len(view):
            raise CorruptSegmentError(f"chunk {h.tensor}: payload truncated")
        out.append((h, view[pos:index_end], view[index_end:value_end]))
        pos = value_end
    if pos != len(view):
        raise CorruptSegmentError(f"{len(view) - pos} trailing bytes after the last chunk")
    return out
