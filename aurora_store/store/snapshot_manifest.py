"""A snapshot's manifest: the signed, create-only document listing its files with their SHA-256, the layout
fingerprint and the weights digest (see :mod:`.snapshots` for the files themselves).

Apart from :mod:`.snapshots` because reading a manifest needs neither torch nor safetensors: relays and the
CLI read manifests without paying for those imports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aurora_store.codec import jsondoc
from aurora_store.codec.document import SignedDocument
from aurora_store.codec.manifest import signature_of
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import (
    FormatError,
    ManifestError,
    ObjectNotFoundError,
    VersionExistsError,
    VersionNotFoundError,
)
from aurora_store.store import object_names

if TYPE_CHECKING:
    from aurora_store.codec.layout import ModelLayout
    from aurora_store.store.versions import DeltaStore

SNAPSHOT_FORMAT = "aurora.snapshot/1"


@dataclass(frozen=True)
class SnapshotFile:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class SnapshotManifest(SignedDocument):
    version: int
    layout_fingerprint: str
    weights_digest: str
    files: tuple[SnapshotFile, ...]
    weight_files: tuple[str, ...]
    created_at: str = ""
    producer: Mapping[str, Any] = field(default_factory=dict)
    #: The fingerprint of the layout whose training names the weight files hold, when not the run's layout
    #: (:func:`aurora_store.codec.namesets.snapshot_layout`: names the engine's loader reads); "" when the same.
    files_layout: str = ""
    signature: Mapping[str, str] | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def body(self) -> dict[str, Any]:
        return {
            "format": SNAPSHOT_FORMAT, "version": self.version, "layout_fingerprint": self.layout_fingerprint,
            "weights_digest": self.weights_digest,
            "files": [{"name": f.name, "sha256": f.sha256, "size": f.size} for f in self.files],
            "weight_files": list(self.weight_files), "created_at": self.created_at, "producer": dict(self.producer),
            # Only where the files have names of their own, so other manifests keep their bytes.
            **({"files_layout": self.files_layout} if self.files_layout else {}),
        }

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotManifest:
        doc = jsondoc.load_object(data, what="snapshot manifest")
        if doc.get("format") != SNAPSHOT_FORMAT:
            raise ManifestError(f"unknown snapshot format {str(doc.get('format'))[:80]!r}")

        def get(key: str) -> Any:
            return jsondoc.field(doc, key, "snapshot manifest")

        files = []
        for entry in jsondoc.array(get("files"), "snapshot files"):
            entry = jsondoc.mapping(entry, "snapshot file")
            files.append(SnapshotFile(jsondoc.text(jsondoc.field(entry, "name", "snapshot file"), "file name"),
                                      jsondoc.text(jsondoc.field(entry, "sha256", "snapshot file"), "file sha256"),
                                      jsondoc.integer(jsondoc.field(entry, "size", "snapshot file"), "file size")))
        digest = jsondoc.text(get("weights_digest"), "weights_digest")
        try:
            WeightsDigest.parse(digest)
        except FormatError as exc:
            raise ManifestError(str(exc)) from exc
        return cls(
            version=jsondoc.integer(get("version"), "version"),
            layout_fingerprint=jsondoc.text(get("layout_fingerprint"), "layout_fingerprint"),
            weights_digest=digest, files=tuple(files),
            weight_files=tuple(jsondoc.text(n, "weight file")
                               for n in jsondoc.array(get("weight_files"), "weight_files")),
            created_at=jsondoc.text(doc.get("created_at", ""), "created_at"),
            producer=jsondoc.mapping(doc.get("producer", {}), "producer"),
            files_layout=jsondoc.text(doc.get("files_layout", ""), "files_layout"),
            signature=signature_of(doc))



def create_snapshot_manifest(store: DeltaStore, version: int, layout: ModelLayout, weights_digest: WeightsDigest,
                             files: Sequence[SnapshotFile], weight_files: Sequence[str], *, created_at: str = "",
                             producer: Mapping[str, Any] | None = None, sign=None,
                             files_layout: ModelLayout | None = None) -> SnapshotManifest:
    """Create-only manifest of a snapshot whose files are all uploaded already (the ordering invariant).
    ``files_layout``: the layout whose names the weight files hold, when not ``layout``; its document is stored
    in the bucket before the manifest names it."""
    names = [f.name for f in files]
    if len(set(names)) != len(names) or not set(weight_files) <= set(names):
        raise ManifestError(f"snapshot {version}: duplicate file entries or weight files without an entry")
    own_names = files_layout if files_layout is not None and files_layout.fingerprint != layout.fingerprint else None
    if own_names is not None:
        store.put_layout(own_names)
    manifest = SnapshotManifest(version, layout.fingerprint, str(weights_digest),
                                tuple(sorted(files, key=lambda f: f.name)), tuple(weight_files), created_at,
                                dict(producer or {}), own_names.fingerprint if own_names is not None else "")
    if sign is not None:
        manifest = sign(manifest)
    store.create_object(object_names.snapshot_manifest(version), manifest.to_bytes(), error=VersionExistsError,
                        message=f"snapshot {version} already exists in {store.url} with different content")
    return manifest


def read_snapshot_manifest(store: DeltaStore, version: int) -> SnapshotManifest:
    try:
        data = store.get_document(object_names.snapshot_manifest(version))
    except ObjectNotFoundError:
        raise VersionNotFoundError(f"no snapshot of version {version} in {store.url}") from None
    manifest = SnapshotManifest.from_bytes(data)
    if manifest.version != version:
        raise ManifestError(f"snapshot manifest under version {version} declares version {manifest.version}")
    return manifest
