"""The trainer process: one-step-asynchronous GRPO that publishes every version as a sparse delta.

Pipeline (B_k = the rollouts trained on at step k):

    dispatch B_1 on v0 · collect B_1 · dispatch B_2 on v0 · train on B_1 → π_1 · publish D_1
    collect B_2 · dispatch B_3 on v1 (Commit(1)) · train on B_2 → π_2 · publish D_2 · …

so generation of B_{k+1} (on π_{k-1}) overlaps training on B_k, and D_k streams to the actors while they
generate B_{k+1}; they activate it at a batch boundary once committed. Restarts resume from the local
checkpoint; the bucket is the truth for what was published.

Under ``torchrun --nproc-per-node N`` the same loop runs data parallel with FSDP2 (see :mod:`.policy`):
rank 0 alone talks to Redis (dispatch, collection, announcements, metrics, curves) and broadcasts each
step's samples; every rank trains on its slice (:mod:`.learner`), checkpoints its shard (:mod:`.checkpoint`),
uploads the delta of the rows it owns (:mod:`workers.publish.delta`) and writes the snapshot files of the
parameters it owns (:mod:`workers.publish.snapshot`); rank 0 writes the manifests. One rank is the same code
with trivial collectives.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aurora_store.bus import ControlPlane, TrainerState, VersionEvent
from aurora_store.codec import CodecParams, ModelLayout
from aurora_store.codec.digest import ZERO, WeightsDigest
from aurora_store.codec.sharding import LocalRows, rows_digest
from aurora_store.config import LaunchEnv, TransferSettings, heartbeat_ttl_s
from aurora_store.errors import AuroraError, BusError, ConfigError, DigestMismatchError, NoEligibleActors
from aurora_store.metrics import Metrics
from aurora_store.sched import LeasePolicy, Prompt, StepLedger, ThroughputEstimator
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.publisher import VersionPublisher, utc_now
from aurora_store.store.snapshots import load_snapshot, read_snapshot_manifest
from aurora_store.trust import Signer
from workers import lifecycle
from workers.publish.delta import PublishOutcome, RankPublisher
from workers.publish.ranks import Ranks
from workers.publish.snapshot import write_sharded_snapshot
from workers.rl.grpo import GRPOConfig, Sample, StepStats
from workers.rl.model import DEFAULT_CONFIG, build_model, load_model, load_tokenizer, side_files, warm_start
from workers.rl.task import AdditionTask, MathFileTask, build_tokenizer
from workers.trainer import checkpoint
from workers.trainer.cli import TrainerConfig
from workers.trainer.curves import CurveLogger
from workers.trainer.device import process_group_backend, resolve_device
from workers.trainer.dispatch import Dispatcher
from workers.trainer.learner import ShardedLearner
from workers.trainer.policy import ShardedPolicy, frozen_reference

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
    ranks: int = 1  # trainer ranks (data parallel)
    rank_publish_s: float = 0.0  # slowest rank's extraction + encode + upload of its shard
    rank_bytes: int = 0  # metadata bytes that crossed ranks for this publish (no weights)


@dataclass
class Trainer:
    config: TrainerConfig
    records: list[StepRecord] = field(default_factory=list)
    stopping: bool = False

    def __post_init__(self) -> None:
        cfg = self.config
        self.device = resolve_device(cfg.device)
        self.ranks = Ranks.from_env(timeout_s=max(3600.0, 3 * cfg.step_timeout_s),
                                    backend=process_group_backend(self.device))
        leader = self.ranks.leader
        self.settings = settings = TransferSettings.from_env().with_overrides(streams=cfg.streams)
        # Every rank uploads its own segments and snapshot files and announces its segments (``segment_plane``);
        # everything else on Redis is rank 0's.
        self.store = DeltaStore(open_bucket(cfg.bucket, create=True, settings=settings), settings)
        ttl = heartbeat_ttl_s()
        self.plane = ControlPlane(cfg.redis, cfg.run, heartbeat_ttl_s=ttl, on_reconnect=self._on_redis_restart) \
            if leader else None
        self.segment_plane = self.plane or ControlPlane(cfg.redis, cfg.run, heartbeat_ttl_s=ttl)
        self.task = MathFileTask(cfg.dataset, seed=cfg.seed) if cfg.dataset else \
            AdditionTask(max_operand=cfg.max_operand, seed=cfg.seed)
        self.model, self.tokenizer, self.model_config = self._build_model()
        self.layout = ModelLayout.from_config(self.model_config)
        self.grpo = GRPOConfig(lr=cfg.lr, clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef, epochs=cfg.epochs)
        self.policy: ShardedPolicy | None = None  # sharded in start(), after the warm start
        self.learner: ShardedLearner | None = None
        self.sign = Signer.load(cfg.signing_key) if cfg.signing_key and leader else None
        producer: dict[str, Any] = {"run": cfg.run, "process": "trainer", "host": socket.gethostname()}
        if self.ranks.sharded:
            producer["ranks"] = self.ranks.world
        self.publisher = VersionPublisher(self.store, self.layout, CodecParams(segment_bytes=cfg.segment_bytes),
                                          settings.streams, producer=producer, sign=self.sign)
        self.rank_publisher = RankPublisher(self.ranks, self.publisher, announce=self._announce_segment)
        self.metrics = Metrics("trainer", cfg.run, cfg.region)
        if cfg.metrics_port and leader:
            self.metrics.serve(cfg.metrics_port)
        self.curves = CurveLogger(cfg.logdir or Path(cfg.checkpoint_dir) / "tb", run=cfg.run,
                                  config=dict(cfg.__dict__), use_wandb=cfg.wandb) if leader else None
        self.dispatcher = Dispatcher(self.plane, cfg.region, f"trainer-{os.getpid()}",
                                     LeasePolicy(factor=cfg.lease_factor, initial_ms=int(1000 * cfg.initial_lease_s)),
                                     ThroughputEstimator(beta=cfg.throughput_ema, alpha=cfg.exclusion_decay),
                                     uniform=cfg.split == "uniform", metrics=self.metrics) if leader else None
        self.version = 0
        self.step = 0
        self.rewards: list[float] = []
        self.digest = WeightsDigest()
        self._publishing = 0  # version whose segments are being announced
        self._last_publish: PublishOutcome | None = None

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

    def _shard(self) -> None:
        """Shard the (warm-started) model over the ranks and create the optimizer for the shards."""
        self.model.to(self.device)  # after the warm start (done on the host), before sharding and the optimizer
        reference = self._reference() if self.grpo.kl_coef > 0 else None
        self.policy = ShardedPolicy.shard(self.model, self.layout, self.ranks, compute_dtype=self.config.compute_dtype,
                                          device=self.device)
        self.learner = ShardedLearner(self.model, self.grpo, self.ranks, reference, optimizer=self.config.optimizer)

    def _reference(self) -> torch.nn.Module:
        """The KL term's frozen reference: the initial policy, in bf16 (sharded like the policy). On a fresh
        start that is the model as it is now (after the warm start); on a resume it is version 0's snapshot,
        which holds exactly the bf16 cast of the initial weights."""
        if not checkpoint.exists(self.config.checkpoint_dir):
            return frozen_reference(self.model, self.ranks, self.device)
        initial = build_model(self.model_config, seed=self.config.seed) if not self.config.model else \
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
        return frozen_reference(initial.to(self.device), self.ranks, self.device)

    def _sum_digest(self, rows: dict[str, LocalRows]) -> WeightsDigest:
        """From-scratch digest of published rows: every rank hashes its own, rank 0 adds them up, all learn it."""
        parts = self.ranks.gather(str(rows_digest(self.layout, rows)), "digest")
        total = sum((WeightsDigest.parse(p) for p in parts), ZERO) if parts is not None else None
        return WeightsDigest.parse(self.ranks.broadcast(str(total) if total is not None else None, "digest"))

    def _save_checkpoint(self, info: checkpoint.CheckpointInfo) -> None:
        checkpoint.save(self.config.checkpoint_dir, self.policy, self.learner.optimizer, info, self.ranks)

    def start(self) -> None:
        cfg = self.config
        if checkpoint.exists(cfg.checkpoint_dir):
            self._resume()
        else:
            occupied = self.ranks.leader and self.store.latest_version() is not None
            self.ranks.agree(f"{self.store.url} already holds versions but {cfg.checkpoint_dir} has no "
                             f"checkpoint: refusing to start a second history in the same bucket" if occupied else None)
            if (self.ranks.leader and not cfg.model and isinstance(self.task, AdditionTask)
                    and cfg.warm_start_steps):
                loss = warm_start(self.model, self.tokenizer, self.task, cfg.warm_start_steps, seed=cfg.seed)
                log.info("warm start done", extra={"steps": cfg.warm_start_steps, "loss": round(loss, 4)})
            self._shard()
            self.policy.published = self.policy.cast_rows()
            self.digest = self._sum_digest(self.policy.published)
            self._save_checkpoint(checkpoint.CheckpointInfo(0, 0, [], cfg.seed, world_size=self.ranks.world))
            if self.ranks.leader:
                self.store.put_run_info({"run": cfg.run, "home_region": cfg.region, "source_bucket": self.store.url,
                                         "model_config": self.model_config, "layout": self.layout.fingerprint,
                                         "created_at": utc_now()})
            self._snapshot(0)
        self._announce_state()

    def _resume(self) -> None:
        """Continue the version sequence: each rank restores its shard of the master weights, optimizer state
        and published rows from the checkpoint; the bucket says what was published, and the ranks' published
        rows must hash (summed over ranks) to that version's digest."""
        cfg = self.config
        self._shard()
        info, saved = checkpoint.load(cfg.checkpoint_dir, self.policy, self.learner.optimizer, self.ranks)
        found: dict[str, Any] | None = None
        if self.ranks.leader:
            latest = self.store.latest_version()
            if latest is None:
                found = {"error": f"checkpoint at version {info.version} but {self.store.url} is empty"}
            elif info.version not in (latest, latest + 1):
                found = {"error": f"checkpoint is at version {info.version} but the bucket's latest is {latest}"}
            else:
                found = {"latest": latest, "digest": str(self._digest_of(latest)), "error": None}
        found = self.ranks.broadcast(found, "resume")
        if found["error"]:
            raise ConfigError(found["error"])
        latest, digest = int(found["latest"]), WeightsDigest.parse(found["digest"])
        if info.version == latest + 1 and info.published_version != latest:
            raise ConfigError(f"checkpoint holds published rows of version {info.published_version}, the bucket's "
                              f"latest is {latest}")
        # Crashed between checkpoint and publish: the saved rows are what was published; else the master's cast.
        published = saved if info.version == latest + 1 else self.policy.cast_rows()
        actual = self._sum_digest(published)
        if actual != digest:
            what = "saved published rows" if info.version == latest + 1 else "checkpoint master weights' cast"
            raise ConfigError(f"the {what} hash to {actual}, but version {latest} in the bucket has {digest}")
        self.policy.published, self.digest, self.version = published, digest, latest
        self.step, self.rewards = info.step, list(info.rewards)
        if self.ranks.leader:
            self.dispatcher.stats.restore(info.counters)
        if info.version == latest + 1:  # crashed between checkpoint and publish: publish it now
            self._publish(info.version)
        log.info("resumed", extra={"step": self.step, "version": self.version})
        if self.ranks.leader:
            self.plane.log_event("trainer_resume", step=self.step, version=self.version)

    # --- publishing ------------------------------------------------------------------------------

    def _announce_segment(self, ref) -> None:
        self.segment_plane.announce(VersionEvent("segment", self._publishing, self.config.region, segment=ref.digest,
                                         size=ref.size))

    def _publish(self, version: int) -> tuple[int, float, float]:
        """Every rank uploads the delta of its rows; rank 0 writes the manifest and announces the version."""
        new = self.policy.cast_rows()
        self._publishing = version
        outcome = self.rank_publisher.publish(version, self.version, self.digest, self.policy.published, new)
        self.policy.published, self.version, self.digest = new, version, outcome.digest
        self._last_publish = outcome
        if self.config.verify_published_digest:
            actual = self._sum_digest(self.policy.published)
            self.ranks.agree(None if actual == self.digest else
                             f"version {version}: published rows hash to {actual} from scratch, the manifest says "
                             f"{self.digest}", DigestMismatchError)
        report = outcome.report
        if self.ranks.leader:
            m = self.metrics
            m.version_published.set(version)
            m.delta_bytes.set(report.total_bytes)
            m.published_bytes.inc(report.total_bytes)
            m.delta_density.set(report.manifest.density)
            m.encode_seconds.observe(report.encode_s)
            m.upload_seconds.observe(report.upload_s)
            m.publish_seconds.observe(report.total_s)
            if self.ranks.sharded:
                self.plane.log_event("publish_ranks", version=version, metadata_bytes=outcome.metadata_bytes,
                                     ranks=[t.to_json() for t in outcome.ranks])
            self.plane.announce(VersionEvent("staged", version, self.config.region, base=version - 1,
                                             manifest_key=object_names.delta(version), weights_digest=str(self.digest),
                                             sent_ms=self.plane.now_ms()))
        if self.config.snapshot_every and version % self.config.snapshot_every == 0:
            self._snapshot(version)
        self._announce_state()
        if report is None:
            return 0, 0.0, 0.0
        return report.total_bytes, report.manifest.density, report.total_s

    def _snapshot(self, version: int) -> None:
        exists = self.ranks.leader and version in self.store.snapshot_versions()
        if self.ranks.broadcast(exists, "snapshot_exists"):
            return
        write_sharded_snapshot(self.ranks, self.store, version, self.layout, self.policy.published, self.digest,
                               extra_files=side_files(self.model_config, self.tokenizer) if self.ranks.leader else None,
                               created_at=utc_now(), producer={"run": self.config.run}, sign=self.sign)
        if self.ranks.leader:
            self.plane.announce(VersionEvent("snapshot", version, self.config.region,
                                             manifest_key=object_names.snapshot_manifest(version),
                                             weights_digest=str(self.digest)))

    def _announce_state(self, status: str = "running") -> None:
        if not self.ranks.leader:
            return
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

    def _dispatch(self, step: int, version: int) -> StepLedger | None:
        """Dispatch ``step`` on ``version``; ``None`` if the trainer was told to stop while waiting for actors."""
        try:
            return self.dispatcher.start_step(step, version, str(self._digest_of(version)), self._prompts(step),
                                              group_size=self.config.group_size,
                                              max_new_tokens=self.task.max_new_tokens,
                                              wait_s=self.config.step_timeout_s, stop=self._stop_requested)
        except NoEligibleActors:
            if not self.stopping:
                raise
            return None

    def _stop_requested(self) -> bool:
        return self.stopping

    def request_stop(self) -> None:
        """Finish the step under way (train, checkpoint, publish) or abandon the one being collected, then stop.
        Called from the signal handler: it only sets a flag."""
        self.stopping = True

    def _collect(self, ledger: StepLedger) -> bool:
        """Settle ``ledger``; ``False`` when stopping first (a control plane that is down then ends the step
        as abandoned instead of failing the trainer: a restart redoes it from the checkpoint)."""
        try:
            return self.dispatcher.collect(ledger, timeout_s=self.config.step_timeout_s, tick=self._heartbeat,
                                           stop=self._stop_requested)
        except BusError:
            if not self.stopping:
                raise
            log.warning("control plane unreachable while stopping: step %d abandoned", ledger.step)
            return False

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
        leader = self.ranks.leader
        self.start()
        lifecycle.enter("training")  # a stop signal now sets `stopping`, acted on below (rank 0 tells the others)
        try:
            self._steps()
        except BusError:
            if not self.stopping:
                raise
            # E.g. publishing while Redis is down: the checkpoint is saved, and a restart publishes that version.
            log.warning("control plane unreachable while stopping: stopped; a restart resumes from the checkpoint",
                        extra={"step": self.step})
        if leader:
            try:
                if not self.stopping:
                    self.dispatcher.commit(self.version)  # let actors activate the final policy too
                self._announce_state("done" if not self.stopping else "stopped")
            except BusError:
                if not self.stopping:
                    raise
                log.warning("control plane unreachable while stopping: state not announced")
            self.export_run_log()
            self.curves.close()
        return self.summary() if leader else {}

    def _steps(self) -> None:
        cfg = self.config
        leader = self.ranks.leader
        start_step = self.step
        # Rollouts for step k+1 are generated on version k-1 while step k trains. The first batch (and the
        # first one after a restart, when actors may already run the newest version) uses the newest version.
        pending = self._dispatch(start_step + 1, self.version) if leader and start_step < cfg.steps else None
        for step in range(start_step + 1, cfg.steps + 1):
            batch, current, wait_s = None, None, 0.0
            if leader and not self.stopping and pending is not None:
                t0 = time.monotonic()
                if self._collect(pending):
                    wait_s = time.monotonic() - t0
                    current = pending
                    if step < cfg.steps:
                        pending = self._dispatch(step + 1, self.version)
                    batch = [_sample_to_json(s) for s in self._samples(current)]
            batch = self.ranks.broadcast(batch, "samples")  # None: rank 0 is stopping
            if batch is None:
                break
            t1 = time.monotonic()
            stats = self.learner.step([_sample_from_json(s) for s in batch])
            train_s = time.monotonic() - t1
            self.step = step
            self.rewards.append(stats.mean_reward)
            counters = self.dispatcher.stats.as_counters() if leader else {}
            self._save_checkpoint(checkpoint.CheckpointInfo(step, self.version + 1, self.rewards, cfg.seed, counters,
                                                            self.ranks.world, self.version))
            delta_bytes, density, publish_s = self._publish(self.version + 1)
            if leader:
                self._record(step, current, stats, wait_s, train_s, (delta_bytes, density, publish_s))

    def _record(self, step: int, current: StepLedger, stats: StepStats, wait_s: float, train_s: float,
                published: tuple[int, float, float]) -> None:
        """Rank 0: the step's record, run-log event, metrics and curves."""
        delta_bytes, density, publish_s = published
        outcome = self._last_publish
        record = StepRecord(step, self.version, current.version, stats.mean_reward, stats.loss, stats.kl,
                            stats.clip_fraction, delta_bytes, density, wait_s, train_s, publish_s,
                            self.dispatcher.stats.accepted, self.dispatcher.stats.rejected_total,
                            len(current.accepted), (current.makespan_ms or 0) / 1000, self.ranks.world,
                            max((t.total_s for t in outcome.ranks), default=0.0), outcome.metadata_bytes)
        self.records.append(record)
        self.plane.log_event("step", **{k: round(v, 6) if isinstance(v, float) else v
                                        for k, v in record.__dict__.items()})
        self.metrics.step.set(step)
        self.metrics.reward.set(stats.mean_reward)
        self.curves.log(step, {
            "reward/mean": stats.mean_reward, "loss/policy": stats.loss, "loss/kl": stats.kl,
            "loss/kl_coef": self.grpo.kl_coef, "loss/clip_fraction": stats.clip_fraction,
            "loss/approx_kl_behaviour": stats.approx_kl_behaviour,
            "loss/grad_norm": stats.grad_norm, "time/generation_wait_s": wait_s, "time/train_s": train_s,
            "time/publish_s": publish_s, "time/makespan_s": record.makespan_s,
            "time/rank_publish_s": record.rank_publish_s, "delta/bytes": delta_bytes, "delta/density": density,
            "rollouts/accepted": self.dispatcher.stats.accepted,
            "rollouts/rejected": self.dispatcher.stats.rejected_total})
        log.info("step %d: reward %.3f, published v%d (%d bytes, density %.4f)", step, stats.mean_reward,
                 self.version, delta_bytes, density)

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
                            "makespan_s": r.makespan_s, "rank_publish_s": r.rank_publish_s} for r in self.records],
            "trainer_ranks": self.ranks.world,
            "cross_rank_bytes": dict(self.ranks.traffic),
        }


