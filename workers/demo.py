"""``make demo``: the whole system on one machine, as separate processes.

A local Redis (a real server, started here), two regions whose buckets are local directories, one
trainer in the home region, one relay for the remote region and three actors (one at home, two remote).
It shows live progress and prints, as its last line, one JSON object describing the run.

``--size qwen3-0.6b`` (``make demo-0.6b``) is the realistic regime instead of the toy: the Qwen3-0.6B
configuration (random init, 0.6 B parameters, 151,936-token vocabulary, tied embeddings), the bundled
GSM8K-style set, lr 1e-6 with the lean optimizer (``--optimizer adamw-bf16``), one trainer, one relay and one
actor behind it, a few steps on the CPU. A random-init model never earns a reward, so every group's advantage
is zero and the clipped surrogate has no gradient; the k3 KL term to the frozen bf16 initial policy
(``--kl-coef``) is what moves the weights — Adam normalises its step, so the deltas have the density a real
lr-1e-6 step has.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path

from aurora_store.bus import ControlPlane
from workers import lifecycle
from workers.cluster import ClusterSpec, LocalCluster

HOME, REMOTE = "us-east", "eu-west"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workers.demo", description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--run-dir", default=None, help="where buckets, logs and checkpoints go (default: runs/demo)")
    p.add_argument("--engine", choices=["torch", "vllm"], default="torch")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--keep", action="store_true", help="keep an existing run directory (default: start fresh)")
    p.add_argument("--size", choices=["toy", *REAL_SIZES], default="toy",
                   help="toy: the few-hundred-KB model at lr 2e-4 (dense deltas); qwen3-0.6b: the real "
                        "configuration at lr 1e-6, one relay and one actor (sparse deltas; minutes, ~7 GB)")
    return p.parse_args(argv)


#: Real configurations for ``--size``: the model's shape, and the run's settings that keep it to minutes on a CPU.
QWEN3_06B = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True,
             "max_position_embeddings": 256}
REAL_SIZES = {"qwen3-0.6b": QWEN3_06B}
DATASET = Path(__file__).resolve().parent / "rl" / "data" / "gsm8k_mini.jsonl"


def real_spec(run_dir: Path, size: str, steps: int, engine: str) -> ClusterSpec:
    """One trainer, one relay, one actor on a real configuration at lr 1e-6 (see the module docstring)."""
    trainer_args = ["--model-config", json.dumps(REAL_SIZES[size]), "--dataset", str(DATASET), "--lr", "1e-6",
                    "--optimizer", "adamw-bf16", "--epochs", "1", "--kl-coef", "0.05", "--warm-start-steps", "0",
                    "--initial-lease-s", "600", "--step-timeout-s", "1200"]
    return ClusterSpec(run_dir=run_dir, steps=steps, batch_size=2, group_size=2, home=HOME, actors={REMOTE: 1},
                       engine=engine, snapshot_every=10_000, run="demo-real", metrics=False,
                       trainer_args=trainer_args, actor_args=["--max-new-tokens", "8", "--batch-size", "2"])


def _peak_rss(pid: int) -> int:
    """A live process's peak resident memory (VmHWM), in bytes; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Display:
    def __init__(self, plane: ControlPlane, full_bytes: int | None = None) -> None:
        self.plane = plane
        self.seen_steps = 0
        self.full_bytes = full_bytes

    def update(self) -> None:
        log = self.plane.run_log()
        steps = [e for e in log if e.get("kind") == "step"]
        actors = self.plane.actors()
        for record in steps[self.seen_steps:]:
            who = "  ".join(f"{a}:v{s.active_version}{'+' + str(s.staged_version) if s.staged_version else ''}"
                            f" {s.tokens_per_s:,.0f}tok/s" for a, (s, _) in sorted(actors.items()))
            delta = int(record["delta_bytes"])
            print(f"step {int(record['step']):3d} | reward {float(record['mean_reward']):.3f} | "
                  f"published v{record['version']} | delta {delta / 1024:7.1f} KiB"
                  f"{f' / full {self.full_bytes / 1024:.0f} KiB' if self.full_bytes else ''} "
                  f"(density {100 * float(record['density']):.1f}%) | {who}", flush=True)
        self.seen_steps = len(steps)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM/SIGINT unwind through the cluster's `with`, which stops every process and server it started.
    life = lifecycle.install("demo", harness=True)
    return life.run(lambda: _demo(parse_args(argv)))


