"""The trainer's dispatcher against a real Redis: only admitted actors get work, and only their own signed answers
count; actors that depart (deregister, or stop heartbeating) are forgotten by the throughput estimator once the
grace has passed; live ones keep their measured estimates."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from aurora_store.bus import ControlPlane
from aurora_store.bus.messages import ActorState
from aurora_store.errors import NoEligibleActors
from aurora_store.sched import LeasePolicy, Prompt, ThroughputEstimator
from aurora_store.testing.members import Member, admission_secret
from workers.trainer.cli import parse_args
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


def test_a_quorum_holds_the_step_until_enough_actors_are_eligible_then_splits_among_them(redis_url):
    plane = ControlPlane(redis_url, "dispatch-quorum")
    dispatcher = Dispatcher(plane, "eu", "trainer-test", LeasePolicy(), admission_secret=admission_secret())
    prompts = [Prompt(f"p{i}", "1+1=") for i in range(6)]
    first = Member("first", plane.run)
    first.register(plane)

    def late_join() -> None:
        time.sleep(1.0)
        Member("second", plane.run).register(plane)

    joiner = threading.Thread(target=late_join)
    started = time.monotonic()
    joiner.start()
    ledger = dispatcher.start_step(1, 0, "d0", prompts, group_size=2, max_new_tokens=3, wait_s=30, quorum=2)
    waited = time.monotonic() - started
    joiner.join()
    holders = {r.actor_id for r in ledger.leases.values()}
    assert waited >= 1.0 and holders == {"first", "second"}, (waited, holders)


def test_a_quorum_that_never_comes_goes_ahead_with_those_there_after_the_wait(redis_url, caplog):
    plane = ControlPlane(redis_url, "dispatch-no-quorum")
    dispatcher = Dispatcher(plane, "eu", "trainer-test", LeasePolicy(), admission_secret=admission_secret())
    Member("alone", plane.run).register(plane)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="aurora.trainer.dispatch"):
        ledger = dispatcher.start_step(1, 0, "d0", [Prompt("p0", "1+1=")], group_size=2, max_new_tokens=3,
                                       wait_s=1.0, quorum=3)
    assert time.monotonic() - started >= 1.0
    assert {r.actor_id for r in ledger.leases.values()} == {"alone"}
    assert any("1 of 3 actors eligible" in r.getMessage() for r in caplog.records)


def test_no_actor_at_all_is_still_an_error_and_a_quorum_below_one_is_refused(redis_url):
    plane = ControlPlane(redis_url, "dispatch-nobody")
    dispatcher = Dispatcher(plane, "eu", "trainer-test", LeasePolicy(), admission_secret=admission_secret())
    with pytest.raises(NoEligibleActors, match="no actor became eligible"):
        dispatcher.start_step(1, 0, "d0", [Prompt("p0", "1+1=")], group_size=2, max_new_tokens=3, wait_s=0.5,
                              quorum=2)
    Member("present", plane.run).register(plane)
    with pytest.raises(ValueError, match="quorum of at least one"):  # not a step granted to nobody
        dispatcher.start_step(1, 0, "d0", [Prompt("p0", "1+1=")], group_size=2, max_new_tokens=3, quorum=0)


def test_the_trainer_takes_min_actors_and_refuses_less_than_one(capsys):
    base = ["--bucket", "b", "--redis", "redis://127.0.0.1:1/0", "--checkpoint-dir", "c"]
    assert parse_args(base).min_actors == 1
    assert parse_args([*base, "--min-actors", "3"]).min_actors == 3
    with pytest.raises(SystemExit):
        parse_args([*base, "--min-actors", "0"])
    assert "--min-actors must be at least 1" in capsys.readouterr().err
