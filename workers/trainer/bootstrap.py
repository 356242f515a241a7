"""Bringing the trainer to its first step: the model it trains, then either a fresh start (warm start,
version 0, the run's info, snapshot 0) or a resume from the checkpoint, checked against the bucket. Either
way the model is sharded only here — after the warm start, which runs on the whole model — and what that
creates comes back as one :class:`~workers.trainer.state.Started`."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aurora_store.codec import ModelLayout
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import AuroraError, ConfigError, DigestMismatchError
from aurora_store.store import DeltaStore
from aurora_store.store.publisher import utc_now
from aurora_store.store.snapshots import load_snapshot
from workers.publish.ranks import Ranks
from workers.rl.grpo import GRPOConfig
from workers.rl.model import build_model, built_in_config, load_model, load_tokenizer, warm_start
from workers.rl.task import AdditionTask, MathFileTask, build_tokenizer
from workers.trainer import checkpoint, rebuild
from workers.trainer.cli import TrainerConfig, resolve_activation_checkpointing, resolve_optimizer
from workers.trainer.device import autocast_dtype
from workers.trainer.leader import Leader
from workers.trainer.learner import ShardedLearner
from workers.trainer.policy import ShardedPolicy, frozen_reference
from workers.trainer.publishing import Publishing
from workers.trainer.state import Progress, Started

log = logging.getLogger("aurora.trainer")


@dataclass(frozen=True)
class PolicyModel:
    """The model to train (whole, on the host, before any warm start or sharding) and what describes it."""

    module: torch.nn.Module
    tokenizer: Any
    config: dict[str, Any]  # its Hugging Face config (what the run info and snapshots record)

    @classmethod
    def load(cls, cfg: TrainerConfig) -> PolicyModel:
        """``--model``'s weights, or the built-in small Qwen3 (with ``--model-config`` overrides) at ``--seed``."""
        if cfg.model:
            model = load_model(cfg.model, dtype=torch.float32)
            tokenizer = load_tokenizer(cfg.model)
            config = json.loads((Path(cfg.model) / "config.json").read_text())
            return cls(model, tokenizer, config)
        tokenizer = build_tokenizer()
        config = built_in_config(cfg.model_config)
        return cls(build_model(config, seed=cfg.seed), tokenizer, config)


