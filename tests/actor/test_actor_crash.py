"""An actor whose background loop dies of an unexpected error must not linger as a zombie (registered,
heartbeating, never moving to a new version): it leaves — handing its leases back — and exits non-zero
for its supervisor to restart. The bug is injected (a real one cannot be produced on demand); the
trainer, Redis, bucket and the other actor are real processes."""

from __future__ import annotations

import threading

import pytest

from workers.actor.actor import Actor
from workers.actor.cli import parse_args
from workers.chaos.harness import fast_spec
from workers.cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_an_actor_whose_stager_crashes_leaves_and_exits_non_zero(tmp_path):
    spec = fast_spec(tmp_path, steps=6, actors={"us-east": 1}, actor_args=["--sim-tokens-per-s", "400"])
    with LocalCluster(spec) as cluster:
        cluster.wait_for(lambda: cluster.trainer_version() >= 1, 120, "version 1")
        actor = Actor(parse_args([
            "--bucket", cluster.buckets["us-east"], "--region", "us-east", "--id", "crashy",
            "--engine", spec.engine, "--cache-dir", str(tmp_path / "cache" / "crashy"),
            *cluster.commands.common("actor"), *cluster.commands.trust]))

        def bug(step, **_):
            raise RuntimeError(f"injected bug while staging {step.version}")

        actor.follower.stage = bug  # type: ignore[method-assign]
        codes: list[int] = []
        thread = threading.Thread(target=lambda: codes.append(actor.run()), daemon=True)
        thread.start()
        thread.join(timeout=120)
        assert codes == [3], f"the actor did not exit with the crash code: {codes}"
        assert actor.crashed and "injected bug" in actor.crashed
        log = cluster.plane.run_log()
        crash = [e for e in log if e.get("kind") == "actor_crash"]
        assert crash and crash[0]["actor"] == "crashy" and crash[0]["loop"] == "stager"
        assert any(e.get("kind") == "actor_leave" and e.get("actor") == "crashy" for e in log)
        assert "crashy" not in cluster.plane.actors()
        summary = cluster.wait_trainer_done(300)  # nothing it held was lost: the run completes without it
    assert summary["steps"] == 6 and summary["rollouts_accepted"] == 6 * spec.batch_size
