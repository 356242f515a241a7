"""Version-aware eligibility and throughput-proportional batch allocation (pure functions).

Eligible for step ``v``: actors already on ``v``, and actors on ``v − 1`` with ``D_v`` staged or being staged
(they are sent ``Commit(v)`` first and activate it before generating; their leases wait until then).
Everyone else is excluded for this step and its throughput estimate decays by ``α``, so a rejoining actor
starts conservatively. Estimates come from settled work (:class:`Measurement`), never from what an actor
says about itself beyond a capped prior. Each eligible actor ``a`` gets ``⌊B·τ_a/T⌋`` prompts; the remainder goes to the
largest fractional parts (ties: lower actor id), so the split is deterministic.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from aurora_store.errors import SchedulingError


@dataclass(frozen=True)
class ActorView:
    actor_id: str
    active_version: int | None
    staged_version: int | None
    staging_version: int | None = None


@dataclass(frozen=True)
class Eligibility:
    ready: tuple[str, ...]  # on v
    need_commit: tuple[str, ...]  # on v − 1 with D_v staged
    excluded: tuple[str, ...]

    @property
    def eligible(self) -> tuple[str, ...]:
        return tuple(sorted(self.ready + self.need_commit))


def eligibility(actors: Mapping[str, ActorView], version: int) -> Eligibility:
    ready, commit, excluded = [], [], []
    for actor_id in sorted(actors):
        view = actors[actor_id]
        if view.active_version == version:
            ready.append(actor_id)
        elif view.active_version == version - 1 and version in (view.staged_version, view.staging_version):
            commit.append(actor_id)
        else:
            excluded.append(actor_id)
    return Eligibility(tuple(ready), tuple(commit), tuple(excluded))


def allocate(batch: int, throughput: Mapping[str, float]) -> dict[str, int]:
    """Split ``batch`` prompts across actors proportionally to ``throughput``; sums to ``batch`` exactly."""
    if batch < 0:
        raise SchedulingError(f"batch size must be non-negative, got {batch}")
    if not throughput:
        if batch:
            raise SchedulingError("no eligible actors to allocate a batch to")
        return {}
    rates = {a: max(float(t), 0.0) for a, t in throughput.items()}
    if any(not math.isfinite(t) for t in rates.values()):
        raise SchedulingError("throughput estimates must be finite")
    total = sum(rates.values())
    if total <= 0:  # nothing measured yet: equal shares
        rates = dict.fromkeys(rates, 1.0)
        total = float(len(rates))
    exact = {a: batch * t / total for a, t in rates.items()}
    shares = {a: math.floor(x) for a, x in exact.items()}
    remainder = batch - sum(shares.values())
    order = sorted(rates, key=lambda a: (-(exact[a] - shares[a]), a))
    for actor_id in order[:remainder]:
        shares[actor_id] += 1
    return shares


def refill(count: int, outstanding: Mapping[str, int], speed: Mapping[str, float]) -> dict[str, int]:
    """Hand ``count`` returned prompts out one at a time, each to the actor of ``speed`` (tokens/s) with the
    least outstanding work relative to its speed (ties: lower actor id); ``outstanding`` is what each still
    holds. A heap keyed by that load, so ``P`` prompts among ``N`` actors cost O((N + P) log N), not O(P·N)."""
    if count < 0:
        raise SchedulingError(f"prompt count must be non-negative, got {count}")
    if not speed:
        if count:
            raise SchedulingError("no eligible actors to hand prompts to")
        return {}
    if any(not (math.isfinite(s) and s > 0) for s in speed.values()):
        raise SchedulingError("throughput estimates must be finite and positive")
    load = {a: outstanding.get(a, 0) for a in speed}
    heap = [((load[a] + 1) / speed[a], a) for a in speed]
    heapq.heapify(heap)
    counts = dict.fromkeys(speed, 0)
    for _ in range(count):
        _, actor_id = heapq.heappop(heap)
        counts[actor_id] += 1
        load[actor_id] += 1
        heapq.heappush(heap, ((load[actor_id] + 1) / speed[actor_id], actor_id))
    return {a: n for a, n in counts.items() if n}


@dataclass(frozen=True)
class Measurement:
    """One settlement of an actor's work: the tokens of its accepted results over the time it held leases
    (first grant → the settlement that left it holding none, both on the Redis server clock)."""

    actor_id: str
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class ThroughputEstimator:
    """Per-actor tokens/s estimates τ_a, from work the trainer measured at settlement.

    * A measured settlement ``m`` is folded in by EMA: ``τ_a ← (1 − β)·τ_a + β·m`` (``beta`` = β, the
      weight of the newest measurement). An actor's first measurement replaces its prior (or is blended
      with its decayed estimate, never ending above the measurement).
    * What an actor says about itself (its heartbeat) is only a prior for an actor never measured and never
      decayed, and it is capped by the lower median of the measured estimates (of the reports, while nobody
      has been measured; the *lower* median, so that of two reports the smaller one caps, not their mean):
      a boastful newcomer cannot take the batch, an honest slow one is not overloaded.
    * An actor never measured is *on probation*: its share is at most ``probation`` × the equal share
      (at least one prompt) while measured actors can take the rest (:meth:`shares`).
    * Exclusion multiplies τ_a by α (``alpha``); the decayed value stays until measured settlements raise it
      (reports no longer touch it), so a rejoining actor starts conservatively, as in the paper (§5.3).
    * An actor the trainer has not seen live (deregistered, or its heartbeat expired) for ``forget_after_s``
      has departed and is forgotten (:meth:`seen`): its estimate no longer sets the median that caps priors,
      and spot churn does not grow the tables forever. The grace outlasts a Redis restart, after which live
      states reappear only with the next heartbeats.
    """

    beta: float = 0.5  # weight of the newest measurement
    alpha: float = 0.5  # multiplier applied when an actor is excluded from a step
    floor: float = 1e-3
    estimates: dict[str, float] = field(default_factory=dict)  # measured or decayed actors
    measured: set[str] = field(default_factory=set)
    priors: dict[str, float] = field(default_factory=dict)  # self-reports of actors without an estimate
    forget_after_s: float = 60.0
    probation: float = 0.5  # an unmeasured actor's share, at most this fraction of the equal share
    _absent: dict[str, float] = field(default_factory=dict, init=False, repr=False)  # actor → first missed

    def __post_init__(self) -> None:
        if not (0 < self.beta <= 1 and 0 < self.alpha <= 1):
            raise SchedulingError(f"throughput EMA β and exclusion decay α must be in (0, 1], got β={self.beta!r}, "
                                  f"α={self.alpha!r}")
        if not 0 < self.probation <= 1:
            raise SchedulingError(f"probation must be in (0, 1], got {self.probation!r}")

    def _bound(self) -> float | None:
        """The cap on priors: the lower median of measured estimates, else of the reports, else none."""
        known = sorted(self.estimates[a] for a in self.measured if a in self.estimates)
        if not known:
            known = sorted(self.priors.values())
        if not known:
            return None
        return statistics.median_low(known)

    def get(self, actor_id: str) -> float:
        if actor_id in self.estimates:
            return self.estimates[actor_id]
        bound = self._bound()
        prior = self.priors.get(actor_id)
        if prior is None:  # nothing known about it: the median, neither starved nor overloaded
            return bound if bound is not None else 1.0
        return max(min(prior, bound), self.floor) if bound is not None else max(prior, self.floor)

    def report(self, actor_id: str, tokens_per_s: float) -> None:
        """An actor's own claim (heartbeat): kept as a prior only while nothing was measured or decayed."""
        _check_rate(tokens_per_s)
        if actor_id not in self.estimates and tokens_per_s > 0:
            self.priors[actor_id] = float(tokens_per_s)

    def observe(self, actor_id: str, tokens_per_s: float) -> float:
        """Fold one measured rate into τ_a."""
        _check_rate(tokens_per_s)
        if actor_id not in self.estimates:  # first measurement: it replaces the prior
            new = tokens_per_s
        else:
            new = (1 - self.beta) * self.estimates[actor_id] + self.beta * tokens_per_s
            if actor_id not in self.measured:  # decayed before ever being measured: recover from there, but a
                new = min(new, tokens_per_s)  # decayed prior never lifts τ above what was measured
        self.measured.add(actor_id)
        self.priors.pop(actor_id, None)
        self.estimates[actor_id] = max(new, self.floor)
        return self.estimates[actor_id]

    def observe_settlement(self, measurement: Measurement) -> float:
        return self.observe(measurement.actor_id, measurement.tokens_per_s)

    def decay(self, actor_id: str) -> float:
        self.estimates[actor_id] = max(self.get(actor_id) * self.alpha, self.floor)
        self.priors.pop(actor_id, None)
        return self.estimates[actor_id]

    def forget(self, actor_id: str) -> None:
        self.estimates.pop(actor_id, None)
        self.priors.pop(actor_id, None)
        self.measured.discard(actor_id)
        self._absent.pop(actor_id, None)

    def seen(self, live: Collection[str], now_s: float) -> list[str]:
        """The actors live at ``now_s`` (seconds, any monotonic clock); forgets, and returns, every known actor
        missing from ``live`` since more than ``forget_after_s`` ago."""
        gone = []
        for actor_id in sorted((self.estimates.keys() | self.priors.keys()) - set(live)):
            since = self._absent.setdefault(actor_id, now_s)
            if now_s - since > self.forget_after_s:
                self.forget(actor_id)
                gone.append(actor_id)
        for actor_id in [a for a in self._absent if a in live]:
            del self._absent[actor_id]
        return gone

    def shares(self, batch: int, eligible: tuple[str, ...]) -> dict[str, int]:
        """Proportional shares, with at least one prompt for every eligible actor when the batch allows: an
        actor whose share rounds to zero would never be measured again, so a decayed estimate could never
        recover."""
        shares = allocate(batch, {a: self.get(a) for a in eligible})
        shares = self._on_probation(batch, shares)
        if batch >= len(eligible):
            for actor_id in sorted(a for a, n in shares.items() if n == 0):
                donor = max(shares, key=lambda a: (shares[a], a))
                shares[donor] -= 1
                shares[actor_id] = 1
        return shares


    def _on_probation(self, batch: int, shares: dict[str, int]) -> dict[str, int]:
        """Cap each unmeasured actor at ``probation`` × the equal share (at least one prompt); what the caps
        free goes to the measured actors, by their estimates. Nobody measured: nothing to hand it to."""
        measured = {a: self.get(a) for a in shares if a in self.measured}
        if not measured or not batch:
            return shares
        cap = max(1, math.floor(self.probation * batch / len(shares)))
        freed = sum(max(n - cap, 0) for a, n in shares.items() if a not in measured)
        if not freed:
            return shares
        out = {a: (min(n, cap) if a not in measured else n) for a, n in shares.items()}
        for actor_id, extra in allocate(freed, measured).items():
            out[actor_id] += extra
        return out


