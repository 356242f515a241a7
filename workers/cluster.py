"""A whole Aurora deployment on one machine: Redis, per-region buckets, trainer, relays and actors as real
processes. The demo, the end-to-end tests and the chaos suite all drive the system through this."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aurora_store.bus import ActorState, ControlPlane, acl
from aurora_store.errors import ServiceError
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.testing.servers import RedisServer
from workers.cluster_spec import ClusterSpec, Commands
from workers.launch import Managed, ProcessGroup

__all__ = ["ClusterSpec", "LocalCluster"]


class LocalCluster:
    def __init__(self, spec: ClusterSpec, redis: RedisServer | None = None) -> None:
        self.spec = spec
        self.run_dir = Path(spec.run_dir).absolute()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._own_redis = redis is None
        # Per-role ACL users (trainer, relay, actor): each process connects as its role, as in production.
        self.redis = redis or RedisServer(acl_users={role: secrets.token_hex(16) for role in acl.ROLES})
        regions = sorted({spec.home, *spec.actors})
        self.buckets = spec.bucket_urls or {r: str(self.run_dir / "buckets" / r) for r in regions}
        for url in self.buckets.values():
            if "://" not in url:
                Path(url).mkdir(parents=True, exist_ok=True)
        # The run's secret for the relays' segment caches (relays serve, actors read), through the environment.
        # The operator's admission secret: the trainer admits only actors that prove registration with it.
        env = {"AURORA_CACHE_TOKEN": secrets.token_urlsafe(24), "AURORA_ADMISSION_SECRET": secrets.token_urlsafe(24),
               **spec.thread_env(), **spec.env}
        self.admission_secret = env["AURORA_ADMISSION_SECRET"]
        self.cache_token = env["AURORA_CACHE_TOKEN"]
        self.group = ProcessGroup(self.run_dir / "logs", env=env)
        self.signing_key: Path | None = None
        self.public_key: Path | None = None
        if spec.signing:
            from aurora_store.trust import write_keypair

            key_dir = self.run_dir / "keys"
            if (key_dir / "trainer.key").exists():
                self.signing_key, self.public_key = key_dir / "trainer.key", key_dir / "trainer.pub"
            else:
                self.signing_key, self.public_key = write_keypair(key_dir)
        self.commands = Commands(spec, self.run_dir, self.buckets, self.redis, signing_key=self.signing_key,
                                 public_key=self.public_key)
        self._plane: ControlPlane | None = None  # opened once Redis runs (start or connect)
        self.actor_ids: list[str] = []
        self._restarts = 0

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        if self._own_redis:
            self.redis.start()
        self.start_trainer()
        for region in sorted(self.spec.actors):
            if region != self.spec.home:
                self.start_relay(region)
        for region, count in sorted(self.spec.actors.items()):
            for i in range(1, count + 1):
                self.start_actor(f"{region}-{i}", region)
        self.connect()
        return self

    def connect(self) -> ControlPlane:
        """Open the cluster's view of the control plane (``start`` does; a caller that starts the processes
        itself calls it once Redis runs)."""
        if self._plane is None:
            self._plane = ControlPlane(self.redis.url, self.spec.run)
        return self._plane

    @property
    def plane(self) -> ControlPlane:
        if self._plane is None:
            raise ServiceError("the cluster's control plane is not open yet: start() or connect() the cluster")
        return self._plane

    def start_trainer(self, extra: list[str] | None = None) -> Managed:
        name = "trainer" if not self._restarts else f"trainer-{self._restarts}"
        self._restarts += 1
        module, args = self.commands.trainer(name, extra)
        return self.group.start(name, module, args)

    def start_relay(self, region: str, extra: list[str] | None = None, name: str | None = None) -> Managed:
        name = name or f"relay-{region}"
        return self.group.start(name, "workers.relay", self.commands.relay(name, region, extra))

    def start_actor(self, actor_id: str, region: str, extra: list[str] | None = None, *,
                    env: dict[str, str] | None = None) -> Managed:
        if actor_id not in self.actor_ids:
            self.actor_ids.append(actor_id)
        module, args = self.commands.actor(actor_id, region, extra)
        return self.group.start(f"actor-{actor_id}", module, args, env=env)

    def stop(self) -> None:
        """Stop every process (actors leave while Redis still runs), then Redis; each step even if one before
        it was interrupted, so nothing started here outlives the cluster."""
        try:
            self.group.stop_all()
        finally:
            try:
                if self._plane is not None:
                    self._plane.close()
            finally:
                if self._own_redis:
                    self.redis.stop()

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:  # __exit__ does not run when __enter__ fails: stop what was started so far
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- observation -----------------------------------------------------------------------------

    def store(self, region: str | None = None) -> DeltaStore:
        return DeltaStore(open_bucket(self.buckets[region or self.spec.home]))

    def trainer(self) -> Managed:
        names = [n for n in self.group.processes if n.startswith("trainer")]
        return self.group[names[-1]]

    def metrics_port(self, name: str, timeout: float = 60.0) -> int:
        """The port process ``name`` (its current run, after a restart) serves Prometheus metrics on, as it
        logged it once bound. Waits until it has; a process that exits first is a RuntimeError with its log."""
        deadline = time.monotonic() + timeout
        while True:
            managed = self.group[name]
            port = _logged_metrics_port(managed.log_lines())  # among its first lines: the scan stops there
            if port is not None:
                return port
            if not managed.alive:
                raise RuntimeError(f"{name} exited ({managed.process.returncode}) before serving metrics:\n"
                                   f"{managed.log_tail(40)}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{name} did not serve metrics within {timeout:.0f}s:\n{managed.log_tail(40)}")
            time.sleep(0.1)

    def metrics_ports(self, timeout: float = 60.0) -> dict[str, int]:
        """Every metrics port (``spec.metrics``) by process name, waiting (``timeout`` in all) for each."""
        deadline = time.monotonic() + timeout
        return {name: self.metrics_port(name, max(0.0, deadline - time.monotonic()))
                for name in self.commands.metrics_processes}

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.3, *,
                 required: bool = True) -> Any:
        """``predicate()``'s first truthy value. On timeout: TimeoutError, or (``required=False``) its last
        falsy value, for callers that record the outcome instead of failing."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            for name, proc in self.group.processes.items():
                if name.startswith("trainer") and not proc.alive and proc.process.returncode not in (0, -9, -15):
                    raise RuntimeError(f"{name} died ({proc.process.returncode}) while waiting for {what}:\n"
                                       f"{proc.log_tail(40)}")
            time.sleep(poll)
        if not required:
            return value
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.diagnostics()}")

    def wait_actors_on(self, version: int, timeout: float, actors: Iterable[str] | None = None
                       ) -> dict[str, ActorState]:
        """Wait until every actor in ``actors`` (default: every actor this cluster started) is live and active
        on ``version``; returns every live actor's state, all from the one read of the actor set that showed it.
        (Reading the set twice, once for the versions and once for the count, passed with an actor that
        registered in between still on its bootstrap version.)"""
        expected = set(self.actor_ids if actors is None else actors)

        def settled() -> dict[str, ActorState] | None:
            states = {actor_id: state for actor_id, (state, _) in self.plane.actors().items()}
            on_version = all(actor_id in states and states[actor_id].active_version == version
                             for actor_id in expected)
            return states if on_version else None

        return self.wait_for(settled, timeout, f"actors {sorted(expected)} active on v{version}")

    def wait_trainer_done(self, timeout: float) -> dict[str, Any]:
        trainer = self.trainer()
        deadline = time.monotonic() + timeout
        while trainer.alive and time.monotonic() < deadline:
            time.sleep(0.5)
        if trainer.alive:
            raise TimeoutError(f"trainer still running after {timeout:.0f}s\n{self.diagnostics()}")
        if trainer.process.returncode != 0:
            raise RuntimeError(f"trainer exited with {trainer.process.returncode}:\n{trainer.log_tail(60)}")
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "trainer" / "summary.json").read_text())

    def step_records(self) -> list[dict[str, str]]:
        return [e for e in self.plane.run_log() if e.get("kind") == "step"]

    def trainer_version(self) -> int:
        state = self.plane.trainer_state()
        return state.version if state else -1

    def export_run_log(self) -> str | None:
        """Copy the run log into the home bucket (the trainer does this too; actors log after it ends)."""
        from aurora_store.ops.runlog import export_run_log

        return export_run_log(self.plane, self.store())

    def diagnostics(self) -> str:
        parts = []
        for name, proc in self.group.processes.items():
            parts.append(f"--- {name} ({'alive' if proc.alive else proc.process.returncode}) ---\n"
                         f"{proc.log_tail(12)}")
        return "\n".join(parts)


def _logged_metrics_port(lines: Iterable[str]) -> int | None:
    """The port in a process's ``serving metrics`` log record (JSON lines, as the cluster's processes log)."""
    for line in lines:
        if '"metrics_port"' in line:
            try:
                return int(json.loads(line)["metrics_port"])
            except (ValueError, KeyError, TypeError):
                continue
    return None
