"""Rank 0's account of the run: a record per step (a run-log event, metrics and curves) and the summary the
trainer prints and writes next to its checkpoint."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aurora_store.bus import ControlPlane
from aurora_store.metrics import Metrics
from aurora_store.sched import StepLedger
from workers.publish.delta import PublishOutcome
from workers.publish.ranks import Ranks
from workers.rl.grpo import StepStats
from workers.trainer.curves import CurveLogger
from workers.trainer.dispatch import Dispatcher
from workers.trainer.state import Progress

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


def published_sizes(outcome: PublishOutcome) -> tuple[int, float, float]:
    """Bytes, density and seconds of a publish; zeros on the ranks that do not write the manifest."""
    report = outcome.report
    if report is None:
        return 0, 0.0, 0.0
    return report.total_bytes, report.manifest.density, report.total_s


class RunReport:
    def __init__(self, plane: ControlPlane, metrics: Metrics, curves: CurveLogger, dispatcher: Dispatcher,
                 ranks: Ranks, kl_coef: float) -> None:
        self.plane = plane
        self.metrics = metrics
        self.curves = curves
        self.dispatcher = dispatcher
        self.ranks = ranks
        self.kl_coef = kl_coef
        self.records: list[StepRecord] = []

    def record(self, step: int, version: int, current: StepLedger, stats: StepStats, wait_s: float, train_s: float,
               outcome: PublishOutcome) -> None:
        """The step's record, run-log event, metrics and curves (``version``: the one the step published)."""
        delta_bytes, density, publish_s = published_sizes(outcome)
        counts = self.dispatcher.stats
        record = StepRecord(step, version, current.version, stats.mean_reward, stats.loss, stats.kl,
                            stats.clip_fraction, delta_bytes, density, wait_s, train_s, publish_s,
                            counts.accepted, counts.rejected_total,
                            len(current.accepted), (current.makespan_ms or 0) / 1000, self.ranks.world,
                            max((t.total_s for t in outcome.ranks), default=0.0), outcome.metadata_bytes)
        self.records.append(record)
        self.plane.log_event("step", **{k: round(v, 6) if isinstance(v, float) else v
                                        for k, v in record.__dict__.items()})
        self.metrics.step.set(step)
        self.metrics.reward.set(stats.mean_reward)
        self.curves.log(step, {
            "reward/mean": stats.mean_reward, "loss/policy": stats.loss, "loss/kl": stats.kl,
            "loss/kl_coef": self.kl_coef, "loss/clip_fraction": stats.clip_fraction,
            "loss/approx_kl_behaviour": stats.approx_kl_behaviour,
            "loss/grad_norm": stats.grad_norm, "time/generation_wait_s": wait_s, "time/train_s": train_s,
            "time/publish_s": publish_s, "time/makespan_s": record.makespan_s,
            "time/rank_publish_s": record.rank_publish_s, "delta/bytes": delta_bytes, "delta/density": density,
            "rollouts/accepted": counts.accepted,
            "rollouts/rejected": counts.rejected_total})
        log.info("step %d: reward %.3f, published v%d (%d bytes, density %.4f)", step, stats.mean_reward,
                 version, delta_bytes, density)

    def summary(self, progress: Progress, *, full_bytes: int, bucket: str) -> dict[str, Any]:
        k = min(3, len(progress.rewards))
        counts = self.dispatcher.stats
        return {
            "steps": progress.step,
            "reward_initial": sum(progress.rewards[:k]) / k if k else None,
            "reward_final": sum(progress.rewards[-k:]) / k if k else None,
            "rewards": progress.rewards,
            "delta_bytes": [r.delta_bytes for r in self.records],
            "densities": [r.density for r in self.records],
            "full_bytes": full_bytes,
            "trainer_version": progress.version,
            "trainer_digest": str(progress.digest),
            "rollouts_accepted": counts.accepted,
            "rollouts_rejected": counts.rejected_total,
            "rejected_by_reason": dict(counts.rejected),
            "leases_expired": counts.expired,
            "leases_returned": counts.returned,
            "per_actor_accepted": dict(counts.per_actor_accepted),
            "bucket": bucket,
            "logdir": str(self.curves.logdir),
            "step_times": [{"wait_s": r.wait_s, "train_s": r.train_s, "publish_s": r.publish_s,
                            "makespan_s": r.makespan_s, "rank_publish_s": r.rank_publish_s} for r in self.records],
            "trainer_ranks": self.ranks.world,
            "cross_rank_bytes": dict(self.ranks.traffic),
        }
