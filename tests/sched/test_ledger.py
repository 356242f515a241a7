"""The lease ledger as a state machine: grants, expiries, returns and settlements in any order keep every
prompt exactly once and accept only results that satisfy the predicate."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aurora_store.bus.messages import RolloutResult
from aurora_store.sched import LeasePolicy, Prompt, StepLedger

DIGEST = "lthash128:" + "ab" * 16
OTHER = "lthash128:" + "cd" * 16


def make(n=4):
    return StepLedger(3, 10, DIGEST, [Prompt(f"p{i}", f"{i}+1=") for i in range(n)],
                      LeasePolicy(initial_ms=100), token_of=lambda actor: f"tok-{actor}")


def result(lease, actor, version=10, digest=DIGEST, token=None):
    return RolloutResult("result", lease.lease_id, actor, token or f"tok-{actor}", version, digest, 5, 0.1, [])


def test_predicate_accepts_only_on_time_right_version_right_digest():
    ledger = make()
    a, b, c, d = ledger.grant("x", 4, now_ms=1000)
    assert ledger.settle(result(a, "x"), 1050).accepted
    assert ledger.settle(result(b, "x"), 1101).reason == "late"
    assert ledger.settle(result(c, "x", version=9), 1050).reason == "wrong_version"
    assert ledger.settle(result(d, "x", digest=OTHER), 1050).reason == "wrong_digest"
    assert ledger.settle(result(a, "x"), 1060).reason == "duplicate"
    assert ledger.settle(result(c, "y"), 1050).reason == "wrong_actor"
    assert ledger.settle(result(c, "x", token="forged"), 1050).reason == "bad_token"
    assert ledger.settle(None, 1050).reason == "malformed"
    ledger.check_invariants()
    assert ledger.counters()["accepted"] == 1 and ledger.counters()["rejected"] == 7


def test_expired_leases_return_to_the_pool_and_are_reissued():
    ledger = make(2)
    first = ledger.grant("dead", 2, now_ms=0)
    assert ledger.grant("alive", 2, now_ms=50) == []  # everything is leased
    assert len(ledger.expire(now_ms=101)) == 2
    again = ledger.grant("alive", 2, now_ms=102)
    assert {x.prompt_id for x in again} == {x.prompt_id for x in first}
    for lease in again:
        assert ledger.settle(result(lease, "alive"), 150).accepted
    assert ledger.complete
    assert ledger.settle(result(first[0], "dead"), 99).reason == "duplicate"


def test_on_time_result_read_after_the_expiry_sweep_is_still_accepted_once():
    ledger = make(1)
    (lease,) = ledger.grant("slow", 1, now_ms=0)
    ledger.expire(now_ms=200)  # sweep ran before the result (stamped 90 by the server) was read
    (regrant,) = ledger.grant("other", 1, now_ms=201)
    assert ledger.settle(result(lease, "slow"), 90).accepted
    assert ledger.settle(result(regrant, "other"), 250).reason == "duplicate"
    ledger.check_invariants()


def test_graceful_return_repools_immediately():
    ledger = make(2)
    leases = ledger.grant("leaver", 2, now_ms=0)
    assert all(ledger.give_back(lease.lease_id, "leaver") for lease in leases)
    assert len(ledger.grant("stayer", 5, now_ms=1)) == 2
    assert not ledger.give_back(leases[0].lease_id, "leaver")  # already returned


def test_lease_duration_tracks_the_median_completion_time():
    policy = LeasePolicy(factor=2.5, initial_ms=60_000, min_ms=10)
    assert policy.duration_ms() == 60_000
    for ms in (100, 200, 300):
        policy.observe(ms)
    assert policy.duration_ms() == 500


class LedgerMachine(RuleBasedStateMachine):
    @initialize(n=st.integers(1, 6))
    def setup(self, n):
        self.ledger = make(n)
        self.now = 0
        self.issued = []

    @rule(actor=st.sampled_from(["a", "b", "c"]), count=st.integers(1, 3))
    def grant(self, actor, count):
        self.issued += [(lease, actor) for lease in self.ledger.grant(actor, count, self.now)]

    @rule(dt=st.integers(1, 80))
    def tick(self, dt):
        self.now += dt

    @rule()
    def expire(self):
        self.ledger.expire(self.now)

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), delay=st.integers(-50, 50), version=st.sampled_from([10, 10, 9]),
          digest=st.sampled_from([DIGEST, DIGEST, OTHER]))
    def settle(self, data, delay, version, digest):
        lease, actor = data.draw(st.sampled_from(self.issued))
        arrival = max(self.now + delay, 0)
        verdict = self.ledger.settle(result(lease, actor, version, digest), arrival)
        if verdict.accepted:
            assert arrival <= lease.expires_ms and version == lease.version and digest == lease.weights_digest

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def give_back(self, data):
        lease, actor = data.draw(st.sampled_from(self.issued))
        self.ledger.give_back(lease.lease_id, actor)

    @invariant()
    def no_prompt_lost_or_counted_twice(self):
        self.ledger.check_invariants()
        c = self.ledger.counters()
        assert c["accepted"] == len(self.ledger.accepted) <= len(self.ledger.prompts)


TestLedgerMachine = LedgerMachine.TestCase
