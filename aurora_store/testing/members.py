"""Actors as the trainer sees them, for tests and benchmarks that speak the control plane directly: an id, a
key pair and the admission proof, registering, heartbeating and answering leases with well-shaped, signed
results (the real actor process does the same through :mod:`workers.actor`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aurora_store.bus import ActorState, ControlPlane, Lease, RolloutResult
from aurora_store.bus.identity import ActorKey, Credentials


def admission_secret() -> str:
    """The admission secret of this process's environment (the test session sets one)."""
    return os.environ["AURORA_ADMISSION_SECRET"]


def samples(lease: Lease, tokens: int | None = None, token_id: int = 1) -> list[dict[str, Any]]:
    """A group of the lease's size, each completion ``tokens`` long (default: ``max_new_tokens``)."""
    n = lease.max_new_tokens if tokens is None else tokens
    return [{"ids": [token_id] * n, "logprobs": [-0.5] * n, "text": ""} for _ in range(lease.group_size)]


@dataclass
class Member:
    actor_id: str
    run: str
    secret: str = field(default_factory=admission_secret, repr=False)
    key: ActorKey = field(default_factory=ActorKey.generate, repr=False)

    @property
    def credentials(self) -> Credentials:
        return Credentials.issue(self.key, self.secret, self.run, self.actor_id)

    def state(self, version: int | None = 0, *, region: str = "eu", tokens_per_s: float = 100.0,
              status: str = "ready") -> ActorState:
        return ActorState(self.actor_id, region, "torch", version, None, None, tokens_per_s, 0, status, 0, "regional")

    def register(self, plane: ControlPlane, state: ActorState | None = None) -> None:
        plane.register_actor(state or self.state(), self.credentials)

    def heartbeat(self, plane: ControlPlane, state: ActorState | None = None) -> None:
        plane.heartbeat_actor(state or self.state(), self.credentials)

    def result(self, lease: Lease, sample_list: Sequence[dict[str, Any]] | None = None, *,
               version: int | None = None, digest: str | None = None) -> RolloutResult:
        """A signed result for ``lease`` (by default well-shaped, on the lease's version and digest)."""
        body = list(sample_list) if sample_list is not None else samples(lease)
        tokens = sum(len(s.get("ids", ())) for s in body if isinstance(s, dict))
        return self.key.signed(self.run, RolloutResult(
            "result", lease.lease_id, self.actor_id, "", lease.version if version is None else version,
            lease.weights_digest if digest is None else digest, tokens, 0.1, body))

    def hand_back(self, lease: Lease) -> RolloutResult:
        return self.key.signed(self.run, RolloutResult("return", lease.lease_id, self.actor_id, ""))
