"""``make demo``: the whole system on one machine, as separate processes.

A local Redis (a real server, started here), two regions whose buckets are local directories, one
trainer in the home region, one relay for the remote region and three actors (one at home, two remote).
It shows live progress and prints, as its last line, one JSON object describing the run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from aurora_store.bus import ControlPlane
from aurora_store.localservices import RedisServer
from workers.launch import ProcessGroup

HOME, REMOTE = "us-east", "eu-west"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workers.demo", description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--run-dir", default=None, help="where buckets, logs and checkpoints go (default: runs/demo)")
    p.add_argument("--engine", choices=["torch", "vllm"], default="torch")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--keep", action="store_true", help="keep an existing run directory (default: start fresh)")
    return p.parse_args(argv)


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
    args = parse_args(argv)
    run_dir = Path(args.run_dir or "runs/demo").absolute()
    if run_dir.exists() and not args.keep:
        shutil.rmtree(run_dir)
    buckets = {HOME: run_dir / "buckets" / HOME, REMOTE: run_dir / "buckets" / REMOTE}
    for path in buckets.values():
        path.mkdir(parents=True, exist_ok=True)
    run = "demo"
    started = time.monotonic()
    print(f"aurora demo: run directory {run_dir}", flush=True)
    with RedisServer().start() as redis, ProcessGroup(run_dir / "logs") as group:
        print(f"  redis {redis.url}; buckets {buckets[HOME]} (home, {HOME}) and {buckets[REMOTE]} ({REMOTE})",
              flush=True)
        common = ["--redis", redis.url, "--run", run]
        group.start("trainer", "workers.trainer", [
            "--bucket", str(buckets[HOME]), "--region", HOME, "--steps", str(args.steps),
            "--batch-size", str(args.batch_size), "--group-size", str(args.group_size),
            "--checkpoint-dir", str(run_dir / "trainer"), "--snapshot-every", "10", *common])
        group.start(f"relay-{REMOTE}", "workers.relay", [
            "--source", str(buckets[HOME]), "--dest", str(buckets[REMOTE]), "--region", REMOTE, *common])
        actors = [(f"{HOME}-1", HOME), (f"{REMOTE}-1", REMOTE), (f"{REMOTE}-2", REMOTE)]
        for actor_id, region in actors:
            group.start(f"actor-{actor_id}", "workers.actor", [
                "--bucket", str(buckets[region]), "--region", region, "--id", actor_id,
                "--engine", args.engine, "--cache-dir", str(run_dir / "cache" / actor_id), *common])
        print(f"  started trainer, relay for {REMOTE}, actors {', '.join(a for a, _ in actors)}; "
              f"logs in {run_dir / 'logs'}", flush=True)
        plane = ControlPlane(redis.url, run)
        display = Display(plane)
        trainer = group["trainer"]
        while trainer.alive:
            time.sleep(1.0)
            display.update()
            for name, managed in group.processes.items():
                if not managed.alive and name != "trainer" and managed.process.returncode not in (0, None):
                    print(f"  ! {name} exited with {managed.process.returncode}:\n{managed.log_tail(15)}",
                          file=sys.stderr, flush=True)
                    managed.process.returncode = 0  # report once
        display.update()
        summary_path = run_dir / "trainer" / "summary.json"
        if trainer.process.returncode != 0 or not summary_path.exists():
            print(f"trainer failed (exit {trainer.process.returncode}):\n{trainer.log_tail(40)}", file=sys.stderr)
            return 1
        summary = json.loads(summary_path.read_text())
        final = summary["trainer_version"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the trainer committed its final version: let actors activate it
            states = plane.actors()
            if len(states) == len(actors) and all(s.active_version == final for s, _ in states.values()):
                break
            time.sleep(0.5)
        states = plane.actors()
        group.stop_all()
    result = {
        "steps": summary["steps"], "reward_initial": summary["reward_initial"],
        "reward_final": summary["reward_final"], "delta_bytes": summary["delta_bytes"],
        "full_bytes": summary["full_bytes"], "trainer_version": final, "trainer_digest": summary["trainer_digest"],
        "actors": [{"id": a, "region": s.region, "version": s.active_version, "digest": s.active_digest}
                   for a, (s, _) in sorted(states.items())],
        "rollouts_accepted": summary["rollouts_accepted"], "rollouts_rejected": summary["rollouts_rejected"],
        "bucket": str(buckets[HOME]), "regional_buckets": {r: str(p) for r, p in buckets.items()},
        "logs": str(run_dir / "logs"), "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
