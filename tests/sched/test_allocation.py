import pytest
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.errors import SchedulingError
from aurora_store.sched import ActorView, ThroughputEstimator, allocate, eligibility


def test_paper_example_h100_and_a100_split_300_into_200_and_100():
    assert allocate(300, {"h100": 5000.0, "a100": 2500.0}) == {"h100": 200, "a100": 100}


@given(st.integers(0, 5000), st.dictionaries(st.text("abcdef", min_size=1, max_size=4),
                                              st.floats(0, 1e5, allow_nan=False), min_size=1, max_size=12))
def test_allocation_sums_to_batch_is_proportional_and_deterministic(batch, rates):
    shares = allocate(batch, rates)
    assert sum(shares.values()) == batch
    assert shares == allocate(batch, dict(reversed(list(rates.items()))))
    total = sum(rates.values())
    for actor_id, n in shares.items():
        exact = batch * rates[actor_id] / total if total > 0 else batch / len(rates)
        assert exact - 1 < n < exact + 1


def test_allocation_errors():
    with pytest.raises(SchedulingError):
        allocate(4, {})
    assert allocate(0, {}) == {}
    with pytest.raises(SchedulingError):
        allocate(-1, {"a": 1.0})


def test_eligibility_is_version_aware():
    actors = {
        "on_v": ActorView("on_v", 7, None),
        "staged": ActorView("staged", 6, 7),
        "staging": ActorView("staging", 6, None, 7),
        "behind_unstaged": ActorView("behind_unstaged", 6, None),
        "far_behind": ActorView("far_behind", 4, 5),
        "fresh": ActorView("fresh", None, None),
    }
    e = eligibility(actors, 7)
    assert e.ready == ("on_v",) and e.need_commit == ("staged", "staging")
    assert set(e.excluded) == {"behind_unstaged", "far_behind", "fresh"}
    assert e.eligible == ("on_v", "staged", "staging")


def test_estimator_ema_decay_and_newcomers():
    est = ThroughputEstimator(beta=0.5, alpha=0.5)
    assert est.get("new") == 1.0
    est.observe("a", 100)
    est.observe("a", 200)
    assert est.get("a") == 150
    est.observe("b", 50)
    assert est.get("newcomer") == 100  # median of the measured estimates
    assert est.decay("a") == 75
    with pytest.raises(SchedulingError):
        est.observe("a", float("nan"))
