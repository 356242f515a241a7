"""The delta history as Parquet: one ``history/<version>.parquet`` object per published version.

Writing one object per version (instead of rewriting a growing file) keeps appends race-free and
idempotent on every backend. ``history/`` holds nothing else, every file has :data:`SCHEMA`, so the folder is a
Parquet dataset that any fsspec-based reader opens directly — ``pyarrow.dataset``, pandas
(``read_parquet(url, storage_options=…)``), DuckDB, Polars — from a directory, ``s3://`` (s3fs) or ``gs://``
(gcsfs). :func:`location` gives that URL and its ``storage_options`` for a bucket URL; :func:`load` is a thin
wrapper over ``pyarrow.dataset``. (A local bucket's in-flight writes are ``.aurora-tmp-*`` files, which
dataset readers skip like every name starting with ``.``.)
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from aurora_store.errors import FormatError
from aurora_store.store import object_names
from aurora_store.store.versions import DeltaStore

SCHEMA = pa.schema([
    pa.field("version", pa.int64(), nullable=False),
    pa.field("base_version", pa.int64(), nullable=False),
    pa.field("created_at", pa.string()),
    pa.field("delta_bytes", pa.int64()),
    pa.field("manifest_bytes", pa.int64()),
    pa.field("segments", pa.int64()),
    pa.field("changed", pa.int64()),
    pa.field("elements", pa.int64()),
    pa.field("density", pa.float64()),
    pa.field("encode_s", pa.float64()),
    pa.field("upload_s", pa.float64()),
    pa.field("publish_s", pa.float64()),
    pa.field("weights_digest", pa.string()),
    pa.field("tensor_changed", pa.map_(pa.string(), pa.int64())),
])


@dataclass(frozen=True)
class HistoryRow:
    version: int
    base_version: int
    created_at: str
    delta_bytes: int
    manifest_bytes: int
    segments: int
    changed: int
    elements: int
    encode_s: float | None
    upload_s: float | None
    publish_s: float | None
    weights_digest: str
    tensor_changed: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "version": self.version, "base_version": self.base_version, "created_at": self.created_at,
            "delta_bytes": self.delta_bytes, "manifest_bytes": self.manifest_bytes, "segments": self.segments,
            "changed": self.changed, "elements": self.elements,
            "density": self.changed / self.elements if self.elements else 0.0,
            "encode_s": self.encode_s, "upload_s": self.upload_s, "publish_s": self.publish_s,
            "weights_digest": self.weights_digest, "tensor_changed": list(self.tensor_changed.items()),
        }


def row_from_manifest(manifest, *, encode_s: float | None = None, upload_s: float | None = None,
                      publish_s: float | None = None) -> HistoryRow:
    return HistoryRow(
        version=manifest.version, base_version=manifest.base_version, created_at=manifest.created_at,
        delta_bytes=manifest.segment_bytes, manifest_bytes=len(manifest.to_bytes()), segments=len(manifest.segments),
        changed=manifest.changed_total, elements=manifest.elements, encode_s=encode_s, upload_s=upload_s,
        publish_s=publish_s, weights_digest=manifest.weights_digest, tensor_changed=dict(manifest.changed))


def record(store: DeltaStore, row: HistoryRow) -> None:
    """Write (or rewrite, e.g. after a trainer restart) the history row of one version."""
    table = pa.Table.from_pylist([row.as_dict()], schema=SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    store.put_object(object_names.history(row.version), sink.getvalue())


def _store(store_or_url: DeltaStore | str) -> DeltaStore:
    return DeltaStore(store_or_url) if isinstance(store_or_url, str) else store_or_url


def location(store_or_url: DeltaStore | str) -> tuple[str, dict[str, Any]] | None:
    """The history dataset's URL (``…/history/``) and the fsspec ``storage_options`` that reach it, e.g.
    ``("s3://bucket/run/history/", {"endpoint_url": …, "client_kwargs": {"region_name": …}})``: pass both to
    ``pandas.read_parquet`` or ``fsspec.core.url_to_fs``. None for a bucket no fsspec filesystem reaches
    (``memory://``)."""
    found = _store(store_or_url).bucket.fsspec_url()
    if found is None:
        return None
    root, options = found
    return f"{root.rstrip('/')}/{object_names.HISTORY}", options


def dataset(store_or_url: DeltaStore | str) -> ds.Dataset:
    """The history as a ``pyarrow.dataset`` with :data:`SCHEMA` (listed afresh on every call)."""
    store = _store(store_or_url)
    found = store.bucket.fsspec_filesystem()
    if found is None:  # no fsspec filesystem reaches this bucket: the same files, read through the bucket
        tables = [pq.read_table(io.BytesIO(store.get_object(key)))
                  for key in store.list_objects(object_names.HISTORY) if key.endswith(".parquet")]
        return ds.dataset(tables or [SCHEMA.empty_table()], schema=SCHEMA)
    fs, root = found
    path = f"{root.rstrip('/')}/{object_names.HISTORY.rstrip('/')}"
    fs.invalidate_cache(path)  # fsspec reuses filesystem instances: never answer from an older listing
    try:
        return ds.dataset(path, filesystem=fs, format="parquet", schema=SCHEMA)
    except FileNotFoundError:  # no version published with history yet
        return ds.dataset([SCHEMA.empty_table()], schema=SCHEMA)


def load(store_or_url: DeltaStore | str) -> pa.Table:
    """All history rows of a bucket, sorted by version (an empty table with the schema if there are none)."""
    store = _store(store_or_url)
    try:
        return dataset(store).to_table().sort_by("version")
    except (pa.ArrowException, ValueError) as exc:
        raise FormatError(f"{_unreadable_row(store) or store.url + '/' + object_names.HISTORY} is not a readable "
                          f"history row: {str(exc)[:200]}") from None


def _unreadable_row(store: DeltaStore) -> str | None:
    """The first history file that does not read as a row of :data:`SCHEMA` (to name it in an error)."""
    for key in store.list_objects(object_names.HISTORY):
        try:
            pq.read_table(io.BytesIO(store.get_object(key))).cast(SCHEMA)
        except (pa.ArrowException, ValueError):
            return f"{store.url}/{key}"
    return None


def rows_from_manifests(store: DeltaStore) -> pa.Table:
    """History reconstructed from the manifests alone (buckets written by ``aurora diff`` or before history
    existed): sizes and densities, without timings."""
    rows = [row_from_manifest(store.manifest(v)).as_dict() for v in store.versions()]
    return pa.Table.from_pylist(rows, schema=SCHEMA) if rows else SCHEMA.empty_table()
