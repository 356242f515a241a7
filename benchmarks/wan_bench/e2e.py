"""Part 5: mean step time of short real runs over the emulated WAN, modes interleaved, with 95 % intervals.

The deployment is :class:`workers.cluster.LocalCluster` — the very command lines of the demo and the end-to-end
tests — with its process group swapped for one that starts each process inside its region's namespace through
the harness (:meth:`Topology.popen`): the trainer in ``home`` (home S3 bucket, Redis), the relay and the actors in
``remote`` (regional S3 bucket). Three modes:

* ``full`` — full broadcast every step: the trainer writes a snapshot every version (``--snapshot-every 1``), the
  relay copies it across, actors stage each version from its snapshot (``--full-sync``);
* ``delta`` — the default: sparse deltas, one-step asynchronous;
* ``ideal`` — deltas over an unlimited, zero-delay link: no transfer cost;
* ``delta_sf`` (on request, ``--e2e-modes``) — deltas without the last hop's overlap, as before cut-through
  reached the actors: they fetch a version only once its regional manifest exists (``--no-prefetch``) and the
  relay serves no hot cache (``--no-serve-cache``); ``delta_vs_delta_sf`` says what that overlap buys a step.

Step time is the interval between consecutive ``step`` records in the run log (Redis stream ids are server
milliseconds), after ``skip_steps`` records of bootstrap. The modes run in ``rounds``, one short run per mode per
round, in an order rotated from round to round, so slow drift of a shared machine hits every mode alike and no
mode always runs first; the ratios of mean step times get a 95 % interval with the rounds as the units
(:mod:`benchmarks.wan_bench.stats`). Each run's run log is saved beside its process logs (``runlog.json``).

Steady steps need generation to bind. One-step-async closes a loop two steps long: publish ``v_k`` → actors stage
it → they generate ``B_{k+2}`` on it → the trainer collects → trains → publishes ``v_{k+2}``. When staging +
training + publishing outlast generation, that loop binds; the trainer's wait for a batch then alternates between
"staging already done" and "staging still to do" from one step to the next, a period-2 swing that nothing damps
(the run logs showed activations 2–6 s after a dispatch that followed its publish within 0.5 s, then none at the
next step). Generation is therefore emulated long enough to cover the rest (:class:`E2EConfig`), and at full
length (``--sim-full-length``) so that sampled lengths do not move it from step to step.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.wan_bench import stats, warm
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


def round_order(modes: tuple[str, ...], round_index: int) -> list[str]:
    """The modes of round ``round_index``, rotated by one per round: every mode takes every position equally
    often over ``len(modes)`` rounds (a mode that always ran first would always meet the freshest machine)."""
    shift = round_index % len(modes) if modes else 0
    return [*modes[shift:], *modes[:shift]]


def mode_args(cfg: E2EConfig, mode: str) -> tuple[list[str], list[str]]:
    """The actors' and the relay's extra command-line arguments in ``mode``."""
    actor_args = ["--sim-tokens-per-s", str(cfg.sim_tokens_per_s), "--batch-size", str(cfg.actor_batch_size)]
    if cfg.sim_full_length:
        actor_args.append("--sim-full-length")
    relay_args: list[str] = []
    if mode == "full":
        actor_args.append("--full-sync")
    elif mode == "delta_sf":
        actor_args.append("--no-prefetch")
        relay_args.append("--no-serve-cache")
    return actor_args, relay_args


def run_mode(wan: WanEnv, cfg: E2EConfig, mode: str, out_dir: Path, round_index: int = 0,
             model_dir: Path | None = None) -> dict[str, Any]:
    if mode == "ideal":
        cal = wan.shape(None, 0.0, 0.0, calibrate="e2e_ideal")
    else:
        cal = wan.shape(cfg.rate_mbit, cfg.rtt_ms, 0.0, calibrate=f"e2e_{cfg.rate_mbit:g}mbit")
    run = f"e2e-{mode.replace('_', '-')}-r{round_index}"  # also a bucket name: no underscores
    steps = cfg.steps_of(mode)
    shutil.rmtree(out_dir / run, ignore_errors=True)  # a trainer checkpoint left there would resume, not start
    buckets = {HOME: wan.bucket(HOME, run), REMOTE: wan.bucket(REMOTE, run)}
    trainer_args = ["--lr", str(cfg.lr), "--epochs", str(cfg.epochs), "--lease-factor", str(cfg.lease_factor),
                    "--split", cfg.split]
    if model_dir is not None:  # warm-started once for every run
        trainer_args += ["--model", str(model_dir)]
    else:
        trainer_args += ["--warm-start-steps", str(cfg.warm_start_steps)]
        if cfg.model_config:
            trainer_args += ["--model-config", json.dumps(cfg.model_config)]
    actor_args, relay_args = mode_args(cfg, mode)
    spec = ClusterSpec(
        run_dir=out_dir / run, steps=steps, batch_size=cfg.batch_size, group_size=cfg.group_size, home=HOME,
        actors={REMOTE: cfg.actors}, snapshot_every=1 if mode == "full" else steps + 1, run=run,
        bucket_urls=buckets, trainer_args=trainer_args, actor_args=actor_args, relay_args=relay_args,
        env={**wan.home_s3.env(), "AURORA_HEARTBEAT_TTL": str(cfg.heartbeat_ttl_s)})
    cluster = LocalCluster(spec, redis=wan.redis)
    cluster.group = NamespacedGroup(cluster.run_dir / "logs", dict(spec.env), wan, _region_of)
    wan.reset_link()
    try:
        cluster.start()
        summary = cluster.wait_trainer_done(cfg.timeout_s)
        run_log = cluster.plane.run_log()
        link = wan.link_counters()
    finally:
        cluster.stop()
    (cluster.run_dir / "logs" / "runlog.json").write_text(json.dumps(run_log))
    records = [e for e in run_log if e.get("kind") == "step"]
    intervals = step_times(records, cfg.skip_steps)
    if not intervals:
        raise RuntimeError(f"e2e {mode}: too few steps ({len(records)}) to measure a steady-state step time")
    result = {
        "mode": mode, "round": round_index, "mean_step_s": sum(intervals) / len(intervals),
        "step_intervals_s": intervals, "steps": summary.get("steps"),
        "delta_bytes": summary.get("delta_bytes"), "full_bytes": summary.get("full_bytes"),
        "step_times": summary.get("step_times"), "rollouts_accepted": summary.get("rollouts_accepted"),
        "rollouts_rejected": summary.get("rollouts_rejected"), "leases_expired": summary.get("leases_expired"),
        "cross_region_down_bytes": link["down_bytes"], "link": cal,
        "snapshot_every": spec.snapshot_every, "trainer_args": trainer_args, "actor_args": actor_args,
        "relay_args": relay_args,
    }
    log.info("e2e round %d %s: mean step %.2f s over %d intervals (%s)", round_index, mode, result["mean_step_s"],
             len(intervals), " ".join(f"{s:.2f}" for s in intervals))
    return result


def _ratio(doc: dict[str, Any], name: str, runs: list[dict[str, dict[str, Any]]], num: str, den: str) -> None:
    """``doc[name]`` = mean(num) / mean(den) over every run, ``doc[name + "_ci95"]`` its 95 % interval."""
    if not all(num in r and den in r for r in runs):
        return
    ci = stats.ratio_of_means([r[num]["step_intervals_s"] for r in runs], [r[den]["step_intervals_s"] for r in runs])
    doc[name] = ci.point
    doc[f"{name}_ci95"] = ci.as_list()
    doc[f"{name}_ci"] = {"method": ci.method, "units": ci.units, "df": ci.df, "half_width": ci.half_width}


def run(wan: WanEnv, cfg: E2EConfig, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    model_dir = warm.build(cfg.model_config, cfg.warm_start_steps, out_dir / "warm-model")
    warm_s = time.monotonic() - started
    log.info("e2e: warm-started policy built in %.0f s", warm_s)
    runs: list[dict[str, dict[str, Any]]] = []
    round_s: list[float] = []
    for index in range(cfg.rounds):
        if round_s and time.monotonic() - started + max(round_s) > cfg.budget_s:
            log.info("e2e: stopping after %d rounds: another would overrun the %.0f s budget", index, cfg.budget_s)
            break
        t0 = time.monotonic()
        order = round_order(cfg.modes, index)
        runs.append({mode: run_mode(wan, cfg, mode, out_dir, index, model_dir) for mode in order})
        round_s.append(time.monotonic() - t0)
    modes: dict[str, Any] = {}
    for mode in cfg.modes:
        per_run = [r[mode] for r in runs]
        summary = stats.summarize([s for r in per_run for s in r["step_intervals_s"]])
        modes[mode] = {
            "mean_step_s": summary.mean, "median_step_s": summary.median, "stdev_step_s": summary.stdev,
            "min_step_s": summary.min, "max_step_s": summary.max, "intervals": summary.n,
            "run_mean_step_s": [r["mean_step_s"] for r in per_run],
            # the first round's run as the trainer summary ``aurora plan --calibrate`` reads (one run's steps)
            **{k: per_run[0][k] for k in ("step_intervals_s", "step_times", "delta_bytes", "full_bytes", "link")},
            "rollouts_rejected": sum(r["rollouts_rejected"] or 0 for r in per_run),
            "leases_expired": sum(r["leases_expired"] or 0 for r in per_run),
            "cross_region_down_bytes_per_run": [r["cross_region_down_bytes"] for r in per_run],
        }
    doc: dict[str, Any] = {"config": {**cfg.__dict__, "modes": list(cfg.modes)}, "modes": modes,
                           "rounds_done": len(runs), "round_s": round_s, "warm_start_s": warm_s,
                           "rounds": [{"order": round_order(cfg.modes, i), "runs": r} for i, r in enumerate(runs)]}
    _ratio(doc, "delta_vs_ideal", runs, "delta", "ideal")
    _ratio(doc, "full_vs_delta", runs, "full", "delta")
    _ratio(doc, "delta_sf_vs_ideal", runs, "delta_sf", "ideal")
    _ratio(doc, "delta_vs_delta_sf", runs, "delta", "delta_sf")
    return doc
