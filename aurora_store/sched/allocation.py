"""Version-aware eligibility and throughput-proportional batch allocation (pure functions).

Eligible for step ``v``: actors already on ``v``, and actors on ``v − 1`` with ``D_v`` staged or being staged
(they are sent ``Commit(v)`` first and activate it before generating; their leases wait until then).
Everyone else is excluded for this step and its throughput estimate decays by ``α``, so a rejoining actor
starts conservatively. Each eligible actor ``a`` gets ``⌊B·τ_a/T⌋`` prompts; the remainder goes to the
largest fractional parts (ties: lower actor id), so the split is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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


@dataclass
class ThroughputEstimator:
    """Per-actor tokens/s estimates τ_a: EMA on measurements, decay by α on exclusion."""

    beta: float = 0.5  # weight of the newest measurement
    alpha: float = 0.5  # multiplier applied when an actor is excluded from a step
    floor: float = 1e-3
    estimates: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (0 < self.beta <= 1 and 0 < self.alpha <= 1):
            raise SchedulingError("beta and alpha must be in (0, 1]")

    def get(self, actor_id: str) -> float:
        if actor_id in self.estimates:
            return self.estimates[actor_id]
        # A newcomer starts at the median of the known estimates (or 1.0): neither starved nor overloaded.
        known = sorted(self.estimates.values())
        return known[len(known) // 2] if known else 1.0

    def observe(self, actor_id: str, tokens_per_s: float) -> float:
        if not math.isfinite(tokens_per_s) or tokens_per_s < 0:
            raise SchedulingError(f"invalid throughput measurement {tokens_per_s!r}")
        old = self.estimates.get(actor_id)
        new = tokens_per_s if old is None else (1 - self.beta) * old + self.beta * tokens_per_s
        self.estimates[actor_id] = max(new, self.floor)
        return self.estimates[actor_id]

    def decay(self, actor_id: str) -> float:
        self.estimates[actor_id] = max(self.get(actor_id) * self.alpha, self.floor)
        return self.estimates[actor_id]

    def shares(self, batch: int, eligible: tuple[str, ...]) -> dict[str, int]:
        return allocate(batch, {a: self.get(a) for a in eligible})
