"""τ_a from measured work: the estimator (EMA on settlements, capped priors, sticky exclusion decay) and the
ledger's hold windows that produce the measurements (server-clock grant → settlement, tokens from samples)."""

from __future__ import annotations

import math

import pytest

from aurora_store.bus.messages import RolloutResult
from aurora_store.errors import SchedulingError
from aurora_store.sched import ExpiryBackoff, LeasePolicy, Measurement, Prompt, StepLedger, ThroughputEstimator

DIGEST = "lthash128:" + "ab" * 16


def test_measurements_fold_in_by_ema_with_beta():
    est = ThroughputEstimator(beta=0.25, alpha=0.5)
    assert est.observe("a", 100) == 100  # first measurement replaces the (absent) prior
    assert est.observe("a", 200) == pytest.approx(0.75 * 100 + 0.25 * 200)
    assert est.observe_settlement(Measurement("a", 50, 2.0)) == pytest.approx(0.75 * 125 + 0.25 * 25)
    assert ThroughputEstimator(beta=1.0).observe("b", 7) == 7


def test_a_self_report_is_only_a_prior_capped_by_the_median_of_measurements():
    est = ThroughputEstimator()
    est.observe("a", 100)
    est.observe("b", 300)
    est.observe("c", 200)
    est.report("liar", 1e6)
    assert est.get("liar") == 200  # median of measured, not the claim
    est.report("modest", 50)
    assert est.get("modest") == 50  # honest low claims are kept
    # once measured, its claims no longer matter, however loud
    est.observe("liar", 20)
    est.report("liar", 1e6)
    assert est.get("liar") == 20
    # a report never moves a measured actor either
    est.report("a", 1e6)
    assert est.get("a") == 100


def test_before_any_measurement_a_liar_is_capped_by_the_median_report():
    est = ThroughputEstimator()
    for actor, claim in (("x", 100), ("y", 120), ("liar", 1e6)):
        est.report(actor, claim)
    shares = est.shares(24, ("liar", "x", "y"))
    assert shares["liar"] <= shares["y"] + 1


def test_lying_actor_gets_its_measured_share_after_its_first_settlement():
    est = ThroughputEstimator(beta=0.5)
    est.observe("x", 300)
    est.observe("y", 300)
    est.report("liar", 1e6)
    first = est.shares(30, ("liar", "x", "y"))
    assert first["liar"] == 5  # on probation until measured: half an equal share, whatever it claims
    est.observe("liar", 30)  # what it really did
    second = est.shares(30, ("liar", "x", "y"))
    assert second["liar"] <= math.ceil(30 * 30 / 630)  # its measured share (rounding aside)


def test_a_slowed_actor_loses_share_within_two_settlements():
    est = ThroughputEstimator(beta=0.5)
    for actor in "abc":
        est.observe(actor, 300)
    before = est.shares(24, tuple("abc"))["c"]
    est.observe("c", 50)
    est.observe("c", 50)
    after = est.shares(24, tuple("abc"))["c"]
    assert before == 8 and after <= before // 2


def test_exclusion_decay_sticks_until_measurements_raise_it():
    est = ThroughputEstimator(beta=0.5, alpha=0.25)
    est.observe("a", 400)
    est.observe("b", 400)
    assert est.decay("a") == 100
    est.report("a", 400)  # heartbeats after the rejoin do not undo the decay
    assert est.get("a") == 100  # the rejoining actor starts at the decayed estimate
    assert est.observe("a", 400) == 250  # and recovers by measured settlements, per β
    assert est.observe("a", 400) == 325


def test_a_never_measured_actor_decays_from_its_prior_and_is_not_lifted_above_its_measurement():
    est = ThroughputEstimator(beta=0.5, alpha=0.5)
    est.observe("a", 100)
    est.report("new", 80)
    assert est.decay("new") == 40
    est.report("new", 1e6)
    assert est.get("new") == 40
    assert est.observe("new", 60) == 50  # EMA from the decayed prior
    est2 = ThroughputEstimator(beta=0.5, alpha=0.9)
    est2.observe("a", 100)
    est2.report("new", 100)
    est2.decay("new")  # 90
    assert est2.observe("new", 10) == 10  # never above what was measured


def test_every_eligible_actor_keeps_a_probe_prompt_to_be_measured_again():
    est = ThroughputEstimator(alpha=0.01)
    est.observe("fast", 1000)
    est.observe("slow", 1000)
    for _ in range(3):
        est.decay("slow")
    shares = est.shares(16, ("fast", "slow"))
    assert shares == {"fast": 15, "slow": 1}
    assert sum(est.shares(1, ("fast", "slow")).values()) == 1


@pytest.mark.parametrize("beta, alpha", [(0, 0.5), (0.5, 0), (1.5, 0.5), (0.5, -1)])
def test_parameters_out_of_range_are_refused(beta, alpha):
    with pytest.raises(SchedulingError):
        ThroughputEstimator(beta=beta, alpha=alpha)


@pytest.mark.parametrize("rate", [float("nan"), float("inf"), -1.0])
def test_invalid_rates_are_refused_and_change_nothing(rate):
    est = ThroughputEstimator()
    est.observe("a", 10)
    with pytest.raises(SchedulingError):
        est.observe("a", rate)
    with pytest.raises(SchedulingError):
        est.report("b", rate)
    assert est.get("a") == 10 and "b" not in est.priors


# --- hold windows in the ledger ------------------------------------------------------------------------


def ledger(n=8, lease_ms=10_000):
    return StepLedger(1, 4, DIGEST, [Prompt(f"p{i}", f"{i}+1=") for i in range(n)], LeasePolicy(initial_ms=lease_ms),
                      max_new_tokens=64)


