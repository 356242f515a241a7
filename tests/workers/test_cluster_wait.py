"""LocalCluster.wait_actors_on against a real Valkey: it judges one read of the actor set, so an actor that
registers while it waits, still on its bootstrap version, keeps it waiting."""

from __future__ import annotations

import threading
import time

import pytest

from aurora_store.bus import ActorState
from aurora_store.bus.identity import Credentials
from workers.cluster import ClusterSpec, LocalCluster

pytestmark = pytest.mark.redis


def _state(actor_id: str, version: int) -> ActorState:
    return ActorState(actor_id=actor_id, region="us-east", engine="torch", active_version=version,
                      active_digest="lthash128:" + "0" * 32, staged_version=None, tokens_per_s=1.0, leases=0,
                      status="ready", heartbeat_ms=1, source="regional")


@pytest.fixture()
def cluster(tmp_path, redis_server, redis_url):
    cluster = LocalCluster(ClusterSpec(tmp_path, run="wait"), redis=redis_server)
    cluster.actor_ids = ["a", "b"]
    cluster.connect()
    return cluster


def test_waits_for_every_started_actor_on_the_version(cluster):
    cluster.plane.register_actor(_state("a", 3), Credentials())
    seen: list[int] = []

    def late_actor() -> None:
        time.sleep(0.4)
        cluster.plane.register_actor(_state("b", 0), Credentials())  # registered, not yet caught up
        seen.append(0)
        time.sleep(0.6)
        cluster.plane.heartbeat_actor(_state("b", 3), Credentials())
        seen.append(3)

    thread = threading.Thread(target=late_actor)
    thread.start()
    states = cluster.wait_actors_on(3, 10)
    thread.join()
    assert seen == [0, 3]
    assert {a: s.active_version for a, s in states.items()} == {"a": 3, "b": 3}


def test_an_actor_behind_times_out_with_what_was_awaited(cluster):
    cluster.plane.register_actor(_state("a", 3), Credentials())
    cluster.plane.register_actor(_state("b", 2), Credentials())
    with pytest.raises(TimeoutError, match=r"actors \['a', 'b'\] active on v3"):
        cluster.wait_actors_on(3, 0.5)
    assert cluster.wait_actors_on(3, 1, actors=["a"])["b"].active_version == 2  # only those named are awaited