def _demo(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir or ("runs/demo" if args.size == "toy" else f"runs/demo-{args.size}")).absolute()
    if run_dir.exists() and not args.keep:
        shutil.rmtree(run_dir)
    if args.size == "toy":
        spec = ClusterSpec(run_dir=run_dir, steps=args.steps, batch_size=args.batch_size,
                           group_size=args.group_size, home=HOME, actors={HOME: 1, REMOTE: 2}, engine=args.engine,
                           snapshot_every=10, run="demo", metrics=True)
    else:
        spec = real_spec(run_dir, args.size, args.steps, args.engine)
    peaks: dict[str, int] = {}
    started = time.monotonic()
    print(f"aurora demo: run directory {run_dir}", flush=True)
    with LocalCluster(spec) as cluster:
        print(f"  redis {cluster.redis.url}; buckets {cluster.buckets[HOME]} (home, {HOME}) and "
              f"{cluster.buckets[REMOTE]} ({REMOTE})", flush=True)
        print(f"  started trainer, relay for {REMOTE}, actors {', '.join(cluster.actor_ids)}; "
              f"logs in {run_dir / 'logs'}", flush=True)
        metrics_ports = cluster.metrics_ports(120)  # each process logs its port once bound
        print("  Prometheus metrics: " + ", ".join(f"{name} http://127.0.0.1:{port}/metrics"
                                                  for name, port in metrics_ports.items()), flush=True)
        print(f"  TensorBoard event files: {run_dir / 'trainer' / 'tb'}  (tensorboard --logdir {run_dir / 'trainer'})"
              f"; signing key {cluster.public_key}", flush=True)
        display = Display(cluster.plane)
        trainer = cluster.trainer()
        reported: set[str] = set()
        while trainer.alive:
            time.sleep(1.0)
            display.update()
            for name, managed in cluster.group.processes.items():
                peaks[name] = max(peaks.get(name, 0), _peak_rss(managed.process.pid))
            for name, managed in cluster.group.processes.items():
                if not managed.alive and name not in reported and managed.process.returncode != 0:
                    reported.add(name)
                    print(f"  ! {name} exited with {managed.process.returncode}:\n{managed.log_tail(15)}",
                          file=sys.stderr, flush=True)
        display.update()
        try:
            summary = cluster.wait_trainer_done(timeout=5)
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"trainer failed: {exc}", file=sys.stderr)
            return 1
        final = summary["trainer_version"]
        # The trainer committed its final version at the end: give the actors a moment to activate it.
        def all_final() -> bool:
            states = cluster.plane.actors()
            return len(states) == len(cluster.actor_ids) and all(s.active_version == final for s, _ in states.values())

        try:
            cluster.wait_for(all_final, 30 if args.size == "toy" else 300, "actors on the final version")
        except TimeoutError:
            print("  ! not every actor reached the final version", file=sys.stderr)
        states = cluster.plane.actors()
        for name, managed in cluster.group.processes.items():
            peaks[name] = max(peaks.get(name, 0), _peak_rss(managed.process.pid))
        cluster.export_run_log()
    result = {
        "steps": summary["steps"], "reward_initial": summary["reward_initial"],
        "reward_final": summary["reward_final"], "delta_bytes": summary["delta_bytes"],
        "full_bytes": summary["full_bytes"], "trainer_version": final, "trainer_digest": summary["trainer_digest"],
        "actors": [{"id": a, "region": s.region, "version": s.active_version, "digest": s.active_digest}
                   for a, (s, _) in sorted(states.items())],
        "densities": summary["densities"], "size": args.size,
        "actors_on_trainer_digest": all(s.active_digest == summary["trainer_digest"] for s, _ in states.values()),
        "peak_rss_bytes": peaks,
        "largest_child_peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "rollouts_accepted": summary["rollouts_accepted"], "rollouts_rejected": summary["rollouts_rejected"],
        "bucket": cluster.buckets[HOME], "regional_buckets": dict(cluster.buckets),
        "logs": str(run_dir / "logs"), "tensorboard": summary.get("logdir"),
        "metrics_ports": metrics_ports, "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
