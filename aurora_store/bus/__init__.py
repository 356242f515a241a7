"""Redis Streams control plane: notifications only — the bucket is the source of truth."""

from aurora_store.bus.client import connect
from aurora_store.bus.messages import (
           ActorState,
           Lease,
           MessageError,
           RelayState,
           RolloutResult,
           TrainerState,
           VersionEvent,
)
from aurora_store.bus.plane import ControlPlane
from aurora_store.bus.redis_keys import RunKeys

__all__ = ["ActorState", "ControlPlane", "Lease", "MessageError", "RelayState", "RolloutResult", "RunKeys",
           "TrainerState", "VersionEvent", "connect"]
