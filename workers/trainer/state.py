"""What the trainer has reached, and what exists only once it has started.

:class:`Progress` is the run's position, shared by the bootstrap (which sets it from the checkpoint), the
step loop and publishing (which move it forward). :class:`Started` is built once the model is sharded —
after the warm start, which must run on the unsharded model — so nothing that trains or publishes ever
sees a policy that does not exist yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aurora_store.codec.digest import ZERO, WeightsDigest
from aurora_store.codec.sharding import LocalRows
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
    """This rank's sharded policy and the learner (optimizer, reference) that trains it."""

    policy: ShardedPolicy
    learner: ShardedLearner

    def save_checkpoint(self, directory: str | Path, info: checkpoint.CheckpointInfo, ranks: Ranks) -> None:
        checkpoint.save(directory, self.policy, self.learner.optimizer, info, ranks)

    def load_checkpoint(self, directory: str | Path, ranks: Ranks,
                        ) -> tuple[checkpoint.CheckpointInfo, dict[str, LocalRows]]:
        """Restore this rank's shard; returns the checkpoint's info and the rows it had published."""
        return checkpoint.load(directory, self.policy, self.learner.optimizer, ranks)
