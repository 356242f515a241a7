"""The actor's own measure of its generation capacity (tokens/s), reported in its heartbeat. It is only the
prior the trainer uses until it has measured the actor's settled work itself."""

from __future__ import annotations

import time

from workers.engines import Engine


class Throughput:
    def __init__(self) -> None:
        self.tokens_per_s = 0.0
        self.calibrated_at = 0.0

    def clock(self) -> float:
        """Seconds, for timing generation (``perf_counter``)."""
        return time.perf_counter()

    def calibrate(self, engine: Engine, batch_size: int, max_new_tokens: int | None, *, warm_up: bool) -> None:
        """Measure once, before taking work (a recalibration would block a whole batch while leases wait)."""
        prompts = ["1+1="] * min(batch_size, 8)
        if warm_up:
            engine.generate(prompts, 2, 2, 1.0, seed=0)  # first calls pay one-time costs
        started = self.clock()
        groups = engine.generate(prompts, 4, max_new_tokens or 4, 1.0, seed=1)
        rate = sum(len(c.ids) for g in groups for c in g) / max(self.clock() - started, 1e-9)
        self.tokens_per_s = rate if not self.tokens_per_s else 0.5 * self.tokens_per_s + 0.5 * rate
        self.calibrated_at = time.monotonic()

    def observe(self, tokens: int, seconds: float, *, full_batch: bool) -> None:
        """A generated batch. Capacity is measured on full batches only: partial batches are dominated by fixed
        costs and would make an under-used actor look slow, starving it further."""
        if full_batch and seconds > 0:
            self.tokens_per_s = 0.7 * self.tokens_per_s + 0.3 * tokens / seconds

    def reported(self) -> float:
        """What the heartbeat says."""
        return self.tokens_per_s
