"""The trainer's dispatcher against a real Redis: only admitted actors get work, and only their own signed answers
count; actors that depart (deregister, or stop heartbeating) are forgotten by the throughput estimator once the
grace has passed; live ones keep their measured estimates."""

from __future__ import annotations

import time

from aurora_store.bus import ControlPlane
from aurora_store.bus.messages import ActorState
from aurora_store.sched import LeasePolicy, Prompt, ThroughputEstimator
from aurora_store.testing.members import Member, admission_secret
from workers.trainer.dispatch import Dispatcher


def state(actor_id: str) -> ActorState:
    return ActorState(actor_id, "eu", "torch", 0, None, None, 100.0, 0, "ready", 0, "regional")


def test_departed_actors_are_forgotten_after_the_grace(redis_url):
    plane = ControlPlane(redis_url, "dispatch-forget", heartbeat_ttl_s=1)
    estimator = ThroughputEstimator(forget_after_s=0.5)
    dispatcher = Dispatcher(plane, "eu", "trainer-test", LeasePolicy(), estimator, admission_secret=admission_secret())
    members = {a: Member(a, plane.run) for a in ("stays", "leaves", "vanishes")}
    for actor_id, member in members.items():
        plane.register_actor(state(actor_id), member.credentials)
    assert set(dispatcher.live_actors()) == {"stays", "leaves", "vanishes"}
    for actor_id, rate in (("stays", 100.0), ("leaves", 300.0), ("vanishes", 500.0)):
        estimator.observe(actor_id, rate)
    plane.deregister_actor("leaves", "eu")  # a graceful leave; "vanishes" just stops heartbeating
    assert "leaves" not in dispatcher.live_actors() and "leaves" in estimator.estimates  # within the grace
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and ("leaves" in estimator.estimates or "vanishes" in estimator.estimates):
        plane.heartbeat_actor(state("stays"), members["stays"].credentials)
        assert "stays" in dispatcher.live_actors()
        time.sleep(0.1)
    assert set(estimator.estimates) == {"stays"} and estimator.get("stays") == 100.0
    # a departed actor's key is still known: a late result or hand-back of its leases is still its own
    assert dispatcher.key_of("leaves") == members["leaves"].key.public


def test_only_admitted_actors_get_work_and_only_their_own_signed_answers_count(redis_url):
    plane = ControlPlane(redis_url, "dispatch-admission")
    dispatcher = Dispatcher(plane, "eu", "trainer-test", LeasePolicy(), admission_secret=admission_secret())
    honest = Member("honest", plane.run)
    honest.register(plane)
    outsider = Member("outsider", plane.run, secret="a guess at the admission secret")
    outsider.register(plane)
    assert set(dispatcher.live_actors()) == {"honest"} and dispatcher.stats.unadmitted == 1
    ledger = dispatcher.start_step(1, 0, "d0", [Prompt(f"p{i}", "1+1=") for i in range(2)], group_size=2,
                                   max_new_tokens=3, wait_s=5)
    first, second = (r.lease for r in ledger.leases.values())
    impostor = Member("honest", plane.run, key=outsider.key)
    plane.send_result(impostor.hand_back(first))  # would take the honest actor's work away
    plane.send_result(impostor.result(first))
    plane.send_result(honest.result(second))
    dispatcher.pump(ledger, block_ms=200)
    assert ledger.rejected["bad_signature"] == 1 and dispatcher.stats.returned == 0
    assert list(ledger.accepted) == [second.prompt_id] and ledger.leases[first.lease_id].state == "active"
