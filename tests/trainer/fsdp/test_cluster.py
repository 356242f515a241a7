"""The whole system with the trainer data parallel over 2 ranks under torchrun: actors (one behind a relay)
follow every version the ranks publish together, through a restart of the trainer from its sharded
checkpoint, and end on the trainer's final digest."""

from __future__ import annotations

import json

import pytest

from aurora_store.codec import TensorTarget, digest_state
from aurora_store.follow import follow, plan_catch_up
from aurora_store.store.snapshot_manifest import read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot
from workers.cluster import ClusterSpec, LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]

FIRST, STEPS = 3, 5


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    spec = ClusterSpec(run_dir=tmp_path_factory.mktemp("fsdp-cluster"), steps=FIRST, batch_size=8, group_size=4,
                       actors={"us-east": 1, "eu-west": 1}, snapshot_every=2, trainer_ranks=2,
                       trainer_args=["--warm-start-steps", "10", "--verify-published-digest",
                                     "--initial-lease-s", "60"],
                       actor_args=["--verify-full-digest"])
    with LocalCluster(spec) as cluster:
        first = cluster.wait_trainer_done(timeout=150)
        cluster.start_trainer(["--steps", str(STEPS)])  # both ranks resume from their checkpoint shards
        summary = cluster.wait_trainer_done(timeout=150)
        final = summary["trainer_version"]
        actors = cluster.wait_actors_on(final, 60)
        yield {"cluster": cluster, "first": first, "summary": summary, "log": cluster.plane.run_log(),
               "actors": actors}


def test_actors_end_on_the_trainers_final_digest(run):
    summary = run["summary"]
    assert summary["trainer_ranks"] == 2 and summary["trainer_version"] == STEPS
    assert run["first"]["trainer_version"] == FIRST
    resumes = [e for e in run["log"] if e["kind"] == "trainer_resume"]
    assert [(int(e["step"]), int(e["version"])) for e in resumes] == [(FIRST, FIRST)]
    for state in run["actors"].values():
        assert (state.active_version, state.active_digest) == (STEPS, summary["trainer_digest"])
    activations = [e for e in run["log"] if e["kind"] == "activate"]
    store = run["cluster"].store()
    for event in activations:  # actors ran with --verify-full-digest: from-scratch hashes after every activation
        assert event["digest"] == store.manifest(int(event["version"])).weights_digest


def test_every_version_reconstructs_to_its_manifest_digest(run):
    store = run["cluster"].store()
    layout = store.layout(store.run_info()["layout"])
    snapshots = {s: read_snapshot_manifest(store, s).total_bytes for s in store.snapshot_versions()}
    assert sorted(snapshots) == [0, 2, 4]  # written sharded, before and after the restart
    for version in store.versions():
        manifest = store.manifest(version)
        assert manifest.producer["ranks"] == 2
        plan = plan_catch_up(None, version, {v: store.delta_bytes(v) for v in store.versions()}, snapshots)
        state, _ = load_snapshot(store, plan.snapshot, layout)  # verifies the snapshot's digest from scratch
        target = TensorTarget.from_state(layout, state, version=plan.snapshot)
        follow(store, target, plan.target, snapshots=False)
        assert str(digest_state(layout, state)) == manifest.weights_digest
    assert manifest.weights_digest == run["summary"]["trainer_digest"]


def test_the_relay_region_holds_every_version(run):
    cluster = run["cluster"]
    assert cluster.store("eu-west").versions() == cluster.store().versions() == list(range(1, STEPS + 1))


def test_only_metadata_crosses_ranks_when_publishing(run):
    events = [e for e in run["log"] if e["kind"] == "publish_ranks"]
    assert len(events) == STEPS  # publishes of both trainer incarnations
    full_bytes = run["summary"]["full_bytes"]  # the bf16 model
    for event in events:
        assert int(event["metadata_bytes"]) < min(64 << 10, full_bytes / 20), event
    steps = [e for e in run["log"] if e["kind"] == "step"]
    assert all(int(e["ranks"]) == 2 for e in steps)


def test_every_ranks_segments_are_announced_before_the_version(run):
    """Rank 1 announces its own segments (it has a Redis connection for them): each version's home stream
    names every segment of the manifest — both ranks' — before the ``staged`` event, each exactly once."""
    cluster = run["cluster"]
    events, cursor = [], "0"
    while batch := cluster.plane.read_events({cluster.spec.home: cursor}, block_ms=None):
        events.extend(event for _, _, event in batch)
        cursor = batch[-1][1]
    store = cluster.store()
    ranks = {int(e["version"]): json.loads(e["ranks"]) for e in run["log"] if e["kind"] == "publish_ranks"}
    contributed: set[int] = set()
    for version in store.versions():
        staged = next(i for i, e in enumerate(events) if e.kind == "staged" and e.version == version)
        announced = [e.segment for e in events[:staged] if e.kind == "segment" and e.version == version]
        manifest = store.manifest(version)
        assert sorted(announced) == sorted(s.digest for s in manifest.segments), version
        per_rank = {int(r["rank"]): int(r["segments"]) for r in ranks[version]}
        assert sorted(per_rank) == [0, 1] and sum(per_rank.values()) == len(manifest.segments), version
        contributed.update(rank for rank, count in per_rank.items() if count)
    # A step whose groups all earn the same reward has no gradient and publishes an empty delta, and a rank's
    # half can be unchanged in a step: the run as a whole must have both ranks' segments announced.
    assert contributed == {0, 1}
