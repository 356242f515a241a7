"""Part 5: mean step time of a short real run over the emulated WAN.

The deployment is :class:`workers.cluster.LocalCluster` — the very command lines of the demo and the end-to-end
tests — with its process group swapped for one that starts each process inside its region's namespace through
the harness (:meth:`Topology.popen`): the trainer in ``home`` (home S3 bucket, Redis), the relay and the actors in
``remote`` (regional S3 bucket). Three modes:

* ``full`` — full broadcast every step: the trainer writes a snapshot every version (``--snapshot-every 1``), the
  relay copies it across, actors stage each version from its snapshot (``--full-sync``);
* ``delta`` — the default: sparse deltas, one-step asynchronous;
* ``ideal`` — deltas over an unlimited, zero-delay link: no transfer cost.

Step time is the interval between consecutive ``step`` records in the run log (Redis stream ids are server
milliseconds), after ``skip_steps`` records of bootstrap.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.wan_bench.config import E2EConfig
from benchmarks.wan_bench.env import HOME, REMOTE, WanEnv
from workers.cluster import ClusterSpec, LocalCluster
from workers.launch import Managed, ProcessGroup

log = logging.getLogger("aurora.bench.wan")


class NamespacedGroup(ProcessGroup):
    """A :class:`ProcessGroup` whose processes run inside the region ``region_of(name)`` of a topology."""

    def __init__(self, log_dir: Path, env: dict[str, str], wan: WanEnv, region_of: Callable[[str], str]) -> None:
        super().__init__(log_dir, env)
        self.wan = wan
        self.region_of = region_of

    def start(self, name: str, module: str, args: list[str], *, env: dict[str, str] | None = None,
              prefix: list[str] | None = None) -> Managed:
        region = self.region_of(name)
        argv = [*(prefix or []), sys.executable, "-m", module, *args]
        log_path = self.log_dir / f"{name}.log"
        environment = {**os.environ, **self.env, **(env or {}), "PYTHONUNBUFFERED": "1"}
        with open(log_path, "ab") as log_file:
            process = self.wan.topo.popen(region, argv, env=environment, stdout=log_file, stderr=subprocess.STDOUT)
        managed = Managed(name, self.wan.topo.command(region, argv), process, log_path)
        self.processes[name] = managed
        return managed


def _region_of(name: str) -> str:
    return HOME if name.startswith("trainer") else REMOTE


def step_times(records: list[dict[str, str]], skip: int) -> list[float]:
    """Intervals (s) between consecutive step records, leaving out the first ``skip`` records' intervals."""
    stamps = [(int(r["step"]), int(r["id"].split("-")[0]) / 1000) for r in records]
    stamps.sort()
    return [b[1] - a[1] for a, b in itertools.pairwise(stamps) if b[0] > skip]


def run_mode(wan: WanEnv, cfg: E2EConfig, mode: str, out_dir: Path) -> dict[str, Any]:
    if mode == "ideal":
        cal = wan.shape(None, 0.0, 0.0, calibrate="e2e_ideal")
    else:
        cal = wan.shape(cfg.rate_mbit, cfg.rtt_ms, 0.0, calibrate=f"e2e_{cfg.rate_mbit:g}mbit")
    run = f"e2e-{mode}"
    shutil.rmtree(out_dir / run, ignore_errors=True)  # a trainer checkpoint left there would resume, not start
    buckets = {HOME: wan.bucket(HOME, run), REMOTE: wan.bucket(REMOTE, run)}
    trainer_args = ["--lr", str(cfg.lr), "--epochs", str(cfg.epochs), "--warm-start-steps", str(cfg.warm_start_steps),
                    "--lease-factor", str(cfg.lease_factor), "--split", cfg.split]
    if cfg.model_config:
        trainer_args += ["--model-config", json.dumps(cfg.model_config)]
    actor_args = ["--sim-tokens-per-s", str(cfg.sim_tokens_per_s), "--batch-size", str(cfg.actor_batch_size)]
    if mode == "full":
        actor_args.append("--full-sync")
    spec = ClusterSpec(
        run_dir=out_dir / run, steps=cfg.steps, batch_size=cfg.batch_size, group_size=cfg.group_size, home=HOME,
        actors={REMOTE: cfg.actors}, snapshot_every=1 if mode == "full" else cfg.steps + 1, run=run,
        bucket_urls=buckets, trainer_args=trainer_args, actor_args=actor_args,
        env={**wan.home_s3.env(), "AURORA_HEARTBEAT_TTL": str(cfg.heartbeat_ttl_s)})
    cluster = LocalCluster(spec, redis=wan.redis)
    cluster.group = NamespacedGroup(cluster.run_dir / "logs", dict(spec.env), wan, _region_of)
    wan.reset_link()
    try:
        cluster.start()
        summary = cluster.wait_trainer_done(cfg.timeout_s)
        records = cluster.step_records()
        link = wan.link_counters()
    finally:
        cluster.stop()
    intervals = step_times(records, cfg.skip_steps)
    if not intervals:
        raise RuntimeError(f"e2e {mode}: too few steps ({len(records)}) to measure a steady-state step time")
    result = {
        "mode": mode, "mean_step_s": statistics.fmean(intervals), "median_step_s": statistics.median(intervals),
        "step_intervals_s": intervals, "steps": summary.get("steps"),
        "delta_bytes": summary.get("delta_bytes"), "full_bytes": summary.get("full_bytes"),
        "step_times": summary.get("step_times"), "rollouts_accepted": summary.get("rollouts_accepted"),
        "rollouts_rejected": summary.get("rollouts_rejected"), "leases_expired": summary.get("leases_expired"),
        "cross_region_down_bytes": link["down_bytes"], "link": cal,
        "snapshot_every": spec.snapshot_every, "trainer_args": trainer_args, "actor_args": actor_args,
    }
    log.info("e2e %s: mean step %.2f s over %d intervals", mode, result["mean_step_s"], len(intervals))
    return result


def run(wan: WanEnv, cfg: E2EConfig, out_dir: Path) -> dict[str, Any]:
    results = {mode: run_mode(wan, cfg, mode, out_dir) for mode in cfg.modes}
    doc: dict[str, Any] = {"config": {**cfg.__dict__, "modes": list(cfg.modes)}, "modes": results}
    if "delta" in results and "ideal" in results:
        doc["delta_vs_ideal"] = results["delta"]["mean_step_s"] / results["ideal"]["mean_step_s"]
    if "full" in results and "delta" in results:
        doc["full_vs_delta"] = results["full"]["mean_step_s"] / results["delta"]["mean_step_s"]
    return doc