def result(lease, actor, ntokens, claimed=10**6):
    samples = [{"ids": list(range(ntokens)), "logprobs": [-0.1] * ntokens, "text": "x"}]
    return RolloutResult("result", lease.lease_id, actor, "", 4, DIGEST, claimed, 0.1, samples)


def test_a_window_spans_every_batch_of_an_actor_and_counts_sample_tokens():
    led = ledger()
    leases = led.grant("a", 4, now_ms=1000)
    # two batches of two: the actor's rate is 4 × 6 tokens over 2 s, not per lease
    for lease in leases[:2]:
        assert led.settle(result(lease, "a", 6), 2000).accepted
    assert led.take_measurements() == []  # still holding leases: not settled yet
    for lease in leases[2:]:
        assert led.settle(result(lease, "a", 6), 3000).accepted
    (m,) = led.take_measurements()
    assert (m.actor_id, m.tokens, m.seconds, m.tokens_per_s) == ("a", 24, 2.0, 12.0)
    assert led.take_measurements() == []


def test_windows_are_per_actor_and_reopen_on_the_next_grant():
    led = ledger()
    a, b = led.grant("a", 1, 0), led.grant("b", 1, 0)
    led.settle(result(a[0], "a", 10), 1000)
    led.settle(result(b[0], "b", 10), 4000)
    again = led.grant("a", 1, 5000)
    led.settle(result(again[0], "a", 30), 6000)
    got = [(m.actor_id, m.tokens_per_s) for m in led.take_measurements()]
    assert got == [("a", 10.0), ("b", 2.5), ("a", 30.0)]


def test_an_expired_window_measures_what_was_delivered_over_the_time_held():
    led = ledger(lease_ms=5000)
    leases = led.grant("slow", 3, 0)
    led.settle(result(leases[0], "slow", 5), 2000)
    led.expire(6000)
    (m,) = led.take_measurements()
    assert (m.tokens, m.seconds) == (5, 6.0)
    idle = led.grant("idle", 1, 10_000)
    assert idle
    led.expire(20_000)
    (m,) = led.take_measurements()
    assert m.actor_id == "idle" and m.tokens_per_s == 0


def test_returns_and_wrong_answers_measure_nothing():
    led = ledger()
    r = led.grant("leaver", 1, 0)
    assert led.give_back(r[0].lease_id, "leaver", 500)
    w = led.grant("wrong", 1, 0)
    bad = RolloutResult("result", w[0].lease_id, "wrong", "", 3, DIGEST, 5, 0.1, [{"ids": [1]}])
    assert led.settle(bad, 100).reason == "wrong_version"
    assert led.take_measurements() == []
    led.check_invariants()


def test_actors_missing_for_longer_than_the_grace_are_forgotten():
    est = ThroughputEstimator(forget_after_s=30.0)
    est.observe("stays", 100)
    est.observe("leaves", 300)
    est.report("newcomer", 50)
    assert est.seen({"stays", "leaves", "newcomer"}, now_s=0.0) == []
    assert est.seen({"stays"}, now_s=10.0) == []  # gone for less than the grace: a Redis restart, a slow beat
    assert est.seen({"stays", "leaves"}, now_s=35.0) == []  # back in time: its clock restarts
    assert est.seen({"stays"}, now_s=41.0) == ["newcomer"]  # its prior goes too
    assert est.seen({"stays"}, now_s=60.0) == []
    assert est.seen({"stays"}, now_s=72.0) == ["leaves"]  # first missed at 41
    assert est.get("stays") == 100 and "leaves" not in est.estimates and "leaves" not in est.measured
    # a forgotten actor no longer sets the median that caps a newcomer's claim
    est.report("claims", 250)
    assert est.get("claims") == 100


# --- probation and expiry backoff --------------------------------------------------------------------------


def test_of_two_reports_the_smaller_caps_the_liar_before_anything_is_measured():
    est = ThroughputEstimator()
    est.report("honest", 100)
    est.report("liar", 1e9)
    assert est.get("liar") == 100  # the lower median, not the mean of the two (5·10⁸)
    assert est.shares(20, ("honest", "liar")) == {"honest": 10, "liar": 10}


def test_unmeasured_actors_stay_on_probation_until_measured():
    est = ThroughputEstimator(probation=0.5)
    for actor in ("a", "b"):
        est.observe(actor, 100)
    for newcomer in ("n1", "n2"):
        est.report(newcomer, 1e6)
    shares = est.shares(40, ("a", "b", "n1", "n2"))
    assert shares["n1"] == shares["n2"] == 5 and shares["a"] + shares["b"] == 30 and sum(shares.values()) == 40
    est.observe("n1", 100)
    assert est.shares(40, ("a", "b", "n1", "n2"))["n1"] >= 10  # measured: a peer's share (and its part of n2's)


def test_an_actor_whose_leases_keep_expiring_is_probed_only_every_few_steps():
    backoff = ExpiryBackoff(after=2, every=4)
    for step in (1, 2):
        assert backoff.allowed("silent", step)
        backoff.settled("silent", delivered=False, expired=True)
    granted = [step for step in range(3, 16) if backoff.allowed("silent", step)]
    assert granted == [3, 7, 11, 15]  # a probe every 4 steps, not a lease expiry every step
    assert backoff.allowed("silent", 15)  # a regrant within the probing step is allowed too
    backoff.settled("silent", delivered=True, expired=True)  # it came back: full membership again
    assert all(backoff.allowed("silent", step) for step in range(16, 20))
    with pytest.raises(SchedulingError):
        ExpiryBackoff(after=0)
