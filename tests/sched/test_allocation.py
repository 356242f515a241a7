import pytest
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.errors import SchedulingError
from aurora_store.sched import ActorView, ThroughputEstimator, allocate, eligibility, refill


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
    assert est.get("newcomer") == 50  # the lower median of the measured estimates (of two: the smaller)
    assert est.decay("a") == 75
    with pytest.raises(SchedulingError):
        est.observe("a", float("nan"))


def test_refill_gives_each_prompt_to_the_least_loaded_for_its_speed():
    # b is idle and twice as fast as a: it takes prompts until its load per speed passes a's
    assert refill(5, {"a": 2, "b": 0}, {"a": 1.0, "b": 2.0}) == {"b": 5}
    assert refill(6, {"a": 2, "b": 0}, {"a": 1.0, "b": 2.0}) == {"a": 1, "b": 5}  # a tie (3.0): lower id
    assert refill(2, {}, {"x": 1.0, "y": 1.0}) == {"x": 1, "y": 1}  # ties: lower id first, then alternate
    assert refill(1, {}, {"y": 1.0, "x": 1.0}) == {"x": 1}
    assert refill(0, {}, {}) == {}
    with pytest.raises(SchedulingError):
        refill(3, {}, {})
    with pytest.raises(SchedulingError):
        refill(1, {}, {"a": 0.0})


@given(st.integers(0, 300), st.dictionaries(st.text("abc", min_size=1, max_size=3), st.floats(0.01, 1e4),
                                             min_size=1, max_size=8), st.data())
def test_refill_hands_out_exactly_the_returned_prompts(count, speed, data):
    outstanding = {a: data.draw(st.integers(0, 20)) for a in speed}
    counts = refill(count, outstanding, speed)
    assert sum(counts.values()) == count and set(counts) <= set(speed) and all(n > 0 for n in counts.values())
