"""``aurora verify`` on real buckets (local directory and the real S3 server), clean and damaged."""

from __future__ import annotations

import json

import pytest

from aurora_store.cli import main
from aurora_store.codec import digest_state
from aurora_store.errors import AuroraError
from aurora_store.ops.verify import VerifyReport, verify_bucket
from aurora_store.store import object_names
from aurora_store.store.snapshots import write_snapshot
from aurora_store.testing.builders import perturb
from tests.ops.helpers import LAYOUT, build_bucket, flip_bit, rewrite, segment_of, truncate


@pytest.fixture()
def run(tmp_path):
    return build_bucket(str(tmp_path / "bucket"))


def verify_cli(url: str, capsys, *extra: str) -> tuple[int, dict]:
    code = main(["verify", url, "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def codes(report: VerifyReport) -> set[tuple[str, int | None]]:
    return {(p.code, p.version) for p in report.problems}


def test_a_published_bucket_is_clean_shallow_and_deep(run, capsys):
    for deep in ([], ["--deep"]):
        code, doc = verify_cli(run.store.url, capsys, *deep)
        assert (code, doc["ok"], doc["problems"]) == (0, True, [])
        assert doc["checked"]["deltas"] == 8 and doc["checked"]["snapshots"] == 3
        assert doc["checked"]["segments"] == sum(len(run.store.manifest(v).segments) for v in range(1, 9))
    assert doc["checked"]["replayed_versions"] == 8 and doc["checked"]["snapshots_reproduced"] == 2
    assert doc["checked"]["hashed_bytes"] == doc["checked"]["segment_bytes"] > 0
    assert main(["verify", run.store.url]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK")


def test_missing_segment(run, capsys):
    digest = segment_of(run.store, 4, 1)
    run.store.bucket.delete(object_names.segment(digest))
    code, doc = verify_cli(run.store.url, capsys)
    assert code == 1 and not doc["ok"]
    assert doc["problems"] == [{"code": "segment_missing", "version": 4, "key": digest,
                                "message": doc["problems"][0]["message"]}]
    assert digest in doc["problems"][0]["message"]
    assert main(["verify", run.store.url]) == 1
    out = capsys.readouterr().out
    assert f"[segment_missing] version 4: segment {digest}" in out


def test_bit_flipped_segment_needs_deep(run, capsys):
    digest = segment_of(run.store, 2)
    flip_bit(run.store, object_names.segment(digest))
    assert verify_bucket(run.store).ok  # same size: only re-hashing finds it
    code, doc = verify_cli(run.store.url, capsys, "--deep")
    assert code == 1
    flipped = [p for p in doc["problems"] if p["code"] == "segment_digest"]
    assert [(p["version"], p["key"]) for p in flipped] == [(2, digest)]
    assert "hashes to" in flipped[0]["message"]
    # the replay from snapshot 0 cannot get past version 2 either, and resumes at snapshot 3
    assert {(p["code"], p["version"]) for p in doc["problems"]} == {("segment_digest", 2), ("replay_failed", 2)}


@pytest.mark.s3
def test_on_the_real_s3_server(s3_bucket_url, capsys):
    run = build_bucket(s3_bucket_url, versions=4, snapshots=(0, 2))
    code, doc = verify_cli(s3_bucket_url, capsys)
    assert (code, doc["problems"], doc["checked"]["deltas"]) == (0, [], 4)
    missing, flipped, short = segment_of(run.store, 1), segment_of(run.store, 3), segment_of(run.store, 4)
    run.store.bucket.delete(object_names.segment(missing))
    flip_bit(run.store, object_names.segment(flipped))
    truncate(run.store, object_names.segment(short))
    code, doc = verify_cli(s3_bucket_url, capsys)
    assert code == 1
    assert {(p["code"], p["version"], p["key"]) for p in doc["problems"]} == {
        ("segment_missing", 1, missing), ("segment_size", 4, short)}
    code, doc = verify_cli(s3_bucket_url, capsys, "--deep")
    assert {(p["code"], p["version"], p["key"]) for p in doc["problems"]} >= {
        ("segment_missing", 1, missing), ("segment_digest", 3, flipped), ("segment_size", 4, short)}


def test_truncated_segment(run):
    digest = segment_of(run.store, 5)
    truncate(run.store, object_names.segment(digest), drop=7)
    report = verify_bucket(run.store)
    assert [(p.code, p.version, p.key) for p in report.problems] == [("segment_size", 5, digest)]
    size = run.store.manifest(5).segments[0].size
    assert f"holds {size - 7} bytes, manifest says {size}" in report.problems[0].message


def test_broken_chain(tmp_path):
    run = build_bucket(str(tmp_path / "bucket"))
    manifest = run.store.manifest(5)
    wrong = str(digest_state(LAYOUT, run.states[3]))
    forged = manifest.__class__(**{**manifest.__dict__, "base_weights_digest": wrong})
    rewrite(run.store, object_names.delta(5), forged.to_bytes())
    report = verify_bucket(run.store)
    assert codes(report) == {("chain_digest", 5)}
    problem = report.problems[0]
    assert wrong in problem.message and run.store.manifest(4).weights_digest in problem.message
    assert "delta 4" in problem.message
    deep = verify_bucket(run.store, deep=True)
    assert ("replay_failed", 5) in codes(deep)


def test_manifest_under_the_wrong_version_name(tmp_path, capsys):
    run = build_bucket(str(tmp_path / "bucket"))
    rewrite(run.store, object_names.delta(4), run.store.manifest_bytes(5))
    code, doc = verify_cli(run.store.url, capsys)
    assert code == 1
    assert [(p["code"], p["version"], p["key"]) for p in doc["problems"]] == [
        ("manifest_wrong_version", 4, object_names.delta(4))]
    assert "declares version 5" in doc["problems"][0]["message"]


def test_snapshot_inconsistent_with_the_chain(tmp_path):
    run = build_bucket(str(tmp_path / "bucket"))
    other = perturb(run.states[3], 0.01, 999)  # a self-consistent snapshot of the wrong weights
    run.store.bucket.delete(object_names.snapshot_manifest(3))
    write_snapshot(run.store, 3, other, LAYOUT, digest_state(LAYOUT, other), extra_files={"config.json": b"{}"})
    shallow = verify_bucket(run.store)
    assert codes(shallow) == {("snapshot_digest", 3)}
    assert run.store.manifest(3).weights_digest in shallow.problems[0].message
    deep = verify_bucket(run.store, deep=True)
    assert codes(deep) == {("snapshot_digest", 3), ("snapshot_replay", 3)}
    replay = next(p for p in deep.problems if p.code == "snapshot_replay")
    assert "replaying 1..3 from snapshot 0" in replay.message


def test_the_manifest_hook_sees_every_manifest(tmp_path):
    run = build_bucket(str(tmp_path / "bucket"))
    seen = []

    def reject_version_2(manifest) -> None:
        seen.append((type(manifest).__name__, manifest.version))
        if manifest.version == 2:
            raise AuroraError("bad signature")

    report = verify_bucket(run.store, verify_manifest=reject_version_2)
    assert codes(report) == {("manifest_rejected", 2)}
    assert "bad signature" in report.problems[0].message
    assert sorted(seen) == sorted([("DeltaManifest", v) for v in range(1, 9)]
                                  + [("SnapshotManifest", s) for s in (0, 3, 6)])


def test_missing_or_empty_bucket_is_an_error(tmp_path, capsys, s3_server):
    assert main(["verify", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["verify", str(tmp_path / "empty")]) == 2
    assert "holds no delta or snapshot manifests" in capsys.readouterr().err
    assert main(["verify", s3_server.bucket_url("no-such-bucket-here")]) == 2
    assert capsys.readouterr().err.startswith("aurora verify: error:")
