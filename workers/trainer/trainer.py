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

The parts: :mod:`.bootstrap` (fresh start or resume), :mod:`.loop` (the steps), :mod:`.publishing` (deltas,
snapshots, digests), :mod:`.leader` (what only rank 0 does on Redis) and :mod:`.report` (records, curves,
the summary); this module builds them and runs them in order.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from aurora_store.bus import ControlPlane
from aurora_store.codec import CodecParams, ModelLayout
from aurora_store.codec.namesets import snapshot_layout
from aurora_store.config import LaunchEnv, TransferSettings, heartbeat_ttl_s
from aurora_store.errors import BusError
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.trust import Signer
from workers import lifecycle
from workers.publish.ranks import Ranks
from workers.rl.grpo import GRPOConfig
from workers.rl.model import side_files
from workers.rl.task import AdditionTask, MathFileTask
from workers.trainer import memory
from workers.trainer.bootstrap import Bootstrap, PolicyModel
from workers.trainer.cli import TrainerConfig, resolve_activation_checkpointing, resolve_optimizer
from workers.trainer.device import configure_compute, process_group_backend, resolve_device
from workers.trainer.leader import Leader
from workers.trainer.loop import StepLoop
from workers.trainer.publishing import Publishing
from workers.trainer.state import Progress, Started

log = logging.getLogger("aurora.trainer")


class Trainer:
    def __init__(self, config: TrainerConfig) -> None:
        self.config = cfg = config
        self.stopping = False
        self.device = resolve_device(cfg.device)
        self.ranks = Ranks.from_env(timeout_s=max(3600.0, 3 * cfg.step_timeout_s),
                                    backend=process_group_backend(self.device))
        configure_compute(self.device)
        self._check_memory()  # before anything is allocated, opened or announced
        leader = self.ranks.leader
        self.settings = settings = TransferSettings.from_env().with_overrides(streams=cfg.streams)
        # Every rank uploads its own segments and snapshot files and announces its segments (``segment_plane``);
        # everything else on Redis is rank 0's (its Leader).
        self.store = DeltaStore(open_bucket(cfg.bucket, create=True, settings=settings), settings)
        ttl = heartbeat_ttl_s()
        self.metrics = Metrics("trainer", cfg.run, cfg.region)
        self.leader = Leader.open(cfg, self.ranks, self.metrics, self.store.url, heartbeat_ttl_s=ttl) \
            if leader else None
        segment_plane = self.leader.plane if self.leader is not None else \
            ControlPlane(cfg.redis, cfg.run, heartbeat_ttl_s=ttl)
        self.task: AdditionTask | MathFileTask = MathFileTask(cfg.dataset, seed=cfg.seed) if cfg.dataset else \
            AdditionTask(max_operand=cfg.max_operand, seed=cfg.seed)
        self.model = model = PolicyModel.load(cfg)
        self.layout = ModelLayout.from_config(model.config)
        if self.leader is not None and isinstance(model.config.get("vocab_size"), int):
            # Results' token ids must index the model's logits (its padded vocabulary, which actors sample from).
            self.leader.dispatcher.vocab_size = model.config["vocab_size"]
        self.grpo = GRPOConfig(lr=cfg.lr, clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef, epochs=cfg.epochs)
        sign = Signer.load(cfg.signing_key) if cfg.signing_key and leader else None
        producer: dict[str, Any] = {"run": cfg.run, "process": "trainer", "host": socket.gethostname()}
        if self.ranks.sharded:
            producer["ranks"] = self.ranks.world
        publisher = VersionPublisher(self.store, self.layout, CodecParams(segment_bytes=cfg.segment_bytes),
                                     settings.streams, producer=producer, sign=sign)
        self.progress = Progress()
        self.publishing = Publishing(cfg, self.ranks, self.store, self.layout, publisher, segment_plane,
                                     self.progress, self.leader, side_files=lambda: side_files(model.config,
                                                                                                model.tokenizer),
                                     sign=sign, files_layout=snapshot_layout(model.config))
        if cfg.metrics_port is not None and self.leader is not None:
            self.metrics.serve(cfg.metrics_port)

    def _check_memory(self) -> None:
        """Refuse to start (:class:`~aurora_store.errors.InsufficientMemoryError`) if the memory plan for this run
        exceeds the GPU's memory, or ``--gpu-memory-gib`` where given (also on the CPU, planned as a GPU run)."""
        cfg, world = self.config, self.ranks.world
        if self.device.type != "cuda" and cfg.gpu_memory_gib is None:
            return
        budget = int(cfg.gpu_memory_gib * memory.GIB) if cfg.gpu_memory_gib is not None else \
            torch.cuda.get_device_properties(self.device).total_memory
        kind = "cuda"  # the plan is for a GPU run; --gpu-memory-gib on the CPU checks the same arithmetic
        settings = memory.settings_for(
            device=kind, world_size=world, optimizer=resolve_optimizer(cfg.optimizer, kind, world),
            compute=cfg.compute_dtype, kl=cfg.kl_coef > 0, logits_chunk=cfg.logits_chunk,
            activation_checkpointing=resolve_activation_checkpointing(cfg.activation_checkpointing, kind))
        result = memory.check(memory.model_config(cfg.model, cfg.model_config), world_size=world,
                              sequences=-(-cfg.batch_size * cfg.group_size // world), seq_len=cfg.plan_seq_len,
                              settings=settings, budget_bytes=budget)
        log.info("memory plan", extra={"per_gpu_bytes": result.per_gpu_bytes, "budget_bytes": budget,
                                       "peak_phase": result.peak_phase})

    def start(self) -> Started:
        """Fresh start (version 0) or resume from the checkpoint; the sharded policy and its learner."""
        return Bootstrap(self.config, self.ranks, self.device, self.store, self.model, self.layout, self.grpo,
                         self.task, self.publishing, self.progress, self.leader).start()

    def request_stop(self) -> None:
        """Finish the step under way (train, checkpoint, publish) or abandon the one being collected, then stop.
        Called from the signal handler: it only sets a flag."""
        self.stopping = True

    def _stop_requested(self) -> bool:
        return self.stopping

    def run(self) -> dict[str, Any]:
        """Start, train every step, then (rank 0) commit the final version and report; rank 0's summary."""
        started = self.start()
        lifecycle.enter("training")  # a stop signal now sets `stopping`, acted on below (rank 0 tells the others)
        loop = StepLoop(self.config, self.ranks, self.task, self.model.tokenizer, started, self.publishing,
                        self.progress, self.leader, stopping=self._stop_requested)
        try:
            loop.run()
        except BusError:
            if not self.stopping:
                raise
            # E.g. publishing while Redis is down: the checkpoint is saved, and a restart publishes that version.
            log.warning("control plane unreachable while stopping: stopped; a restart resumes from the checkpoint",
                        extra={"step": self.progress.step})
        if self.leader is None:
            return {}
        return self._finish(self.leader)

    def _finish(self, leader: Leader) -> dict[str, Any]:
        try:
            if not self.stopping:
                leader.dispatcher.commit(self.progress.version)  # let actors activate the final policy too
            leader.announce_state(self.progress, "done" if not self.stopping else "stopped")
        except BusError:
            if not self.stopping:
                raise
            log.warning("control plane unreachable while stopping: state not announced")
        leader.export_run_log(self.store)
        leader.curves.close()
        return leader.report.summary(self.progress, full_bytes=self.layout.nbytes, bucket=self.store.url)


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

    if "--plan-memory" in (sys.argv[1:] if argv is None else argv):
        from workers.trainer.memory import run_cli

        return run_cli(argv)
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
