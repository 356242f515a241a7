"""What the trainer has reached, and what exists only once it has started.

:class:`Progress` is the run's position, shared by the bootstrap (which sets it from the checkpoint), the
step loop and publishing (which move it forward). :class:`Started` is built once the model is sharded —
after the warm start, which must run on the unsharded model — so nothing that trains or publishes ever
sees a policy that does not exist yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aurora_store.codec.weights_digest import ZERO, WeightsDigest
from workers.publish.ranks import Ranks
from workers.trainer import checkpoint
from workers.trainer.learner import ShardedLearner
from workers.trainer.policy import ShardedPolicy


@dataclass
class Progress:
    version: int = 0  # newest version published (its rows are the policy's ``published``)
    digest: WeightsDigest = ZERO  # that version's weights digest
    step: int = 0  # last step trained
    rewards: list[float] = field(default_factory=list)  # mean reward of every step so far


@dataclass(frozen=True)
class Started:
    """This rank's sharded policy, the learner (optimizer, reference) that trains it and its checkpoints."""

    policy: ShardedPolicy
    learner: ShardedLearner
    checkpoints: checkpoint.Checkpoints

    def save_checkpoint(self, info: checkpoint.CheckpointInfo, *, wait: bool = False) -> None:
        """Write this rank's shard at ``info.step`` in the background (``wait``: until it is durable)."""
        self.checkpoints.submit(self.policy, self.learner.optimizer, info)
        if wait:
            self.checkpoints.wait()

    def load_checkpoint(self, directory: str | Path, ranks: Ranks) -> checkpoint.CheckpointInfo:
        """Restore this rank's shard from the newest complete checkpoint; returns its info."""
        info = checkpoint.load(directory, self.policy, self.learner.optimizer, ranks)
        self.checkpoints.last_step = info.step  # already on disk: never rewritten in place (e.g. nothing to train)
        return info
