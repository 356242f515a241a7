"""The Follower on real buckets: bootstrap from the cheapest snapshot, replay vs snapshot by bytes, activation
only on the staged base, offers only for newer versions, bytes counted once, and ``follow`` in one call."""

from __future__ import annotations

import pytest
import torch

from aurora_store.codec import TensorTarget, digest_state
from aurora_store.errors import AuroraError, VersionNotFoundError
from aurora_store.follow import BucketChain, Follower, Step, follow
from aurora_store.store import object_names
from aurora_store.store.snapshots import load_snapshot
from tests.ops.helpers import LAYOUT, Run, build_bucket


@pytest.fixture()
def run(tmp_path) -> Run:
    return build_bucket(str(tmp_path / "bucket"), versions=8, snapshots=(0, 3, 6))


def target_at(run: Run, version: int) -> TensorTarget:
    return TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in run.states[version].items()}, version=version)


def assert_holds(target: TensorTarget, run: Run, version: int) -> None:
    assert target.version == version
    assert target.full_digest() == target.digest == digest_state(LAYOUT, run.states[version])


class FakeEngine:
    """Loads the downloaded snapshot's weights the way an engine would, from the files."""

    def __init__(self, model_dir, layout) -> None:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for path in sorted(model_dir.glob("*.safetensors")):
            state.update(load_file(path))
        self.target = TensorTarget.from_state(layout, {n: state[n] for n in layout.train_names})


def test_bootstrap_downloads_the_planned_snapshot_and_replays_to_the_goal(run, tmp_path):
    downloaded: list[int] = []
    follower = Follower(BucketChain(run.store), on_bytes=downloaded.append)
    boot = follower.bootstrap(run.store, 8, tmp_path / "cache")
    assert boot.plan.snapshot == 6 and boot.plan.deltas == (7, 8)
    engine = FakeEngine(boot.model_dir, boot.layout)
    follower.attach(engine.target, boot)
    assert_holds(engine.target, run, 8)
    assert sum(downloaded) == boot.plan.bytes, "every planned byte downloaded once, nothing else"


def test_a_target_behind_plans_by_bytes_and_follows_to_the_newest(run):
    events: list[tuple[str, dict]] = []
    follower = Follower(BucketChain(run.store), on_event=lambda kind, fields: events.append((kind, fields)))
    target = target_at(run, 1)
    follower.attach(target)
    assert follower.next_step(2, "next") == Step(2)
    step = follower.next_step(2, "behind")
    assert step is not None
    # from 1, snapshot 6 + deltas 7, 8 is smaller than replaying 2..8 only if the snapshot is cheap: whichever
    # it chose, it must be the cheaper by the bucket's own sizes
    plan_event = events[-1][1]
    assert events[-1][0] == "catch_up" and plan_event["goal"] == 8
    if step.snapshot:
        assert plan_event["bytes"] <= plan_event["replay_bytes"]
    assert follower.next_step(2, "behind") == Step(2), "a decision already made is not logged again"
    assert len([e for e in events if e[0] == "catch_up"]) == 1
    report = follower.follow_to(8)
    assert_holds(target, run, 8)
    assert report.steps[-1] == Step(8)


def test_a_catch_up_does_not_plan_past_the_ceiling(tmp_path):
    # Dense deltas: every snapshot is cheaper than replaying up to it, so the plan leaps whenever it may.
    dense = build_bucket(str(tmp_path / "dense"), versions=8, snapshots=(0, 4, 6), fraction=0.9)
    follower = Follower(BucketChain(dense.store))
    follower.attach(target_at(dense, 1))
    assert follower.next_step(2, "behind") == Step(6, snapshot=True), "without a ceiling: the newest snapshot"
    follower = Follower(BucketChain(dense.store))
    target = target_at(dense, 1)
    follower.attach(target)
    # Committed is 5: snapshot 6 could not be activated yet, and the caller would wait on version 1 for it.
    assert follower.next_step(2, "behind", ceiling=5) == Step(4, snapshot=True)
    follower.follow_to(4)
    # A ceiling at or below the active version still lets the next version be staged, never more.
    assert follower.next_step(5, "behind", ceiling=3) == Step(5)
    assert follower.next_step(5, "missing", ceiling=3) == Step(5)
    assert_holds(target, dense, 4)


def test_snapshots_false_replays_every_delta(run):
    target = target_at(run, 2)
    report = follow(run.store, target, 8, snapshots=False)
    assert report.kind == "replay" and [s.version for s in report.steps] == list(range(3, 9))
    assert_holds(target, run, 8)


def test_a_gap_in_the_chain_is_bridged_by_a_snapshot_or_refused(run):
    run.store.bucket.delete(object_names.delta(5))
    target = target_at(run, 1)
    follower = Follower(BucketChain(run.store))
    follower.attach(target)
    step = follower.next_step(2, "missing")
    assert step == Step(6, snapshot=True), "delta 5 is gone: only snapshot 6 reaches the newest version"
    follower.follow_to(8)
    assert_holds(target, run, 8)
    with pytest.raises(VersionNotFoundError):
        follow(run.store, target_at(run, 1), 8, snapshots=False)


def test_activation_only_on_the_staged_base(run):
    target = target_at(run, 3)
    follower = Follower(BucketChain(run.store))
    follower.attach(target)
    staged = follower.stage(Step(4))
    other = target_at(run, 3)
    follower2 = Follower(BucketChain(run.store))
    follower2.attach(other)
    follower2.follow_to(5)
    assert follower2.activate(staged) is False, "a version staged on 3 must not be written onto 5"
    assert_holds(other, run, 5)
    assert follower.activate(staged) is True
    assert_holds(target, run, 4)


def test_follow_to_refuses_a_target_ahead_of_the_goal(run):
    with pytest.raises(VersionNotFoundError, match="cannot go back"):
        follow(run.store, target_at(run, 5), 3)


def test_a_follower_without_a_target_says_so(run):
    follower = Follower(BucketChain(run.store))
    with pytest.raises(AuroraError, match="attach"):
        follower.stage(Step(1))
    assert not follower.offer(1, run.store.manifest(1).segments[0])


def test_offers_are_prefetched_only_for_newer_versions(run):
    from aurora_store.follow import Prefetcher
    from aurora_store.metrics import Metrics

    prefetcher = Prefetcher(2, 1 << 30, Metrics("actor", "t"))
    follower = Follower(BucketChain(run.store), prefetcher=prefetcher)
    follower.attach(target_at(run, 3))
    assert not follower.offer(3, run.store.manifest(3).segments[0]), "the active version is not prefetched"
    assert follower.offer(4, run.store.manifest(4).segments[0])
    staged = follower.stage(Step(4))
    assert follower.activate(staged)
    assert prefetcher.held_bytes() == 0
    follower.close()


def test_bootstrap_refuses_a_snapshot_whose_files_were_tampered_with(run, tmp_path):
    from tests.ops.helpers import flip_bit

    files = [k for k in run.store.list_objects("") if "snapshot" in k and k.endswith(".safetensors")
             and "000000000006" in k]
    assert files
    flip_bit(run.store, files[0])
    follower = Follower(BucketChain(run.store))
    with pytest.raises(AuroraError):
        follower.bootstrap(run.store, 8, tmp_path / "cache")
    state, _ = load_snapshot(run.store, 3, LAYOUT)  # the other snapshots are untouched
    assert digest_state(LAYOUT, state) == digest_state(LAYOUT, run.states[3])
