"""The part-5 statistics (:mod:`benchmarks.wan_bench.stats`): known inputs give known intervals; properties."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.errors import BenchmarkError
from benchmarks.wan_bench.stats import StatsError, ratio_of_means, summarize, t975


def test_t_quantiles():
    assert t975(1) == 12.706
    assert t975(4) == 2.776
    assert t975(4.9) == 2.776  # fractional degrees of freedom round down (wider)
    assert t975(30) == 2.042
    assert t975(1000) == 1.960 and t975(math.inf) == 1.960
    with pytest.raises(StatsError):
        t975(0.5)


def test_summary():
    s = summarize([1.0, 2.0, 3.0, 10.0])
    assert (s.n, s.mean, s.median, s.min, s.max) == (4, 4.0, 2.5, 1.0, 10.0)
    assert s.stdev == pytest.approx(statistics.stdev([1.0, 2.0, 3.0, 10.0]))
    assert summarize([5.0]).stdev == 0.0
    with pytest.raises(StatsError):
        summarize([])


def test_rounds_method_by_hand():
    # three rounds, two intervals per mode each: round means x̄ = 11, 10, 12 and ȳ = 10, 10, 10
    num = [[10.0, 12.0], [9.0, 11.0], [12.0, 12.0]]
    den = [[10.0, 10.0], [9.0, 11.0], [10.0, 10.0]]
    ci = ratio_of_means(num, den)
    assert ci.method == "rounds" and ci.units == 3 and ci.df == 2
    assert ci.point == pytest.approx(1.1)
    # residuals x̄ − 1.1 ȳ = 0, −1, 1; se = sqrt(2 / 2 / 3) / 10; half-width = 4.303 · se
    half = 4.303 * math.sqrt(1 / 3) / 10
    assert ci.low == pytest.approx(1.1 - half) and ci.high == pytest.approx(1.1 + half)
    assert ci.half_width == pytest.approx(half / 1.1)


def test_drift_shared_by_a_round_cancels():
    """Every round is slower than the last (a machine getting busier), by the same factor for both modes: the
    ratio is exact and its interval has no width — which an unpaired treatment would not give."""
    num = [[1.1 * d, 1.1 * d] for d in (5.0, 7.0, 9.0, 11.0)]
    den = [[d, d] for d in (5.0, 7.0, 9.0, 11.0)]
    ci = ratio_of_means(num, den)
    assert ci.point == pytest.approx(1.1)
    assert ci.high - ci.low == pytest.approx(0.0, abs=1e-12)


def test_unequal_counts_keep_the_pooled_ratio():
    num = [[10.0], [12.0, 12.0, 12.0], [11.0, 11.0]]
    den = [[10.0, 10.0], [10.0], [9.0, 11.0, 10.0]]
    ci = ratio_of_means(num, den)
    pooled = statistics.fmean([10.0, 12.0, 12.0, 12.0, 11.0, 11.0]) / statistics.fmean([10.0, 10.0, 10.0, 9.0,
                                                                                     11.0, 10.0])
    assert ci.point == pytest.approx(pooled)
    assert ci.low < ci.point < ci.high


def test_one_round_uses_the_intervals_welch():
    num = [[10.0, 11.0, 12.0, 11.0]]
    den = [[10.0, 10.0, 10.0, 10.0, 10.0, 10.0]]
    ci = ratio_of_means(num, den)
    assert ci.method == "intervals" and ci.units == 4
    # the denominator has no spread: the numerator's relative standard error alone, with n − 1 = 3 df
    rse = statistics.stdev(num[0]) / 2 / 11.0
    assert ci.df == pytest.approx(3.0)
    assert ci.point == pytest.approx(1.1)
    assert ci.high - ci.point == pytest.approx(3.182 * 1.1 * rse)


def test_errors():
    with pytest.raises(StatsError):
        ratio_of_means([[1.0]], [[1.0], [1.0]])
    with pytest.raises(StatsError):
        ratio_of_means([[], []], [[1.0], []])
    with pytest.raises(StatsError):
        ratio_of_means([[1.0]], [[1.0]])  # one interval each: no spread at all
    with pytest.raises(StatsError):
        ratio_of_means([[1.0, 2.0]], [[0.0, 0.0]])
    with pytest.raises(BenchmarkError):  # rooted in the benchmarks' error
        ratio_of_means([[math.nan, 1.0]], [[1.0, 1.0]])
    assert issubclass(StatsError, ValueError)


_interval = st.floats(min_value=0.5, max_value=60.0, allow_nan=False)
_round = st.lists(_interval, min_size=2, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=8).flatmap(
    lambda k: st.tuples(st.lists(_round, min_size=k, max_size=k), st.lists(_round, min_size=k, max_size=k))))
def test_point_inside_its_interval(rounds):
    num, den = rounds
    ci = ratio_of_means(num, den)
    assert ci.low <= ci.point <= ci.high
    assert ci.point == pytest.approx(statistics.fmean([v for r in num for v in r])
                                     / statistics.fmean([v for r in den for v in r]))
    assert ci.half_width >= 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_round, _round), min_size=3, max_size=8), st.floats(min_value=0.1, max_value=10.0))
def test_scale_invariant(rounds, scale):
    """Measuring in other units (or on a uniformly slower machine) moves neither the point nor the interval."""
    num, den = [r[0] for r in rounds], [r[1] for r in rounds]
    a = ratio_of_means(num, den)
    b = ratio_of_means([[v * scale for v in r] for r in num], [[v * scale for v in r] for r in den])
    assert b.point == pytest.approx(a.point) and b.low == pytest.approx(a.low) and b.high == pytest.approx(a.high)
