"""The control-plane load test at N=10 against a real Valkey, and the dispatcher's round trips at scale."""

from __future__ import annotations

import time
from collections import Counter

from aurora_store.bus import ActorState, ControlPlane
from aurora_store.metrics import Metrics
from aurora_store.sched import LeasePolicy, Prompt
from aurora_store.testing.members import Member, admission_secret
from benchmarks.control_plane import growth, run_one
from workers.trainer.dispatch import Dispatcher


def test_load_test_ten_actors_is_safe():
    run = run_one(10, steps=3, bad_rate=0.2, vanish=0.1, seed=1)
    assert run["lost_leases"] == 0 and run["duplicate_leases"] == 0 and run["wrong_accepts"] == 0
    # the forgeries, resends and unknown leases were really sent, and every one of them was rejected
    injected = run["injected"]
    assert injected["forged"] + injected["resent"] + injected["unknown_lease"] > 0
    assert run["rejected"].get("bad_signature", 0) == injected["forged"]
    assert run["rejected"].get("unknown_lease", 0) == injected["unknown_lease"]
    assert run["rejected"].get("duplicate", 0) + run["rejected"].get("not_active", 0) >= injected["resent"]
    # the vanished actor's leases expired and were re-granted to others
    assert run["vanished"] == 1 and run["leases_expired"] >= 1
    assert run["leases_granted"] == 3 * 20 + run["leases_expired"]
    for key in ("dispatch_p50_ms", "dispatch_p99_ms", "settles_per_s", "redis_cmds_per_s", "redis_memory_bytes"):
        assert run[key] > 0


def test_growth_is_the_log_log_slope():
    runs = [{"actors": n, "dispatch_p50_ms": 2.0 * n, "settles_per_s": 5.0, "redis_memory_bytes": n * n}
            for n in (10, 100, 1000)]
    slopes = growth(runs)
    assert abs(slopes["dispatch_p50_ms"] - 1) < 1e-9 and abs(slopes["settles_per_s"]) < 1e-9
    assert abs(slopes["redis_memory_bytes"] - 2) < 1e-9 and slopes["redis_cmds_per_s"] is None


def _actors(plane: ControlPlane, n: int) -> dict[str, Member]:
    members = {}
    for i in range(n):
        state = ActorState(f"a{i:03d}", "home", "sim", 0, "d0", None, 100.0 + i, 0, "ready", 1, "regional")
        members[state.actor_id] = member = Member(state.actor_id, plane.run)
        member.register(plane, state)
    return members


class Counted:
    """Counts the Redis round trips a ControlPlane makes (every call goes through ``_redis.call``)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.n = 0
        inner = plane._redis.call

        def call(fn, **kw):
            self.n += 1
            return inner(fn, **kw)
        plane._redis.call = call


def test_dispatch_round_trips_do_not_grow_with_actors(redis_url):
    trips = {}
    for n in (5, 80):
        plane = ControlPlane(redis_url, f"rt{n}")
        _actors(plane, n)
        dispatcher = Dispatcher(plane, "home", "t", LeasePolicy(), admission_secret=admission_secret(),
                                metrics=Metrics("trainer", f"rt{n}", "home"))
        counted = Counted(plane)
        ledger = dispatcher.start_step(1, 0, "d0", [Prompt(f"p{i}", "x") for i in range(3 * n)], group_size=1,
                                       max_new_tokens=4)
        trips[n] = counted.n
        per_actor = Counter(r.actor_id for r in ledger.leases.values())
        for actor_id, count in per_actor.items():  # every actor's work stream holds exactly its share
            assert len(plane.read_work(actor_id, "0", block_ms=None)) == count
        assert sum(per_actor.values()) == 3 * n
        plane.close()
    assert trips[80] == trips[5] <= 6


def test_regrant_and_settle_batch_round_trips(redis_url):
    plane = ControlPlane(redis_url, "regrant")
    members = _actors(plane, 40)
    dispatcher = Dispatcher(plane, "home", "t", LeasePolicy(initial_ms=1, min_ms=1),
                            admission_secret=admission_secret(), metrics=Metrics("trainer", "regrant", "home"))
    ledger = dispatcher.start_step(1, 0, "d0", [Prompt(f"p{i}", "x") for i in range(80)], group_size=1,
                                   max_new_tokens=4)
    first = {r.lease.prompt_id: r.actor_id for r in ledger.leases.values()}
    time.sleep(0.01)  # past every 1 ms lease on the server clock
    # a third of the results arrive (on time is impossible: 1 ms leases); the rest expire and are re-granted
    for record in list(ledger.leases.values())[:30]:
        plane.send_result(members[record.actor_id].result(record.lease))
    counted = Counted(plane)
    dispatcher.pump(ledger, block_ms=100)
    assert dispatcher.stats.results_received == 30 and ledger.rejected["late"] == 30
    assert dispatcher.stats.expired == 80 and len(ledger.pool) == 0
    regranted = [r for r in ledger.leases.values() if r.state == "active"]
    assert len(regranted) == 80 and {r.lease.prompt_id for r in regranted} == set(first)
    # least outstanding work per unit of speed first: 80 prompts over 40 actors → two each
    assert set(Counter(r.actor_id for r in regranted).values()) == {2}
    # read + drain + one log batch + ack + now + actors + commit + now + grants: not one per result or lease
    assert counted.n <= 12
    settles = [e for e in plane.run_log() if e["kind"] == "settle"]
    assert len(settles) == 30 and all(e["reason"] == "late" for e in settles)
    plane.close()
