"""What rank 0 alone does: it holds the run's control plane (leases, announcements, the trainer's state, the
run log), writes the curves and reports the run. The other ranks have no :class:`Leader` at all, so code
that needs one says so by its type instead of checking the rank."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from aurora_store.bus import ControlPlane, TrainerState, VersionEvent
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.config import CommandDefaults
from aurora_store.errors import AuroraError
from aurora_store.metrics import Metrics
from aurora_store.sched import LeasePolicy, ThroughputEstimator
from aurora_store.store import DeltaStore, object_names
from workers.publish.delta import PublishOutcome
from workers.publish.ranks import Ranks
from workers.trainer.cli import TrainerConfig
from workers.trainer.curves import CurveLogger
from workers.trainer.dispatch import Dispatcher
from workers.trainer.report import RunReport
from workers.trainer.state import Progress

log = logging.getLogger("aurora.trainer")


@dataclass(frozen=True)
class Leader:
    config: TrainerConfig
    ranks: Ranks
    plane: ControlPlane
    dispatcher: Dispatcher
    metrics: Metrics
    curves: CurveLogger
    report: RunReport
    bucket: str  # the home bucket's URL, as the trainer state names it

    @classmethod
    def open(cls, cfg: TrainerConfig, ranks: Ranks, metrics: Metrics, bucket: str, *,
             heartbeat_ttl_s: int) -> Leader:
        def recreate() -> None:
            """Redis lost everything: re-create what only lived there (notifications will resume)."""
            plane.ensure_results_group()

        plane = ControlPlane(cfg.redis, cfg.run, heartbeat_ttl_s=heartbeat_ttl_s, on_reconnect=recreate)
        curves = CurveLogger(cfg.logdir or Path(cfg.checkpoint_dir) / "tb", run=cfg.run, config=dict(cfg.__dict__),
                             use_wandb=cfg.wandb)
        dispatcher = Dispatcher(plane, cfg.region, f"trainer-{os.getpid()}",
                                LeasePolicy(factor=cfg.lease_factor, initial_ms=int(1000 * cfg.initial_lease_s)),
                                ThroughputEstimator(beta=cfg.throughput_ema, alpha=cfg.exclusion_decay),
                                admission_secret=CommandDefaults.from_env().admission_secret or "",
                                uniform=cfg.split == "uniform", metrics=metrics)
        report = RunReport(plane, metrics, curves, dispatcher, ranks, cfg.kl_coef)
        return cls(cfg, ranks, plane, dispatcher, metrics, curves, report, bucket)

    def announce_state(self, progress: Progress, status: str = "running") -> None:
        self.metrics.version_committed.set(self.dispatcher.committed)
        self.plane.set_trainer_state(TrainerState(progress.version, str(progress.digest), progress.step, self.bucket,
                                                  self.config.region, self.plane.now_ms(), status,
                                                  self.dispatcher.committed))

    def announce_published(self, version: int, outcome: PublishOutcome) -> None:
        """Version ``version``'s manifest is written: its metrics, and ``staged`` for relays and actors."""
        report = outcome.report
        if report is not None:
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
                                         manifest_key=object_names.delta(version),
                                         weights_digest=str(outcome.digest), sent_ms=self.plane.now_ms()))

    def announce_snapshot(self, version: int, digest: WeightsDigest) -> None:
        self.plane.announce(VersionEvent("snapshot", version, self.config.region,
                                         manifest_key=object_names.snapshot_manifest(version),
                                         weights_digest=str(digest)))

    def export_run_log(self, store: DeltaStore) -> None:
        """Copy the run log (Redis, ephemeral) into the bucket, where operators and notebooks find it."""
        from aurora_store.ops.runlog import export_run_log

        try:
            export_run_log(self.plane, store)
        except AuroraError as exc:
            log.warning("could not export the run log", extra={"error": str(exc)})