@dataclass
class ExpiryBackoff:
    """Actors whose leases keep expiring are probed only every few steps.

    An actor that let leases expire in a step without delivering anything gets a strike; another delivery
    clears them. From ``after`` strikes on it is granted work only on every ``every``-th step since its last
    probe: a silent registration (or a host that has gone quiet) costs one lease expiry every ``every``
    steps, not every step, and an actor that comes back is measured again at its next probe."""

    after: int = 2
    every: int = 4
    strikes: dict[str, int] = field(default_factory=dict)
    last_probe: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.after < 1 or self.every < 1:
            raise SchedulingError(f"expiry backoff needs after >= 1 and every >= 1, got {self.after}, {self.every}")

    def allowed(self, actor_id: str, step: int) -> bool:
        """Whether ``actor_id`` may be granted work in ``step`` (a probe counts from here)."""
        if self.strikes.get(actor_id, 0) < self.after:
            return True
        last = self.last_probe.get(actor_id)
        if last is None or step - last >= self.every or step == last:
            self.last_probe[actor_id] = step
            return True
        return False

    def settled(self, actor_id: str, *, delivered: bool, expired: bool) -> None:
        """The outcome of ``actor_id``'s work in a step."""
        if delivered:
            self.strikes.pop(actor_id, None)
            self.last_probe.pop(actor_id, None)
        elif expired:
            self.strikes[actor_id] = self.strikes.get(actor_id, 0) + 1

    def forget(self, actor_id: str) -> None:
        self.strikes.pop(actor_id, None)
        self.last_probe.pop(actor_id, None)


def _check_rate(tokens_per_s: float) -> None:
    if not isinstance(tokens_per_s, (int, float)) or not math.isfinite(tokens_per_s) or tokens_per_s < 0:
        raise SchedulingError(f"invalid throughput measurement {tokens_per_s!r}")
