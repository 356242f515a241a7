"""The trainer process: one-step-asynchronous GRPO that publishes every version as a sparse delta.

Pipeline (B_k = the rollouts trained on at step k):

    dispatch B_1 on v0 · collect B_1 · dispatch B_2 on v0 · train on B_1 → π_1 · publish D_1
    collect B_2 · dispatch B_3 on v1 (Commit(1)) · train on B_2 → π_2 · publish D_2 · …

so generation of B_{k+1} (on π_{k-1}) overlaps training on B_k, and D_k streams to the actors while they
generate B_{k+1}; they activate it at a batch boundary once committed. Restarts resume from the local
checkpoint; the bucket is the truth for what was published.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aurora_store.bus import ControlPlane, TrainerState, VersionEvent
from aurora_store.codec import CodecParams, ModelLayout, WeightTarget, pieces_from_states
from aurora_store.codec.digest import WeightsDigest, digest_state
from aurora_store.config import TransferSettings
from aurora_store.errors import AuroraError, ConfigError
from aurora_store.metrics import Metrics
from aurora_store.sched import LeasePolicy, Prompt, StepLedger
from aurora_store.store import DeltaStore, keys, open_bucket, plan_catch_up
from aurora_store.store.publisher import VersionPublisher, utc_now
from aurora_store.store.replay import replay
from aurora_store.store.snapshots import load_snapshot, read_snapshot_manifest, write_snapshot
from aurora_store.trust import Signer
from workers.rl.grpo import GRPOConfig, GRPOLearner, Sample
from workers.rl.model import DEFAULT_CONFIG, build_model, load_model, load_tokenizer, side_files, warm_start
from workers.rl.task import AdditionTask, MathFileTask, build_tokenizer
from workers.trainer import checkpoint
from workers.trainer.cli import TrainerConfig
from workers.trainer.curves import CurveLogger
from workers.trainer.dispatch import Dispatcher

log = logging.getLogger("aurora.trainer")


@dataclass
class StepRecord:
    step: int
    version: int  # version published by this step
    behaviour_version: int  # version the rollouts were generated on
    mean_reward: float
    loss: float
    kl: float
    clip_fraction: float
    delta_bytes: int
    density: float
    wait_s: float
    train_s: float
    publish_s: float
    accepted: int
    rejected: int
    prompts: int  # prompts of this step's batch accepted (= batch size)
    makespan_s: float  # dispatch of the batch to its last accepted result


@dataclass
class Trainer:
    config: TrainerConfig
    records: list[StepRecord] = field(default_factory=list)
    stopping: bool = False

    def __post_init__(self) -> None:
        cfg = self.config
        settings = TransferSettings.from_env()
        if cfg.streams:
            settings = TransferSettings(**{**settings.__dict__, "streams": cfg.streams})
        self.settings = settings
        self.store = DeltaStore(open_bucket(cfg.bucket, create=True, settings=settings), settings)
        self.plane = ControlPlane(cfg.redis, cfg.run, on_reconnect=self._on_redis_restart)
        self.task = MathFileTask(cfg.dataset, seed=cfg.seed) if cfg.dataset else \
            AdditionTask(max_operand=cfg.max_operand, seed=cfg.seed)
        self.model, self.tokenizer, self.model_config = self._build_model()
        self.layout = ModelLayout.from_config(self.model_config)
        self.learner = GRPOLearner(self.model, GRPOConfig(lr=cfg.lr, clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef,
                                                          epochs=cfg.epochs))
        self.sign = Signer.load(cfg.signing_key) if cfg.signing_key else None
        self.publisher = VersionPublisher(
            self.store, self.layout, CodecParams(segment_bytes=cfg.segment_bytes), settings.streams,
            producer={"run": cfg.run, "process": "trainer", "host": socket.gethostname()}, sign=self.sign)
        self.metrics = Metrics("trainer", cfg.run, cfg.region)
        if cfg.metrics_port:
            self.metrics.serve(cfg.metrics_port)
        self.curves = CurveLogger(cfg.logdir or Path(cfg.checkpoint_dir) / "tb", run=cfg.run,
                                  config=dict(cfg.__dict__), use_wandb=cfg.wandb)
        self.dispatcher = Dispatcher(self.plane, cfg.region, f"trainer-{os.getpid()}",
                                     LeasePolicy(factor=cfg.lease_factor, initial_ms=int(1000 * cfg.initial_lease_s)),
                                     uniform=cfg.split == "uniform", metrics=self.metrics)
        self.version = 0
        self.step = 0
        self.rewards: list[float] = []
        self.published: dict[str, torch.Tensor] = {}
        self.digest = WeightsDigest()

    # --- setup -----------------------------------------------------------------------------------

    def _build_model(self):
        cfg = self.config
        if cfg.model:
            model = load_model(cfg.model, dtype=torch.float32)
            tokenizer = load_tokenizer(cfg.model)
            config = json.loads((Path(cfg.model) / "config.json").read_text())
            return model, tokenizer, config
        tokenizer = build_tokenizer()
        config = dict(DEFAULT_CONFIG)
        if cfg.model_config:
            text = cfg.model_config
            path = Path(text)
            overrides = json.loads(path.read_text() if not text.lstrip().startswith("{") and path.is_file() else text)
            config.update(overrides)
        model = build_model(config, seed=cfg.seed)
        return model, tokenizer, config

    def _cast(self) -> dict[str, torch.Tensor]:
        """The bf16 policy actors run: the cast of the fp32 master weights (training names)."""
        params = dict(self.model.named_parameters())
        return {name: params[name].detach().to(torch.bfloat16).contiguous() for name in self.layout.train_names}

    def start(self) -> None:
        cfg = self.config
        if checkpoint.exists(cfg.checkpoint_dir):
            self._resume()
        else:
            if self.store.latest_version() is not None:
                raise ConfigError(f"{self.store.url} already holds versions but {cfg.checkpoint_dir} has no "
                                  f"checkpoint: refusing to start a second history in the same bucket")
            if not cfg.model and isinstance(self.task, AdditionTask) and cfg.warm_start_steps:
                loss = warm_start(self.model, self.tokenizer, self.task, cfg.warm_start_steps, seed=cfg.seed)
                log.info("warm start done", extra={"steps": cfg.warm_start_steps, "loss": round(loss, 4)})
            self.learner = GRPOLearner(self.model, self.learner.config)
            self.published = self._cast()
            self.digest = digest_state(self.layout, self.published)
            checkpoint.save(cfg.checkpoint_dir, self.model, self.learner.optimizer,
                            checkpoint.CheckpointInfo(0, 0, [], cfg.seed))
            self.store.put_run_info({"run": cfg.run, "home_region": cfg.region, "source_bucket": self.store.url,
                                     "model_config": self.model_config, "layout": self.layout.fingerprint,
                                     "created_at": utc_now()})
            self._snapshot(0)
        self._announce_state()

    def _resume(self) -> None:
        """Continue the version sequence: checkpoint for the master weights, bucket for what was published."""
        cfg = self.config
        info = checkpoint.load(cfg.checkpoint_dir, self.model, self.learner.optimizer)
        latest = self.store.latest_version()
        if latest is None:
            raise ConfigError(f"checkpoint at version {info.version} but {self.store.url} is empty")
        if info.version not in (latest, latest + 1):
            raise ConfigError(f"checkpoint is at version {info.version} but the bucket's latest is {latest}")
        plan = plan_catch_up(None, latest, {v: self.store.delta_bytes(v) for v in self.store.versions()},
                             {s: read_snapshot_manifest(self.store, s).total_bytes
                              for s in self.store.snapshot_versions()})
        state, _ = load_snapshot(self.store, plan.snapshot, self.layout)
        target = WeightTarget.from_state(self.layout, state, version=plan.snapshot)
        replay(self.store, target, plan.deltas, streams=self.settings.streams)
        self.published, self.digest, self.version = state, target.digest, latest
        self.step, self.rewards = info.step, list(info.rewards)
        self.dispatcher.stats.restore(info.counters)
        if info.version == latest + 1:  # crashed between checkpoint and publish: publish it now
            self._publish(info.version)
        elif str(digest_state(self.layout, self._cast())) != str(self.digest):
            raise ConfigError("checkpoint master weights do not cast to the published version's weights")
        log.info("resumed", extra={"step": self.step, "version": self.version})
        self.plane.log_event("trainer_resume", step=self.step, version=self.version)

    # --- publishing ------------------------------------------------------------------------------

    def _announce_segment(self, version: int):
        def announce(ref) -> None:
            self.plane.announce(VersionEvent("segment", version, self.config.region, segment=ref.digest,
                                             size=ref.size))
        return announce

    def _publish(self, version: int) -> tuple[int, float, float]:
        new = self._cast()
        report = self.publisher.publish(version, self.version, self.digest,
                                        pieces_from_states(self.layout, self.published, new),
                                        on_segment=self._announce_segment(version))
        m = self.metrics
        m.version_published.set(version)
        m.delta_bytes.set(report.total_bytes)
        m.published_bytes.inc(report.total_bytes)
        m.delta_density.set(report.manifest.density)
        m.encode_seconds.observe(report.encode_s)
        m.upload_seconds.observe(report.upload_s)
        m.publish_seconds.observe(report.total_s)
        self.published, self.version = new, version
        self.digest = WeightsDigest.parse(report.manifest.weights_digest)
        self.plane.announce(VersionEvent("staged", version, self.config.region, base=version - 1,
                                         manifest_key=keys.delta(version), weights_digest=str(self.digest),
                                         sent_ms=self.plane.now_ms()))
        if self.config.snapshot_every and version % self.config.snapshot_every == 0:
            self._snapshot(version)
        self._announce_state()
        return report.total_bytes, report.manifest.density, report.total_s

    def _snapshot(self, version: int) -> None:
        if version in self.store.snapshot_versions():
            return
        write_snapshot(self.store, version, self.published, self.layout, self.digest,
                       extra_files=side_files(self.model_config, self.tokenizer), created_at=utc_now(),
                       producer={"run": self.config.run}, sign=self.sign)
        self.plane.announce(VersionEvent("snapshot", version, self.config.region,
                                         manifest_key=keys.snapshot_manifest(version),
                                         weights_digest=str(self.digest)))

    def _announce_state(self, status: str = "running") -> None:
        self.metrics.version_committed.set(self.dispatcher.committed)
        self.plane.set_trainer_state(TrainerState(self.version, str(self.digest), self.step, self.store.url,
                                                  self.config.region, self.plane.now_ms(), status,
                                                  self.dispatcher.committed))

    def _on_redis_restart(self) -> None:
        """Redis lost everything: re-create what only lived there (notifications will resume)."""
        self.plane.ensure_results_group()

    # --- the loop --------------------------------------------------------------------------------

    def _prompts(self, step: int) -> list[Prompt]:
        return self.task.prompts(step, self.config.batch_size)

    def _dispatch(self, step: int, version: int) -> StepLedger:
        return self.dispatcher.start_step(step, version, str(self._digest_of(version)), self._prompts(step),
                                          group_size=self.config.group_size,
                                          max_new_tokens=self.task.max_new_tokens,
                                          wait_s=self.config.step_timeout_s)

    def _digest_of(self, version: int) -> WeightsDigest:
        if version == self.version:
            return self.digest
        if version == 0:
            return WeightsDigest.parse(read_snapshot_manifest(self.store, 0).weights_digest)
        return WeightsDigest.parse(self.store.manifest(version).weights_digest)

    def _samples(self, ledger: StepLedger) -> list[Sample]:
        samples = []
        for prompt_id, result in ledger.accepted.items():
            prompt = ledger.prompts[prompt_id]
            prompt_ids = tuple(self.tokenizer(prompt.text).input_ids)
            for sample in result.samples:
                samples.append(Sample(prompt_ids, tuple(sample["ids"]), tuple(sample["logprobs"]),
                                      self.task.reward(prompt, sample["text"]), prompt_id))
        return samples

    def run(self) -> dict[str, Any]:
        cfg = self.config
        self.start()
        start_step = self.step
        # Rollouts for step k+1 are generated on version k-1 while step k trains. The first batch (and the
        # first one after a restart, when actors may already run the newest version) uses the newest version.
        pending = self._dispatch(start_step + 1, self.version)
        for step in range(start_step + 1, cfg.steps + 1):
            if self.stopping:
                break
            t0 = time.monotonic()
            self.dispatcher.collect(pending, timeout_s=cfg.step_timeout_s, tick=self._heartbeat)
            wait_s = time.monotonic() - t0
            current = pending
            if step < cfg.steps:
                pending = self._dispatch(step + 1, self.version)
            t1 = time.monotonic()
            stats = self.learner.step(self._samples(current))
            train_s = time.monotonic() - t1
            self.step = step
            self.rewards.append(stats.mean_reward)
            checkpoint.save(cfg.checkpoint_dir, self.model, self.learner.optimizer,
                            checkpoint.CheckpointInfo(step, self.version + 1, self.rewards, cfg.seed,
                                                      self.dispatcher.stats.as_counters()))
            delta_bytes, density, publish_s = self._publish(self.version + 1)
            record = StepRecord(step, self.version, current.version, stats.mean_reward, stats.loss, stats.kl,
                                stats.clip_fraction, delta_bytes, density, wait_s, train_s, publish_s,
                                self.dispatcher.stats.accepted, self.dispatcher.stats.rejected_total,
                                len(current.accepted), (current.makespan_ms or 0) / 1000)
            self.records.append(record)
            self.plane.log_event("step", **{k: round(v, 6) if isinstance(v, float) else v
                                            for k, v in record.__dict__.items()})
            self.metrics.step.set(step)
            self.metrics.reward.set(stats.mean_reward)
            self.curves.log(step, {
                "reward/mean": stats.mean_reward, "loss/policy": stats.loss, "loss/kl": stats.kl,
                "loss/clip_fraction": stats.clip_fraction, "loss/approx_kl_behaviour": stats.approx_kl_behaviour,
                "loss/grad_norm": stats.grad_norm, "time/generation_wait_s": wait_s, "time/train_s": train_s,
                "time/publish_s": publish_s, "time/makespan_s": record.makespan_s,
                "delta/bytes": delta_bytes, "delta/density": density,
                "rollouts/accepted": self.dispatcher.stats.accepted,
                "rollouts/rejected": self.dispatcher.stats.rejected_total})
            log.info("step %d: reward %.3f, published v%d (%d bytes, density %.4f)", step, stats.mean_reward,
                     self.version, delta_bytes, density)
        if not self.stopping:
            self.dispatcher.commit(self.version)  # let actors activate the final policy too
        self._announce_state("done" if not self.stopping else "stopped")
        self.export_run_log()
        self.curves.close()
        return self.summary()

    def export_run_log(self) -> None:
        """Copy the run log (Redis, ephemeral) into the bucket, where operators and notebooks find it."""
        from aurora_store.ops.runlog import export_run_log

        try:
            export_run_log(self.plane, self.store)
        except AuroraError as exc:
            log.warning("could not export the run log", extra={"error": str(exc)})

    def _heartbeat(self) -> None:
        self._announce_state()

    def summary(self) -> dict[str, Any]:
        k = min(3, len(self.rewards))
        return {
            "steps": self.step,
            "reward_initial": sum(self.rewards[:k]) / k if k else None,
            "reward_final": sum(self.rewards[-k:]) / k if k else None,
            "rewards": self.rewards,
            "delta_bytes": [r.delta_bytes for r in self.records],
            "densities": [r.density for r in self.records],
            "full_bytes": self.layout.nbytes,
            "trainer_version": self.version,
            "trainer_digest": str(self.digest),
            "rollouts_accepted": self.dispatcher.stats.accepted,
            "rollouts_rejected": self.dispatcher.stats.rejected_total,
            "rejected_by_reason": dict(self.dispatcher.stats.rejected),
            "leases_expired": self.dispatcher.stats.expired,
            "leases_returned": self.dispatcher.stats.returned,
            "per_actor_accepted": dict(self.dispatcher.stats.per_actor_accepted),
            "bucket": self.store.url,
            "logdir": str(self.curves.logdir),
            "step_times": [{"wait_s": r.wait_s, "train_s": r.train_s, "publish_s": r.publish_s,
                            "makespan_s": r.makespan_s} for r in self.records],
        }


def main(argv: list[str] | None = None) -> int:
    from aurora_store import logs
    from workers.trainer.cli import parse_args

    cfg = parse_args(argv)
    logs.configure("trainer", cfg.run)
    torch.manual_seed(cfg.seed)
    trainer = Trainer(cfg)

    def stop(signum, _frame) -> None:
        trainer.stopping = True

    signal.signal(signal.SIGTERM, stop)
    summary = trainer.run()
    out = Path(cfg.checkpoint_dir) / "summary.json"
    out.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0
