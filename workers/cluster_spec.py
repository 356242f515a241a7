"""What a local cluster runs (:class:`ClusterSpec`) and the command line each of its processes is started
with (:class:`Commands`): the one place that knows which flags the trainer, the relays and the actors get
in the demo, the end-to-end tests and the chaos suite."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aurora_store.testing.servers import RedisServer
from workers.actor.emulated import FLAGS as EMULATION_FLAGS


@dataclass
class ClusterSpec:
    run_dir: Path
    steps: int = 12
    batch_size: int = 16
    group_size: int = 8
    home: str = "us-east"
    actors: dict[str, int] = field(default_factory=lambda: {"us-east": 1, "eu-west": 2})
    engine: str = "torch"
    snapshot_every: int = 10
    run: str = "test"
    bucket_urls: dict[str, str] | None = None  # region -> URL; default: local directories under run_dir
    trainer_args: list[str] = field(default_factory=list)
    actor_args: list[str] = field(default_factory=list)
    relay_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    signing: bool = True  # the trainer signs manifests; actors and relays verify them
    metrics: bool = False  # give every process a Prometheus endpoint on a free port
    trainer_ranks: int = 1  # > 1: the trainer runs data parallel under torchrun (FSDP2, gloo on CPU)
    # torch / OpenMP intra-op threads of each process; None: the host's cores shared out among the processes
    threads_per_process: int | None = None

    @property
    def processes(self) -> int:
        """Processes :meth:`LocalCluster.start` runs: the trainer's ranks, a relay per remote region, the actors."""
        relays = sum(1 for region, count in self.actors.items() if region != self.home and count)
        return self.trainer_ranks + relays + sum(self.actors.values())

    def thread_env(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` for every process, unless the caller's environment or
        :attr:`env` sets them.

        Why: each process's torch would otherwise start one OpenMP thread per core. With several processes on
        one host that oversubscribes the cores, and OpenMP's spinning waits then burn them: on 2 cores a
        trainer of the small built-in model used 5× the CPU (81 CPU-s against 15 for a 30-step run)."""
        if any(key in environ or key in self.env for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
            return {}
        threads = self.threads_per_process or max(1, (os.cpu_count() or 1) // max(1, self.processes))
        return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


class Commands:
    """Module and arguments of each process; which ones serve metrics (``spec.metrics``)."""

    def __init__(self, spec: ClusterSpec, run_dir: Path, buckets: dict[str, str], redis: RedisServer, *,
                 signing_key: Path | None, public_key: Path | None) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.buckets = buckets
        self.redis = redis  # read when a command is built: Redis may move to fresh ports when it starts
        self.signing_key = signing_key
        self.public_key = public_key
        self.metrics_processes: list[str] = []  # the names of the processes started with a metrics endpoint

    def common(self, role: str) -> list[str]:
        """Redis (as ``role``'s ACL user, when the server has them) and run."""
        return ["--redis", self.redis.url_for(role), "--run", self.spec.run]

    @property
    def trust(self) -> list[str]:
        return ["--trainer-public-key", str(self.public_key)] if self.public_key else []

    def metrics(self, name: str) -> list[str]:
        # Port 0: the process binds whatever port is free then and logs it. A port picked here would be free
        # only until the process bound it, seconds later; a server started meanwhile (a parallel test's) can
        # take it, and this process then dies at start while its scraper reads the other server.
        if not self.spec.metrics:
            return []
        if name not in self.metrics_processes:
            self.metrics_processes.append(name)
        return ["--metrics-port", "0"]

    def trainer(self, name: str, extra: list[str] | None = None) -> tuple[str, list[str]]:
        spec = self.spec
        # Under torchrun the launcher is the managed process: its exit code is the ranks' and SIGTERM reaches
        # every rank (rank 0 finishes the step and tells the others to stop).
        module, launcher = "workers.trainer", []
        if spec.trainer_ranks > 1:
            module = "torch.distributed.run"
            launcher = ["--standalone", "--nproc-per-node", str(spec.trainer_ranks), "-m", "workers.trainer"]
        return module, [*launcher, *self.metrics(name),
            "--bucket", self.buckets[spec.home], "--region", spec.home, "--steps", str(spec.steps),
            "--batch-size", str(spec.batch_size), "--group-size", str(spec.group_size),
            "--checkpoint-dir", str(self.run_dir / "trainer"), "--snapshot-every", str(spec.snapshot_every),
            *(["--signing-key", str(self.signing_key)] if self.signing_key else []),
            *(self.common("trainer") if not launcher else _torchrun_safe(self.common("trainer"))), *spec.trainer_args,
            *(extra or [])]

    def relay(self, name: str, region: str, extra: list[str] | None = None) -> list[str]:
        return [*self.metrics(name),
                "--source", self.buckets[self.spec.home], "--dest", self.buckets[region], "--region", region,
                "--cache-bind", "127.0.0.1", "--cache-port", "0", "--cache-host", "127.0.0.1",
                *self.common("relay"), *self.trust, *self.spec.relay_args, *(extra or [])]

    def actor(self, actor_id: str, region: str, extra: list[str] | None = None) -> tuple[str, list[str]]:
        args = [*self.metrics(f"actor-{actor_id}"),
                "--bucket", self.buckets[region], "--source-bucket", self.buckets[self.spec.home], "--region", region,
                "--id", actor_id, "--engine", self.spec.engine,
                "--cache-dir", str(self.run_dir / "cache" / actor_id), *self.common("actor"), *self.trust,
                *self.spec.actor_args, *(extra or [])]
        # Actors asked to emulate a slower (or throttled, or boastful) engine run the emulating entry point; the
        # production actor has no such flags.
        emulated = any(a.split("=")[0] in EMULATION_FLAGS for a in args)
        return "workers.actor.emulated" if emulated else "workers.actor", args


def _torchrun_safe(args: list[str]) -> list[str]:
    """torchrun claims ``--run`` (a prefix of its ``--run-path``); the trainer also accepts ``--run-name``."""
    return ["--run-name" if a == "--run" else a for a in args]
