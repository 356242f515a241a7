"""The lease ledger as a state machine: grants, expiries, returns and settlements in any order keep every
prompt exactly once and accept only results that satisfy the predicate."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aurora_store.bus.identity import ActorKey
from aurora_store.sched import LeasePolicy, Prompt, StepLedger
from aurora_store.testing.members import Member

DIGEST = "lthash128:" + "ab" * 16
OTHER = "lthash128:" + "cd" * 16
RUN = "ledger"
MEMBERS = {a: Member(a, RUN, secret="s" * 16) for a in ("a", "b", "c", "x", "y", "dead", "alive", "slow", "other",
                                                         "leaver", "stayer")}


def make(n=4, vocab_size=None):
    return StepLedger(3, 10, DIGEST, [Prompt(f"p{i}", f"{i}+1=") for i in range(n)],
                      LeasePolicy(initial_ms=100), group_size=2, max_new_tokens=4, run=RUN, vocab_size=vocab_size,
                      key_of=lambda actor: MEMBERS[actor].key.public if actor in MEMBERS else None)


def result(lease, actor, version=10, digest=DIGEST, samples=None):
    return MEMBERS[actor].result(lease, samples, version=version, digest=digest)


def test_results_signed_by_another_key_or_unregistered_are_refused():
    ledger = make()
    (a,) = ledger.grant("x", 1, now_ms=1000)
    forged = ActorKey.generate().signed(RUN, result(a, "x"))  # the right fields, somebody else's signature
    assert ledger.settle(forged, 1010).reason == "bad_signature"
    other_run = Member("x", "another-run", secret="s" * 16, key=MEMBERS["x"].key).result(a)
    assert ledger.settle(other_run, 1010).reason == "bad_signature"  # signatures are bound to the run
    (n,) = ledger.grant("nobody", 1, now_ms=1000)  # granted while it had no admitted key
    assert ledger.settle(Member("nobody", RUN, secret="s" * 16).result(n), 1010).reason == "unregistered"
    assert ledger.settle(result(n, "x"), 1010).reason == "wrong_actor"
    assert ledger.settle(result(a, "x"), 1020).accepted
    assert ledger.counters()["rejected_bad_signature"] == 2


def test_results_that_the_lease_could_not_have_produced_are_refused_and_the_prompt_repooled():
    ledger = make(8, vocab_size=50)
    leases = ledger.grant("x", 8, now_ms=1000)
    ok = [{"ids": [1, 2], "logprobs": [-0.1, -0.2], "text": "3"}] * 2
    bad = {
        "group too small": ok[:1],
        "group too large": ok * 2,
        "too many tokens": [{"ids": [1] * 5, "logprobs": [-0.1] * 5, "text": ""}] * 2,
        "id outside the vocabulary": [{"ids": [50], "logprobs": [-0.1], "text": ""}] * 2,
        "logprobs length": [{"ids": [1, 2], "logprobs": [-0.1], "text": ""}] * 2,
        "positive logprob": [{"ids": [1], "logprobs": [0.5], "text": ""}] * 2,
        "missing ids": [{"logprobs": [], "text": ""}] * 2,
    }
    for lease, (what, samples) in zip(leases, bad.items()):
        assert ledger.settle(result(lease, "x", samples=samples), 1010).reason == "bad_shape", what
    assert ledger.settle(result(leases[-1], "x", samples=ok), 1010).accepted
    assert len(ledger.pool) == len(bad)  # every refused prompt is back in the pool at once
    (m,) = ledger.take_measurements()
    assert m.tokens == 4  # the well-shaped result's tokens only: refused samples are never measured
    ledger.check_invariants()


def test_reject_takes_back_an_accepted_result_and_repools_its_prompt():
    ledger = make(1)
    (lease,) = ledger.grant("x", 1, now_ms=0)
    assert ledger.settle(result(lease, "x"), 10).accepted and ledger.complete
    verdict = ledger.reject(lease.prompt_id, "logprob_mismatch")
    assert not verdict.accepted and verdict.reason == "logprob_mismatch"
    assert not ledger.complete and list(ledger.pool) == [lease.prompt_id]
    assert ledger.rejected["logprob_mismatch"] == 1
    ledger.check_invariants()
    assert ledger.settle(result(lease, "x"), 20).reason == "not_active"  # the same answer cannot come back


def test_predicate_accepts_only_on_time_right_version_right_digest():
    ledger = make()
    a, b, c, d = ledger.grant("x", 4, now_ms=1000)
    assert ledger.settle(result(a, "x"), 1050).accepted
    assert ledger.settle(result(b, "x"), 1101).reason == "late"
    assert ledger.settle(result(c, "x", version=9), 1050).reason == "wrong_version"
    assert ledger.settle(result(d, "x", digest=OTHER), 1050).reason == "wrong_digest"
    assert ledger.settle(result(a, "x"), 1060).reason == "duplicate"
    assert ledger.settle(result(c, "y"), 1050).reason == "wrong_actor"
    assert ledger.settle(ActorKey.generate().signed(RUN, result(c, "x")), 1050).reason == "bad_signature"
    assert ledger.settle(None, 1050).reason == "malformed"
    assert ledger.settle(None, 1050, "oversized").reason == "oversized"
    ledger.check_invariants()
    assert ledger.counters()["accepted"] == 1 and ledger.counters()["rejected"] == 8


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