def _sample_to_json(sample: Sample) -> list[Any]:
    return [list(sample.prompt_ids), list(sample.completion_ids), list(sample.old_logprobs), sample.reward,
            sample.group]


def _sample_from_json(doc: list[Any]) -> Sample:
    prompt_ids, completion_ids, logprobs, reward, group = doc
    return Sample(tuple(prompt_ids), tuple(completion_ids), tuple(logprobs), float(reward), str(group))


def _die_with_launcher() -> None:
    """Under torchrun, exit when the launcher dies (e.g. SIGKILLed by a supervisor) instead of lingering in a
    collective: Linux's parent-death signal. A no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        log.warning("could not arrange to exit with the launcher")


def main(argv: list[str] | None = None) -> int:
    from aurora_store import logs
    from workers.trainer.cli import parse_args

    cfg = parse_args(argv)
    launch = LaunchEnv.from_env()
    rank = launch.rank
    if launch.launched:
        _die_with_launcher()
    name = "trainer" if rank == 0 else f"trainer-rank{rank}"
    logs.configure(name, cfg.run)
    # Until run() enters "training", SIGTERM/SIGINT unwind; then they set `stopping` (see workers.lifecycle).
    life = lifecycle.install(name)
    return life.run(lambda: _train(cfg, life))


def _train(cfg: TrainerConfig, life: lifecycle.Lifecycle) -> int:
    torch.manual_seed(cfg.seed)
    trainer = Trainer(cfg)
    life.on_stop(trainer.request_stop)  # acted on by rank 0, which tells the other ranks
    try:
        summary = trainer.run()
    except Exception:
        if not trainer.ranks.sharded:
            raise
        traceback.print_exc()  # what the interpreter would print; finish() leaves without it
        return trainer.ranks.finish(1)
    except BaseException:
        trainer.ranks.close()
        raise
    if trainer.ranks.leader:
        out = Path(cfg.checkpoint_dir) / "summary.json"
        out.write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary))
    return trainer.ranks.finish(0)
