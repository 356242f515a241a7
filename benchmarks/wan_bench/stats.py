"""Confidence intervals for a ratio of mean step times (part 5 of the WAN benchmark).

The modes run in interleaved rounds (one short run per mode per round), so the unit of independent replication
is the round: slow drift of a shared machine moves every mode of a round alike, and the intervals inside one run
are autocorrelated. :func:`ratio_of_means` therefore treats the rounds as clusters (the classical ratio
estimator): ``R = Σ_r n̄ · x̄_r / Σ_r n̄ · ȳ_r`` with the per-round means weighted by the round's interval counts,
its standard error from the linearised residuals ``x̄_r − R ȳ_r`` across rounds (the delta method), and Student's
t with ``rounds − 1`` degrees of freedom, so a handful of rounds gives an honestly wide interval. With fewer than
:data:`MIN_ROUNDS` rounds there is no between-round spread to estimate, and the intervals themselves are the
units (two independent samples, Welch–Satterthwaite degrees of freedom) — what the one-round ``--quick`` run
gets; the result says which method it used.

Pure and deterministic (no resampling, no seed): known inputs give known intervals.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.errors import BenchmarkError

MIN_ROUNDS = 3
"""Rounds needed for the between-round (cluster) method: two leave a 12.7× t quantile and one no spread."""

# Two-sided 95 % quantiles of Student's t (0.975 one-sided) for 1–30 degrees of freedom; the normal beyond.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


class StatsError(BenchmarkError, ValueError):
    """Too few or unusable samples for the requested statistic."""


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (rounded down to a whole number, which
    errs wide); the normal quantile past 30 and above (within 2 % of t there)."""
    if not df >= 1:
        raise StatsError(f"degrees of freedom must be at least 1, got {df}")
    if df >= len(_T975) + 1:
        return 1.960
    return _T975[math.floor(df) - 1]


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    stdev: float  # sample standard deviation (n − 1); 0 for one value
    min: float
    max: float

    def as_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "mean": self.mean, "median": self.median, "stdev": self.stdev, "min": self.min,
                "max": self.max}


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise StatsError("no values to summarize")
    stdev = statistics.stdev(values) if len(values) > 1 else 0.0
    return Summary(len(values), statistics.fmean(values), statistics.median(values), stdev, min(values),
                   max(values))


@dataclass(frozen=True)
class RatioCI:
    """``point`` = mean(numerator intervals) / mean(denominator intervals), its 95 % interval and how."""

    point: float
    low: float
    high: float
    method: str  # "rounds" (clusters, delta method, t with rounds − 1 df) or "intervals" (Welch)
    units: int  # rounds, or intervals of the smaller sample
    df: float

    @property
    def half_width(self) -> float:
        """The larger distance of a bound from the point, relative to the point (0.03 = ±3 %)."""
        return max(self.point - self.low, self.high - self.point) / self.point

    def as_list(self) -> list[float]:
        return [self.low, self.high]


def ratio_of_means(numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]]) -> RatioCI:
    """The 95 % interval of mean(numerator) / mean(denominator), both given as one list of intervals per round
    (``numerator[r]`` and ``denominator[r]`` ran in the same round). Empty rounds are left out of both."""
    if len(numerator) != len(denominator):
        raise StatsError(f"{len(numerator)} numerator rounds but {len(denominator)} denominator rounds")
    rounds = [(list(x), list(y)) for x, y in zip(numerator, denominator) if x and y]
    if not rounds:
        raise StatsError("no round has intervals of both modes")
    xs = [v for x, _ in rounds for v in x]
    ys = [v for _, y in rounds for v in y]
    if any(not math.isfinite(v) for v in xs + ys) or statistics.fmean(ys) <= 0:
        raise StatsError("intervals must be finite and the denominator's mean positive")
    point = statistics.fmean(xs) / statistics.fmean(ys)
    if len(rounds) >= MIN_ROUNDS:
        return _by_rounds(rounds, point)
    return _by_intervals(xs, ys, point)


def _by_rounds(rounds: list[tuple[list[float], list[float]]], point: float) -> RatioCI:
    # Per-round totals scaled to the pooled means: mean(x) = Σ X_r / N_x, so with a_r = X_r / (N_x / k) the
    # point is Σ a_r / Σ b_r exactly, whatever the counts per round.
    k = len(rounds)
    nx = sum(len(x) for x, _ in rounds) / k
    ny = sum(len(y) for _, y in rounds) / k
    a = [sum(x) / nx for x, _ in rounds]
    b = [sum(y) / ny for _, y in rounds]
    b_mean = statistics.fmean(b)
    residuals = [ar - point * br for ar, br in zip(a, b)]
    se = math.sqrt(sum(e * e for e in residuals) / (k - 1) / k) / b_mean
    half = t975(k - 1) * se
    return RatioCI(point, point - half, point + half, "rounds", k, k - 1)


def _by_intervals(xs: list[float], ys: list[float], point: float) -> RatioCI:
    if len(xs) < 2 or len(ys) < 2:
        raise StatsError(f"need at least two intervals of each mode, got {len(xs)} and {len(ys)}")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    vx = statistics.variance(xs) / len(xs) / (mx * mx) if mx else 0.0  # squared relative standard errors
    vy = statistics.variance(ys) / len(ys) / (my * my)
    total = vx + vy
    if total == 0:
        return RatioCI(point, point, point, "intervals", min(len(xs), len(ys)), math.inf)
    df = total * total / (vx * vx / (len(xs) - 1) + vy * vy / (len(ys) - 1))
    half = t975(df) * abs(point) * math.sqrt(total)
    return RatioCI(point, point - half, point + half, "intervals", min(len(xs), len(ys)), df)
