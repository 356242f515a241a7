"""One parse gate for every document read from a bucket or the bus (issue 17, case 2): oversize, deeply
nested, non-finite or wrongly typed input is a typed error, never OverflowError/RecursionError/MemoryError."""

from __future__ import annotations

import contextlib
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.bus.messages import VersionEvent
from aurora_store.bus.streams import Entry
from aurora_store.codec import DeltaManifest, ModelLayout, jsondoc
from aurora_store.codec.document import canonical_json
from aurora_store.errors import AuroraError, LayoutError, ManifestError, MessageError
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.snapshot_manifest import SnapshotManifest
from aurora_store.testing.builders import TINY_QWEN3, encode, perturb, random_state, target_for

LAYOUT = ModelLayout.from_config(TINY_QWEN3)


@pytest.fixture(scope="module")
def manifest_doc() -> dict:
    old = random_state(LAYOUT, seed=3)
    manifest, _ = encode(LAYOUT, old, perturb(old, 0.02, seed=4), 1, 0, target_for(LAYOUT, old, 0).digest)
    return manifest.to_json()


SNAPSHOT = {"format": "aurora.snapshot/1", "version": 3, "layout_fingerprint": "sha256:" + "0" * 64,
            "weights_digest": "lthash128:" + "0" * 32,
            "files": [{"name": "model.safetensors", "sha256": "a" * 64, "size": 10}],
            "weight_files": ["model.safetensors"], "created_at": "", "producer": {"run": "r"}}


def _raw(doc: dict, **replace: str) -> bytes:
    """``doc`` as JSON with some members' values replaced by raw JSON text (which json.dumps cannot write)."""
    text = canonical_json({k: v for k, v in doc.items() if k not in replace}).decode()
    extra = ",".join(f"{json.dumps(k)}:{v}" for k, v in replace.items())
    return (text[:-1] + ("," if extra else "") + extra + "}").encode()


HOSTILE = {
    "huge float version": {"version": "1e400"},
    "float version": {"version": "1.0"},
    "bool version": {"version": "true"},
    "NaN elements": {"elements": "NaN"},
    "Infinity changed": {"changed": '{"model.embed_tokens.weight": Infinity}'},
    "negative size": {"segments": '[{"sha256": "' + "a" * 64 + '", "size": -1, "chunks": []}]'},
    "u64 overflow": {"elements": str(1 << 64)},
    "5000-digit int": {"elements": "9" * 5000},
    "deep nesting": {"producer": "[" * 200_000 + "]" * 200_000},
    "moderate nesting": {"producer": "[" * 40 + "]" * 40},
    "codec float": {"codec": '{"segment_bytes": 4096.5, "values": "delta16", "entropy": "zstd", "zstd_level": 3}'},
    "signature not strings": {"signature": '{"alg": 1}'},
    "chunk of 3": {"segments": '[{"sha256": "' + "a" * 64 + '", "size": 1, "chunks": [["t", 0, 1]]}]'},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_delta_manifests_are_manifest_errors(manifest_doc, case):
    with pytest.raises(ManifestError):
        DeltaManifest.from_bytes(_raw(manifest_doc, **HOSTILE[case]))


def test_valid_manifest_still_parses(manifest_doc):
    assert DeltaManifest.from_bytes(canonical_json(manifest_doc)).to_json() == manifest_doc


@pytest.mark.parametrize("replace", [{"version": "1e400"}, {"files": "[" * 100_000 + "]" * 100_000},
                                     {"weight_files": "[NaN]"}, {"version": "2.0"}])
def test_hostile_snapshot_manifests_are_manifest_errors(replace):
    with pytest.raises(ManifestError):
        SnapshotManifest.from_bytes(_raw(SNAPSHOT, **replace))


def test_size_cap():
    with pytest.raises(ManifestError, match="bytes"):
        jsondoc.loads(b" " * 100 + b"{}", max_bytes=64)


def test_hostile_layout_document_is_a_layout_error(tmp_path):
    store = DeltaStore(open_bucket(str(tmp_path / "b"), create=True))
    doc = LAYOUT.to_json()
    for raw in [_raw(doc, tensors='[{"name": "x", "shape": [1e400], "components": [], "dtype": "bfloat16"}]'),
                _raw(doc, aliases="[" * 50_000 + "]" * 50_000)]:
        store.bucket.put(object_names.layout(LAYOUT.fingerprint), raw)
        with pytest.raises(LayoutError):
            store.layout(LAYOUT.fingerprint)


def test_hostile_run_record_is_a_manifest_error():
    store = DeltaStore(open_bucket(f"memory://{uuid.uuid4().hex}", create=True))
    store.bucket.put(object_names.RUN_INFO, b'{"run": "a", "home_region": 1e999}')
    with pytest.raises(ManifestError):
        store.run_info()
    store.bucket.put(object_names.RUN_INFO, b"[" * 300_000)
    with pytest.raises(ManifestError):
        store.run_info()


def test_hostile_bus_messages_are_message_errors():
    with pytest.raises(MessageError):
        Entry("s", "1-0", {"data": "[" * 300_000}).json()
    with pytest.raises(MessageError):
        Entry("s", "1-0", {"data": '{"a": NaN}'}).json()
    with pytest.raises(MessageError):
        VersionEvent.from_fields({"kind": "commit", "version": "1e400", "region": "r"})


@given(st.binary(max_size=300) | st.text(alphabet="[]{}\":,0123456789.eE+-INaftrulsn ", max_size=300))
def test_gate_never_raises_anything_but_aurora_errors(data):
    with contextlib.suppress(AuroraError):
        DeltaManifest.from_bytes(data if isinstance(data, bytes) else data.encode())


def test_hostile_run_log_export_lines_are_format_errors():
    from aurora_store.errors import FormatError
    from aurora_store.ops.runlog import decode_entries

    for line in [b'{"id": "1-0", "x": NaN}', b"[" * 300_000, b'{"id": 1e400}', b"\xff\xfe"]:
        with pytest.raises(FormatError):
            decode_entries(line + b"\n")
    assert decode_entries(b'{"id": "1-0", "kind": "x"}\n') == [{"id": "1-0", "kind": "x"}]
