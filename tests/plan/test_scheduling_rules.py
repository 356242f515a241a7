"""`aurora plan` runs the trainer's scheduler (`aurora_store.sched`), not a copy of it: change a rule there and
the plan changes with it. Each test swaps one rule for a different one (not a fault: another policy) and checks
the simulated deployment follows."""

from __future__ import annotations

from aurora_store import sched
from aurora_store.plan.sim import simulate
from tests.plan.test_plan import BASE, plan

SLOW = {"name": "au", "actors": 4, "tokens_per_s": 2000.0, "link_mbit": 20.0, "rtt_ms": 200.0}


def test_eligibility_is_the_schedulers(monkeypatch):
    p = plan(regions=[*BASE["regions"], SLOW])
    steady = simulate(p).steps[3:]
    assert all(s.excluded == 4 for s in steady)  # D_v is never staged in au in time: it sits the steps out
    real = sched.eligibility

    def on_the_previous_version_is_enough(actors, version):  # a looser rule: no need to have D_v staged
        views = {a: sched.ActorView(v.actor_id, v.active_version, version if v.active_version == version - 1
                                    else v.staged_version) for a, v in actors.items()}
        return real(views, version)

    monkeypatch.setattr(sched, "eligibility", on_the_previous_version_is_enough)
    loose = simulate(p).steps[3:]
    assert all(s.excluded == 0 for s in loose) and all(s.need_commit >= 4 for s in loose)


def test_shares_are_the_estimators(monkeypatch):
    p = plan()
    generation = 512 * 2000 / (8 * 2000)  # the batch over all eight actors
    assert simulate(p).step_s < 1.5 * generation

    def everything_to_one(self, batch, eligible):
        return {a: (batch if i == 0 else 0) for i, a in enumerate(eligible)}

    monkeypatch.setattr(sched.ThroughputEstimator, "shares", everything_to_one)
    assert simulate(p).step_s > 7 * generation  # one actor generates the whole batch


def test_self_reports_are_capped_priors_as_the_estimator_says(monkeypatch):
    # One actor in eight claims (and has) four times its peers' rate: the estimator caps its prior at the median
    # claim, so its first share is no bigger than anyone's; measured settlements then raise it.
    fast = {"name": "fast", "actors": 1, "tokens_per_s": 8000.0}
    p = plan(regions=[*BASE["regions"][:1], dict(BASE["regions"][1], actors=7), fast], steps=8)
    capped = simulate(p)
    monkeypatch.setattr(sched.ThroughputEstimator, "get", lambda self, actor_id: self.priors.get(
        actor_id, self.estimates.get(actor_id, 1.0)))  # a rule that believes every claim
    believed = simulate(p)
    assert believed.steps[0].collected_s < capped.steps[0].collected_s  # the fast actor's due share at once


def test_lease_durations_are_the_lease_policys(monkeypatch):
    spot = dict(BASE["regions"][1], spot=True)
    p = plan(regions=[BASE["regions"][0], spot], preempt_per_hour=2.0, steps=30, seed=3)
    base = simulate(p)
    assert base.preemptions > 0
    real = sched.LeasePolicy.duration_ms
    monkeypatch.setattr(sched.LeasePolicy, "duration_ms", lambda self: 3 * real(self))
    longer = simulate(p)
    # a preempted actor's prompts come back only when its leases expire: three times later
    assert longer.step_s > base.step_s + 20
