"""Codec parameters: recorded in every manifest so a decoder knows how segments were written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aurora_store.codec import jsondoc
from aurora_store.codec.segment import Entropy, ValueTransform
from aurora_store.errors import CodecError, ManifestError

DEFAULT_SEGMENT_BYTES = 4 << 20


@dataclass(frozen=True)
class CodecParams:
    """How a delta is encoded.

    ``segment_bytes`` is the target size of a segment (segments close once they reach it; a single large
    tensor is split across segments by element range). ``values`` is ``"delta16"`` (zigzagged wrapping
    difference of the 16-bit patterns, which needs the base weights to decode and compresses well because
    most changes are ±1 ulp) or ``"raw"`` (the new bits themselves). ``entropy`` is ``"zstd"`` or
    ``"none"``; zstd is used per stream only where it makes the stream smaller.
    """

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    values: str = "delta16"
    entropy: str = "zstd"
    zstd_level: int = 3

    def __post_init__(self) -> None:
        if not 4096 <= self.segment_bytes <= 1 << 30:
            raise CodecError(f"segment_bytes must be within [4 KiB, 1 GiB], got {self.segment_bytes}")
        if self.values not in ("delta16", "raw"):
            raise CodecError(f"values must be 'delta16' or 'raw', got {self.values!r}")
        if self.entropy not in ("zstd", "none"):
            raise CodecError(f"entropy must be 'zstd' or 'none', got {self.entropy!r}")
        if not 1 <= self.zstd_level <= 19:
            raise CodecError(f"zstd_level must be within [1, 19], got {self.zstd_level}")

    @property
    def value_transform(self) -> ValueTransform:
        return ValueTransform.DELTA16 if self.values == "delta16" else ValueTransform.RAW

    @property
    def use_zstd(self) -> bool:
        return self.entropy == "zstd"

    @property
    def max_changed_per_chunk(self) -> int:
        # Worst case (every element changed, incompressible values) is ~3 bytes per element.
        return max(1, self.segment_bytes // 3)

    def allows(self, entropy: Entropy) -> bool:
        return entropy == Entropy.NONE or self.use_zstd

    def to_json(self) -> dict[str, Any]:
        return {"index": "leb128-gaps", "values": self.values, "entropy": self.entropy,
                "zstd_level": self.zstd_level, "segment_bytes": self.segment_bytes}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CodecParams:
        try:
            if doc.get("index", "leb128-gaps") != "leb128-gaps":
                raise ManifestError(f"unknown index codec {str(doc.get('index'))[:80]!r}")
            return cls(jsondoc.integer(doc["segment_bytes"], "codec segment_bytes"),
                       jsondoc.text(doc["values"], "codec values"), jsondoc.text(doc["entropy"], "codec entropy"),
                       jsondoc.integer(doc["zstd_level"], "codec zstd_level"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"malformed codec parameters: {exc}") from exc
