"""``verify --deep`` checks what ``patch`` checks (issue 17, case 7): a segment listed twice, chunks of one
tensor overlapping across segments, a chunk claiming more changes than its range holds, an unusable layout
fingerprint, an escape word below 5 — each reported as a problem of its own version, none aborting the run,
and each refused by ``aurora patch``."""

from __future__ import annotations

import hashlib
import json

import pytest

from aurora_store.cli import main
from aurora_store.codec import CodecParams, DeltaManifest
from aurora_store.codec.decoder import decode_segment
from aurora_store.codec.manifest import ChunkRef, SegmentRef
from aurora_store.codec.segment import ChunkHeader, EncodedChunk, Entropy, ValueTransform, pack
from aurora_store.errors import CorruptSegmentError, ManifestError
from aurora_store.ops.verify import verify_bucket
from aurora_store.store import object_names
from tests.ops.helpers import LAYOUT, build_bucket, rewrite


def _edit(store, version: int, change) -> None:
    doc = json.loads(store.manifest_bytes(version))
    change(doc)
    rewrite(store, object_names.delta(version), json.dumps(doc).encode())


def _add_segment(doc: dict, segment: dict) -> None:
    doc["segments"].append(segment)
    for tensor, _lo, _hi, count in segment["chunks"]:
        doc["changed"][tensor] = doc["changed"].get(tensor, 0) + count


@pytest.fixture()
def damaged(tmp_path):
    run = build_bucket(str(tmp_path / "bucket"), versions=5, snapshots=(0,))
    store = run.store
    first_of_1 = json.loads(store.manifest_bytes(1))["segments"][0]
    _edit(store, 1, lambda d: _add_segment(d, d["segments"][0]))  # listed twice
    _edit(store, 2, lambda d: _add_segment(d, first_of_1))  # overlaps version 2's own chunks

    def too_many(doc):
        chunk = doc["segments"][0]["chunks"][0]
        chunk[2] = chunk[1] + chunk[3] - 1  # hi − lo < count
    _edit(store, 3, too_many)
    _edit(store, 4, lambda d: d.update(layout_fingerprint="sha256:../../../etc/passwd"))
    return run


def test_every_case_is_one_problem_of_its_own_version(damaged):
    report = verify_bucket(damaged.store, deep=True)
    by_version = {}
    for problem in report.problems:
        by_version.setdefault(problem.version, []).append(problem)
    for version, needle in [(1, "more than once"), (2, "overlap"), (3, "cannot hold"), (4, "layout_fingerprint")]:
        assert any(p.code == "manifest_malformed" and needle in p.message for p in by_version.get(version, [])), \
            (version, by_version.get(version))
    assert not any(p.version == 5 and p.code.startswith("manifest") for p in report.problems)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_patch_refuses_each_case(damaged, tmp_path, capsys, version):
    from safetensors.torch import save_file

    base = tmp_path / "base.safetensors"
    save_file({k: v.contiguous() for k, v in damaged.states[version - 1].items()}, str(base))
    capsys.readouterr()
    assert main(["patch", damaged.store.url, str(version), "--base-file", str(base), "--base", str(version - 1),
                 "--out", str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("aurora patch: error:"), err


def test_escape_word_below_five_is_found_without_a_base():
    tensor = LAYOUT.tensors[0].name
    # one changed element at index 5: class 3 (escape) with the word 3, which should have used class 2
    header = ChunkHeader(tensor, 0, LAYOUT[tensor].numel, 1, Entropy.NONE, ValueTransform.DELTA16, Entropy.NONE,
                         1, 1, 3, 3)
    data = pack([EncodedChunk(header, b"\x05", b"\x03\x03\x00")])
    ref = SegmentRef(hashlib.sha256(data).hexdigest(), len(data), (ChunkRef(tensor, 0, LAYOUT[tensor].numel, 1),))
    codec = CodecParams(segment_bytes=4096)
    decode_segment(LAYOUT, codec, ref, data)  # structure alone is fine
    with pytest.raises(CorruptSegmentError, match="escaped value word"):
        decode_segment(LAYOUT, codec, ref, data, check_values=True)


def test_manifest_level_refusals_are_manifest_errors(damaged):
    for version in (1, 2, 3, 4):
        with pytest.raises(ManifestError):
            DeltaManifest.from_bytes(damaged.store.manifest_bytes(version))