@dataclass(frozen=True)
class Bootstrap:
    config: TrainerConfig
    ranks: Ranks
    device: torch.device
    store: DeltaStore
    model: PolicyModel
    layout: ModelLayout
    grpo: GRPOConfig
    task: AdditionTask | MathFileTask
    publishing: Publishing
    progress: Progress
    leader: Leader | None

    def start(self) -> Started:
        started = self._resume() if checkpoint.exists(self.config.checkpoint_dir) else self._fresh()
        if self.leader is not None:
            self.leader.announce_state(self.progress)
        return started

    def _fresh(self) -> Started:
        cfg = self.config
        occupied = self.ranks.leader and self.store.latest_version() is not None
        self.ranks.agree(f"{self.store.url} already holds versions but {cfg.checkpoint_dir} has no "
                         f"checkpoint: refusing to start a second history in the same bucket" if occupied else None)
        if self.ranks.leader and not cfg.model and isinstance(self.task, AdditionTask) and cfg.warm_start_steps:
            loss = warm_start(self.model.module, self.model.tokenizer, self.task, cfg.warm_start_steps, seed=cfg.seed)
            log.info("warm start done", extra={"steps": cfg.warm_start_steps, "loss": round(loss, 4)})
        started = self._shard()
        policy = started.policy
        policy.published = policy.cast_rows()
        self.progress.digest = self.publishing.sum_digest(policy.published)
        started.save_checkpoint(checkpoint.CheckpointInfo(0, 0, [], cfg.seed, world_size=self.ranks.world),
                                wait=True)
        if self.ranks.leader:
            self.store.put_run_info({"run": cfg.run, "home_region": cfg.region, "source_bucket": self.store.url,
                                     "model_config": self.model.config, "layout": self.layout.fingerprint,
                                     "created_at": utc_now()})
        self.publishing.snapshot(policy, 0)
        return started

    def _resume(self) -> Started:
        """Continue the version sequence from the newest complete checkpoint: each rank restores its shard of
        the master weights and optimizer state, and rebuilds the rows of the bucket's latest version from a
        snapshot and the deltas after it (:mod:`.rebuild`); summed over ranks they must hash to that version's
        digest. The checkpoint may be older than the bucket (a crash came steps after it): training goes on
        from the checkpoint's weights and the next version is published on top of the latest one."""
        cfg = self.config
        started = self._shard()
        policy = started.policy
        info = started.load_checkpoint(cfg.checkpoint_dir, self.ranks)
        found: dict[str, Any] | None = None
        if self.ranks.leader:
            latest = self.store.latest_version()
            if latest is None:
                found = {"error": f"checkpoint at version {info.version} but {self.store.url} is empty"}
            elif info.version > latest + 1:
                found = {"error": f"checkpoint is at version {info.version} but the bucket's latest is {latest}"}
            else:
                found = {"latest": latest, "digest": str(self.publishing.digest_of(latest)), "error": None}
        found = self.ranks.broadcast(found, "resume")
        if found["error"]:
            raise ConfigError(found["error"])
        latest, digest = int(found["latest"]), WeightsDigest.parse(found["digest"])
        published = rebuild.published_rows(self.store, self.layout, latest, policy)
        actual = self.publishing.sum_digest(published)
        self.ranks.agree(None if actual == digest else
                         f"version {latest} rebuilt from {self.store.url} hashes to {actual}, its manifest says "
                         f"{digest}", DigestMismatchError)
        progress = self.progress
        policy.published, progress.digest, progress.version = published, digest, latest
        progress.step, progress.rewards = info.step, list(info.rewards)
        if self.leader is not None:
            self.leader.dispatcher.stats.restore(info.counters)
        if info.version == latest + 1:  # crashed between checkpoint and publish: publish it now
            self.publishing.publish(policy, info.version)
        log.info("resumed", extra={"step": progress.step, "version": progress.version,
                                   "checkpoint_version": info.version})
        if self.leader is not None:
            self.leader.plane.log_event("trainer_resume", step=progress.step, version=progress.version,
                                        checkpoint_version=info.version)
        return started

    def _shard(self) -> Started:
        """Shard the (warm-started) model over the ranks and create the optimizer for the shards."""
        model = self.model.module
        reference = self._reference() if self.grpo.kl_coef > 0 else None  # from the host model, in bf16
        if not self.ranks.sharded:  # one rank: the whole model on the device; sharded: shard by shard, in shard()
            model.to(self.device)  # after the warm start (done on the host), before the optimizer
        policy = ShardedPolicy.shard(model, self.layout, self.ranks, compute_dtype=self.config.compute_dtype,
                                     device=self.device)
        cfg, kind = self.config, self.device.type
        optimizer = resolve_optimizer(cfg.optimizer, kind, self.ranks.world)
        learner = ShardedLearner(model, self.grpo, self.ranks, reference, optimizer=optimizer,
                                 autocast=autocast_dtype(self.device, cfg.compute_dtype, self.ranks.world),
                                 activation_checkpointing=resolve_activation_checkpointing(
                                     cfg.activation_checkpointing, kind),
                                 logits_chunk=cfg.logits_chunk)
        checkpoints = checkpoint.Checkpoints.plan(cfg.checkpoint_dir, self.ranks, policy, optimizer,
                                                  cfg.checkpoint_every)
        return Started(policy, learner, checkpoints)

    def _reference(self) -> torch.nn.Module:
        """The KL term's frozen reference: the initial policy, in bf16 (sharded like the policy). On a fresh
        start that is the model as it is now (after the warm start); on a resume it is version 0's snapshot,
        which holds exactly the bf16 cast of the initial weights."""
        if not checkpoint.exists(self.config.checkpoint_dir):
            return frozen_reference(self.model.module, self.ranks, self.device)
        initial = build_model(self.model.config, seed=self.config.seed) if not self.config.model else \
            load_model(self.config.model, dtype=torch.float32)
        error = None
        if self.ranks.leader:
            try:
                state, _ = load_snapshot(self.store, 0, self.layout)
                missing = [n for n in self.layout.train_names if n not in state]
                if missing:
                    error = f"snapshot 0 lacks {missing[:4]}"
                else:
                    initial.load_state_dict(state, strict=False)
            except AuroraError as exc:
                error = f"--kl-coef needs the initial policy (snapshot 0) to resume: {exc}"
        self.ranks.agree(error, ConfigError)
        return frozen_reference(initial, self.ranks, self.device)
