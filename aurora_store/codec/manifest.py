"""The delta manifest: everything needed to fetch, verify and apply version ``v`` on top of its base.

Manifests are JSON, serialised canonically (sorted keys, no insignificant whitespace, UTF-8) so that the
same manifest always has the same bytes and a retried create can be resolved by comparing digests.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aurora_store.codec import jsondoc
from aurora_store.codec.document import SignedDocument
from aurora_store.codec.params import CodecParams
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import FormatError, ManifestError

DELTA_FORMAT = "aurora.delta/1"
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")




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
    def from_json(cls, doc: Any) -> SegmentRef:
        doc = jsondoc.mapping(doc, "segment entry")
        digest = jsondoc.text(jsondoc.field(doc, "sha256", "segment entry"), "segment sha256")
        if not _SHA256_HEX.match(digest):
            raise ManifestError(f"segment digest is not a SHA-256 hex string: {digest[:80]!r}")
        chunks = []
        for item in jsondoc.array(jsondoc.field(doc, "chunks", "segment entry"), "segment chunks"):
            item = jsondoc.array(item, "chunk entry")
            if len(item) != 4:
                raise ManifestError(f"chunk entry must be [tensor, lo, hi, count], got {len(item)} items")
            chunks.append(ChunkRef(jsondoc.text(item[0], "chunk tensor"), jsondoc.integer(item[1], "chunk lo"),
                                   jsondoc.integer(item[2], "chunk hi"), jsondoc.integer(item[3], "chunk count")))
        return cls(digest, jsondoc.integer(jsondoc.field(doc, "size", "segment entry"), "segment size"), tuple(chunks))


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
        if not _FINGERPRINT.match(self.layout_fingerprint):
            raise ManifestError(f"layout_fingerprint is not 'sha256:' + 64 hex digits: "
                                f"{self.layout_fingerprint[:80]!r}")
        digests = [seg.digest for seg in self.segments]
        if len(set(digests)) != len(digests):
            raise ManifestError("a segment is listed more than once")
        per_tensor: dict[str, int] = {}
        ranges: dict[str, list[tuple[int, int]]] = {}
        for seg in self.segments:
            for chunk in seg.chunks:
                if not (0 <= chunk.lo < chunk.hi and 1 <= chunk.count <= chunk.hi - chunk.lo):
                    raise ManifestError(f"chunk {chunk.tensor[:80]} [{chunk.lo}, {chunk.hi}) cannot hold "
                                        f"{chunk.count} changed elements")
                per_tensor[chunk.tensor] = per_tensor.get(chunk.tensor, 0) + chunk.count
                ranges.setdefault(chunk.tensor, []).append((chunk.lo, chunk.hi))
        for tensor, spans in ranges.items():
            spans.sort()
            if any(nxt[0] < prev[1] for prev, nxt in itertools.pairwise(spans)):
                raise ManifestError(f"chunks of {tensor[:80]} overlap")
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
    def from_json(cls, doc: Any) -> DeltaManifest:
        if not isinstance(doc, Mapping):
            raise ManifestError("manifest is not a JSON object")
        if doc.get("format") != DELTA_FORMAT:
            raise ManifestError(f"unknown manifest format {str(doc.get('format'))[:80]!r}")

        def get(key: str) -> Any:
            return jsondoc.field(doc, key, "delta manifest")

        changed = jsondoc.mapping(get("changed"), "changed")
        try:
            return cls(
                version=jsondoc.integer(get("version"), "version"),
                base_version=jsondoc.integer(get("base_version"), "base_version"),
                layout_fingerprint=jsondoc.text(get("layout_fingerprint"), "layout_fingerprint"),
                codec=CodecParams.from_json(jsondoc.mapping(get("codec"), "codec")),
                segments=tuple(SegmentRef.from_json(s) for s in jsondoc.array(get("segments"), "segments")),
                changed={k: jsondoc.integer(v, f"changed[{k[:80]!r}]") for k, v in changed.items()},
                elements=jsondoc.integer(get("elements"), "elements"),
                base_weights_digest=jsondoc.text(get("base_weights_digest"), "base_weights_digest"),
                weights_digest=jsondoc.text(get("weights_digest"), "weights_digest"),
                created_at=jsondoc.text(doc.get("created_at", ""), "created_at"),
                producer=jsondoc.mapping(doc.get("producer", {}), "producer"),
                signature=signature_of(doc),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"malformed manifest: {exc!r}") from exc

    @classmethod
    def from_bytes(cls, data: bytes) -> DeltaManifest:
        return cls.from_json(jsondoc.load_object(data, what="delta manifest"))


def signature_of(doc: Mapping[str, Any]) -> dict[str, str] | None:
    """A document's ``signature`` member: absent/null, or an object of strings (FORMAT §4.2)."""
    raw = doc.get("signature")
    if raw is None:
        return None
    raw = jsondoc.mapping(raw, "signature")
    return {k: jsondoc.text(v, f"signature {k[:40]!r}") for k, v in raw.items()}
