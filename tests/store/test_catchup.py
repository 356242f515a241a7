"""Catch-up planning: replay vs snapshot, chosen by bytes (pure function, property-tested)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.errors import VersionNotFoundError
from aurora_store.follow import plan_catch_up


def test_short_gap_replays_missed_deltas_only():
    plan = plan_catch_up(5, 8, {v: 100 for v in range(1, 9)}, {0: 10_000, 6: 10_000})
    assert plan.kind == "replay" and plan.deltas == (6, 7, 8) and plan.bytes == 300


def test_long_gap_falls_back_to_the_snapshot_when_cheaper():
    deltas = {v: 1_000 for v in range(1, 40)}
    plan = plan_catch_up(2, 39, deltas, {0: 20_000, 30: 20_000})
    assert plan.kind == "snapshot" and plan.snapshot == 30 and plan.deltas == tuple(range(31, 40))
    assert plan.bytes == 20_000 + 9 * 1_000 < plan.replay_bytes == 37 * 1_000


def test_fresh_actor_needs_a_snapshot():
    plan = plan_catch_up(None, 4, {v: 10 for v in range(1, 5)}, {0: 1000, 3: 1000})
    assert plan.kind == "snapshot" and plan.snapshot == 3 and plan.deltas == (4,)


def test_already_current_and_impossible_paths():
    assert plan_catch_up(4, 4, {}, {}).kind == "none"
    with pytest.raises(VersionNotFoundError):
        plan_catch_up(1, 5, {2: 1, 3: 1, 5: 1}, {})  # delta 4 missing, no snapshot
    with pytest.raises(VersionNotFoundError):
        plan_catch_up(6, 5, {}, {})


@given(current=st.one_of(st.none(), st.integers(0, 30)), target=st.integers(0, 30),
       present=st.sets(st.integers(1, 30)), snapshots=st.dictionaries(st.integers(0, 30), st.integers(1, 10_000)),
       size=st.integers(1, 2_000))
def test_plan_is_feasible_and_cheapest(current, target, present, snapshots, size):
    deltas = {v: size + v for v in present}
    if current is not None and current > target:
        return
    try:
        plan = plan_catch_up(current, target, deltas, snapshots)
    except VersionNotFoundError:
        # then no snapshot chain and no replay chain exists
        chains = [s for s in snapshots if s <= target and all(v in deltas for v in range(s + 1, target + 1))]
        replayable = current is not None and all(v in deltas for v in range(current + 1, target + 1))
        assert not chains and not replayable
        return
    start = plan.snapshot if plan.snapshot is not None else current
    assert plan.deltas == tuple(range(start + 1, target + 1))
    assert all(v in deltas for v in plan.deltas)
    expected = sum(deltas[v] for v in plan.deltas) + (snapshots[plan.snapshot] if plan.snapshot is not None else 0)
    assert plan.bytes == expected
    for s, sbytes in snapshots.items():  # no feasible snapshot path is cheaper
        if s <= target and (current is None or s > current) and all(v in deltas for v in range(s + 1, target + 1)):
            assert plan.bytes <= sbytes + sum(deltas[v] for v in range(s + 1, target + 1))
