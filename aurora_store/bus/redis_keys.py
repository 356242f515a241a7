"""Redis key names of one run (all under ``aurora:<run>:``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunKeys:
    run: str

    @property
    def prefix(self) -> str:
        return f"aurora:{self.run}:"

    def events(self, region: str) -> str:
        """Version events (segment / staged / commit / snapshot) as seen by ``region``."""
        return f"{self.prefix}events:{region}"

    @property
    def membership(self) -> str:
        """Registration / leave events of actors and relays."""
        return f"{self.prefix}membership"

    @property
    def actors(self) -> str:
        """Set of registered actor ids."""
        return f"{self.prefix}actors"

    def actor(self, actor_id: str) -> str:
        """Hash with an actor's live state; expires unless heartbeats refresh it."""
        return f"{self.prefix}actor:{actor_id}"

    def relay(self, region: str) -> str:
        return f"{self.prefix}relay:{region}"

    @property
    def relays(self) -> str:
        return f"{self.prefix}relays"

    @property
    def trainer(self) -> str:
        return f"{self.prefix}trainer"

    def work(self, actor_id: str) -> str:
        """Stream of leases granted to one actor."""
        return f"{self.prefix}work:{actor_id}"

    @property
    def results(self) -> str:
        """Stream of rollout results and lease returns, consumed by the trainer's group."""
        return f"{self.prefix}results"

    @property
    def run_log(self) -> str:
        """Append-only event log of the run (versions per actor, settlements) for operators and notebooks."""
        return f"{self.prefix}log"
