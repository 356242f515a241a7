"""``aurora gc`` on real buckets: keeps exactly what the retained snapshots' chains need, in a safe order."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from aurora_store.cli import main
from aurora_store.codec import TensorTarget, digest_state
from aurora_store.errors import GcRefusedError
from aurora_store.follow import follow, plan_catch_up
from aurora_store.ops.gc import ORDER, collect_garbage, plan_gc
from aurora_store.ops.verify import verify_bucket
from aurora_store.store import DeltaStore, history, object_names
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot
from tests.ops.helpers import LAYOUT, Run, all_keys, build_bucket, rewrite, segment_keys, segment_of


@pytest.fixture()
def run(tmp_path) -> Run:
    return build_bucket(str(tmp_path / "bucket"), versions=8, snapshots=(0, 3, 6))


def catch_up_from(store: DeltaStore, snapshot: int, target_version: int) -> dict[str, torch.Tensor]:
    state, _ = load_snapshot(store, snapshot, LAYOUT)
    target = TensorTarget.from_state(LAYOUT, state, version=snapshot)
    follow(DeltaStore(store.bucket), target, target_version, snapshots=False)
    assert target.full_digest() == target.digest
    return state


def assert_bit_exact(state, expected) -> None:
    for name in LAYOUT.train_names:
        assert torch.equal(state[name].view(torch.int16), expected[name].view(torch.int16)), name


def test_keeps_exactly_what_the_retained_chains_need(run, capsys):
    before = set(all_keys(run.store))
    old_segments = {k for v in (1, 2, 3) for k in segment_keys(run.store, v)}
    kept_segments = {k for v in range(4, 9) for k in segment_keys(run.store, v)}
    assert main(["gc", run.store.url, "--keep-snapshots", "2", "--grace", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["retained_snapshots"] == [3, 6] and doc["removed_snapshots"] == [0]
    assert doc["removed_deltas"] == [1, 2, 3] and doc["kept_deltas"] == {"first": 4, "last": 8, "count": 5}
    store = DeltaStore(run.store.url)
    after = set(all_keys(store))
    deleted = before - after
    assert deleted == {d["key"] for d in doc["deletions"]} and doc["deleted"] == len(deleted)
    assert deleted == ({object_names.delta(v) for v in (1, 2, 3)} | old_segments
                       | {k for k in before if k.startswith(object_names.snapshot_dir(0))})
    assert doc["bytes_freed"] == sum(d["size"] for d in doc["deletions"]) > 0
    assert kept_segments <= after
    assert store.versions() == [4, 5, 6, 7, 8] and store.snapshot_versions() == [3, 6]
    assert history.load(store).column("version").to_pylist() == list(range(1, 9))  # all history is kept
    assert object_names.layout(LAYOUT.fingerprint) in after
    # every retained snapshot still reaches the latest version, bit for bit
    for snapshot in (3, 6):
        assert_bit_exact(catch_up_from(store, snapshot, 8), run.states[8])
    plan = plan_catch_up(None, 8, {v: store.delta_bytes(v) for v in store.versions()},
                         {s: read_snapshot_manifest(store, s).total_bytes for s in store.snapshot_versions()})
    assert plan.snapshot in (3, 6)
    report = verify_bucket(store, deep=True)
    assert report.ok, report.problems
    assert report.checked["snapshots_reproduced"] == 1


def test_deletions_run_manifests_first(run):
    plan = plan_gc(run.store, 1)
    kinds = [d.kind for d in plan.deletions]
    assert kinds == sorted(kinds, key=ORDER.index)
    assert kinds.index("segment") > max(i for i, k in enumerate(kinds) if k.endswith("manifest"))
    assert plan.retained_snapshots == (6,) and plan.removed_deltas == tuple(range(1, 7))
    assert plan.removed_snapshots == (0, 3)


def test_dry_run_deletes_nothing(run, capsys):
    before = {k: hashlib.sha256(run.store.get_object(k)).hexdigest() for k in all_keys(run.store)}
    assert main(["gc", run.store.url, "--keep-snapshots", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would delete 6 delta manifest(s) (1..6)" in out and "dry run: nothing deleted" in out
    assert {k: hashlib.sha256(run.store.get_object(k)).hexdigest() for k in all_keys(run.store)} == before
    report = collect_garbage(run.store, 1, dry_run=True)
    assert report.dry_run and report.deleted == 0 and report.plan.bytes_freed > 0


def test_refuses_when_the_kept_chain_is_broken(run, capsys):
    manifest = run.store.manifest(7)
    forged = manifest.__class__(**{**manifest.__dict__,
                                   "base_weights_digest": str(digest_state(LAYOUT, run.states[2]))})
    rewrite(run.store, object_names.delta(7), forged.to_bytes())
    before = all_keys(run.store)
    assert main(["gc", run.store.url, "--keep-snapshots", "2"]) == 1
    err = capsys.readouterr().err
    assert "refusing to collect" in err and "[chain_digest] version 7" in err
    assert all_keys(run.store) == before
    assert main(["gc", run.store.url, "--keep-snapshots", "2", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["refused"] and [p["code"] for p in doc["problems"]] == ["chain_digest"]
    with pytest.raises(GcRefusedError):
        collect_garbage(run.store, 2, dry_run=True)


def test_refuses_when_a_kept_segment_is_missing_but_not_for_one_it_deletes(run):
    run.store.bucket.delete(object_names.segment(segment_of(run.store, 2)))  # below the oldest kept snapshot: fine
    report = collect_garbage(run.store, 2, grace_s=0)
    assert report.plan.removed_deltas == (1, 2, 3)
    assert verify_bucket(DeltaStore(run.store.url)).ok
    run.store.bucket.delete(object_names.segment(segment_of(run.store, 7)))
    with pytest.raises(GcRefusedError) as refused:
        collect_garbage(DeltaStore(run.store.url), 1, grace_s=0)
    assert [(p.code, p.version) for p in refused.value.problems] == [("segment_missing", 7)]


def test_orphan_segments_are_kept_unless_pruned(run):
    data = run.store.get_object(object_names.segment(segment_of(run.store, 8))) + b"left over by a crashed publish"
    name = hashlib.sha256(data).hexdigest()
    rewrite(run.store, object_names.segment(name), data)
    assert collect_garbage(run.store, 3).plan.orphan_segments == (name,)
    assert run.store.has_segment(name)
    report = collect_garbage(run.store, 3, prune_orphans=True, grace_s=0)
    assert [d.key for d in report.plan.of_kind("orphan_segment")] == [object_names.segment(name)]
    assert not run.store.has_segment(name)


def test_bad_arguments(run, capsys):
    assert main(["gc", run.store.url, "--keep-snapshots", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_a_gap_below_the_kept_snapshots_is_collected_not_refused(run):
    run.store.bucket.delete(object_names.delta(5))  # versions 0 and 3 can no longer reach the latest
    report = verify_bucket(DeltaStore(run.store.url))
    assert {(p.code, p.version) for p in report.problems} == {
        ("chain_gap", 6), ("snapshot_stranded", 0), ("snapshot_stranded", 3)}
    with pytest.raises(GcRefusedError):  # keeping snapshot 3 would keep a broken chain
        plan_gc(DeltaStore(run.store.url), 2)
    collect_garbage(DeltaStore(run.store.url), 1, grace_s=0)
    store = DeltaStore(run.store.url)
    assert store.versions() == [7, 8] and store.snapshot_versions() == [6]
    assert verify_bucket(store, deep=True).ok
    assert_bit_exact(catch_up_from(store, 6, 8), run.states[8])
