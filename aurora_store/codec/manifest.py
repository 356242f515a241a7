"""The delta manifest: everything needed to fetch, verify and apply version ``v`` on top of its base.

Manifests are JSON, serialised canonically (sorted keys, no insignificant whitespace, UTF-8) so that the
same manifest always has the same bytes and a retried create can be resolved by comparing digests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aurora_store.codec.digest import WeightsDigest
from aurora_store.codec.document import SignedDocument
from aurora_store.codec.params import CodecParams
from aurora_store.errors import FormatError, ManifestError

DELTA_FORMAT = "aurora.delta/1"
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")




@dataclass(frozen=True)
class ChunkRef:
    """What part of which tensor a chunk inside a segment covers."""

    tensor: str
    lo: int
    hi: int
    count: int

    def to_json(self) -> list[Any]:
        return [self.tensor, self.lo, self.hi, self.count]


@dataclass(frozen=True)
class SegmentRef:
    """A segment object: its SHA-256 (also its name in the bucket), size and the chunks it holds."""

    digest: str
    size: int
    chunks: tuple[ChunkRef, ...]

    @property
    def changed(self) -> int:
        return sum(c.count for c in self.chunks)

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.digest, "size": self.size, "chunks": [c.to_json() for c in self.chunks]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SegmentRef:
        digest = str(doc["sha256"])
        if not _SHA256_HEX.match(digest):
            raise ManifestError(f"segment digest is not a SHA-256 hex string: {digest!r}")
        chunks = tuple(ChunkRef(str(t), int(lo), int(hi), int(n)) for t, lo, hi, n in doc["chunks"])
        return cls(digest, int(doc["size"]), chunks)


@dataclass(frozen=True)
class DeltaManifest(SignedDocument):
    version: int
    base_version: int
    layout_fingerprint: str
    codec: CodecParams
    segments: tuple[SegmentRef, ...]
    changed: Mapping[str, int]
    elements: int
    base_weights_digest: str
    weights_digest: str
    created_at: str = ""
    producer: Mapping[str, Any] = field(default_factory=dict)
    signature: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.version < 1 or self.base_version < 0 or self.base_version >= self.version:
            raise ManifestError(f"invalid version {self.version} with base {self.base_version}")
        for text in (self.base_weights_digest, self.weights_digest):
            try:
                WeightsDigest.parse(text)
            except FormatError as exc:
                raise ManifestError(str(exc)) from exc
        per_tensor: dict[str, int] = {}
        for seg in self.segments:
            for chunk in seg.chunks:
                per_tensor[chunk.tensor] = per_tensor.get(chunk.tensor, 0) + chunk.count
        if per_tensor != {k: v for k, v in self.changed.items() if v}:
            raise ManifestError("per-tensor changed counts do not match the segments' chunks")

    @property
    def changed_total(self) -> int:
        return sum(self.changed.values())

    @property
    def segment_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def density(self) -> float:
        return self.changed_total / self.elements if self.elements else 0.0

    def body(self) -> dict[str, Any]:
        return {
            "format": DELTA_FORMAT,
            "version": self.version,
            "base_version": self.base_version,
            "layout_fingerprint": self.layout_fingerprint,
            "codec": self.codec.to_json(),
            "segments": [s.to_json() for s in self.segments],
            "changed": dict(sorted(self.changed.items())),
            "elements": self.elements,
            "base_weights_digest": self.base_weights_digest,
            "weights_digest": self.weights_digest,
            "created_at": self.created_at,
            "producer": dict(self.producer),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DeltaManifest:
        if not isinstance(doc, Mapping):
            raise ManifestError("manifest is not a JSON object")
        if doc.get("format") != DELTA_FORMAT:
            raise ManifestError(f"unknown manifest format {doc.get('format')!r}")
        try:
            return cls(
                version=int(doc["version"]),
                base_version=int(doc["base_version"]),
                layout_fingerprint=str(doc["layout_fingerprint"]),
                codec=CodecParams.from_json(doc["codec"]),
                segments=tuple(SegmentRef.from_json(s) for s in doc["segments"]),
                changed={str(k): int(v) for k, v in doc["changed"].items()},
                elements=int(doc["elements"]),
                base_weights_digest=str(doc["base_weights_digest"]),
                weights_digest=str(doc["weights_digest"]),
                created_at=str(doc.get("created_at", "")),
                producer=dict(doc.get("producer", {})),
                signature=dict(doc["signature"]) if doc.get("signature") is not None else None,
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"malformed manifest: {exc!r}") from exc

    @classmethod
    def from_bytes(cls, data: bytes) -> DeltaManifest:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"manifest is not valid JSON: {exc}") from exc
        return cls.from_json(doc)
