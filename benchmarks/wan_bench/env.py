"""The benchmark's world: a home and a remote region joined by one emulated link, the servers inside them, and
helpers to reshape/calibrate the link, open buckets, start relays and command agents.

Layout (see ``benchmarks/wan/README.md`` for the harness): the home namespace holds the trainer's S3
server (SeaweedFS) and Redis (Valkey); the remote namespace holds the regional S3 server, the relay and the
actors. The link always uses the userspace forwarder (even without delay or loss) so it can be reshaped while
everything runs and its byte counters are available. The orchestrating thread itself runs inside the home
namespace (:meth:`Topology.inside`), so it reaches home services directly; remote work runs in processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aurora_store.testing.servers import RedisServer, S3Server
from benchmarks.wan import LinkSpec, LinkStats, Topology
from benchmarks.wan.affinity import all_cpus, pin_tree, split_cpus
from benchmarks.wan.calibrate import calibrate_link
from benchmarks.wan.errors import WanError

log = logging.getLogger("aurora.bench.wan")

HOME, REMOTE = "home", "remote"
AGENT_MODULE = "benchmarks.wan_bench.agent"


class AgentError(WanError):
    """An agent answered with an error, died, or did not answer in time."""


class Agent:
    """The orchestrator's handle on one :mod:`~benchmarks.wan_bench.agent` process in a region."""

    def __init__(self, proc: subprocess.Popen, name: str, log_path: Path, region: str) -> None:
        self.proc = proc
        self.name = name
        self.region = region
        self.log_path = log_path
        self._buffer = b""

    def _readline(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentError(f"agent {self.name} did not answer within {timeout:.0f}s{self._tail()}")
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise AgentError(f"agent {self.name} exited ({self.proc.poll()}){self._tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            return ""
        return ":\n" + "\n".join(lines) if lines else ""

    def wait_ready(self, timeout: float = 180.0) -> None:
        reply = self._readline(timeout)
        if not reply.get("ready"):
            raise AgentError(f"agent {self.name} sent {reply} instead of ready")

    def send(self, op: str, **args: Any) -> None:
        try:
            self.proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise AgentError(f"agent {self.name} is gone: {exc}{self._tail()}") from exc

    def receive(self, timeout: float) -> dict[str, Any]:
        reply = self._readline(timeout)
        if not reply.pop("ok", False):
            raise AgentError(f"agent {self.name}: {reply.get('error')}\n{reply.get('traceback', '')}")
        return reply

    def call(self, op: str, timeout: float = 600.0, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.receive(timeout)

    def close(self) -> None:
        with contextlib.suppress(AgentError):
            self.send("quit")
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdout.close()


@dataclass
class WanEnv:
    """Topology + servers + helpers. Use as a context manager: everything is torn down on exit."""

    out_dir: Path
    seed: int = 0
    calibrate_seconds: float = 3.0
    topo: Topology | None = None
    home_s3: S3Server | None = None
    remote_s3: S3Server | None = None
    redis: RedisServer | None = None
    calibrations: dict[str, dict[str, Any]] = field(default_factory=dict)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _agents: list[Agent] = field(default_factory=list)
    _relays: dict[str, subprocess.Popen] = field(default_factory=dict)
    _saved_env: dict[str, str | None] = field(default_factory=dict)
    _pinning: dict[str, frozenset[int]] | None = None
    # The operator's admission secret for the actors this environment starts (the trainer checks it).
    admission_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    @property
    def log_dir(self) -> Path:
        return self.out_dir / "logs"

    def __enter__(self) -> WanEnv:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.topo = self._stack.enter_context(Topology({REMOTE: self._spec(None, 0.0, 0.0)}))
            self._stack.enter_context(self.topo.inside(HOME))
            home_at, remote_at = self.topo.command(HOME, []), self.topo.command(REMOTE, [])
            self.home_s3 = S3Server(host=self.topo.address(HOME), launcher=home_at)
            self._stack.callback(self.home_s3.stop)
            self.remote_s3 = S3Server(host=self.topo.address(REMOTE), launcher=remote_at)
            self._stack.callback(self.remote_s3.stop)
            self.redis = RedisServer(host=self.topo.address(HOME), launcher=home_at)
            self._stack.callback(self.redis.stop)
            self.home_s3.start()
            self.remote_s3.start()
            self.redis.start()
            for key, value in self.home_s3.env().items():  # boto3 in this process and in children
                self._saved_env[key] = os.environ.get(key)
                os.environ[key] = value
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for agent in self._agents:
            with contextlib.suppress(Exception):
                agent.close()
        self._agents.clear()
        for name in list(self._relays):
            with contextlib.suppress(Exception):
                self.stop_relay(name)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        self._stack.close()  # servers stop, the thread leaves the namespace, the topology is torn down

    # --- the link --------------------------------------------------------------------------------

    def _spec(self, rate_mbit: float | None, rtt_ms: float, loss: float) -> LinkSpec:
        return LinkSpec.symmetric(rate_mbit, rtt_ms, loss, seed=self.seed, backend="forwarder")

    def shape(self, rate_mbit: float | None, rtt_ms: float, loss: float = 0.0, *,
              calibrate: str | None = None) -> dict[str, Any] | None:
        """Reshape the link (connections stay up); with ``calibrate``, measure it and file it under that name."""
        self.topo.link(REMOTE).reshape(self._spec(rate_mbit, rtt_ms, loss))
        time.sleep(0.3)  # let queues of the previous shape drain
        if calibrate is None:
            return None
        if calibrate not in self.calibrations:
            cal = calibrate_link(self.topo, REMOTE, seconds=self.calibrate_seconds, streams=4, rtt_samples=10)
            doc = cal.to_dict()
            doc["rate_mbit"] = doc["rate_mbit_achieved_nstreams"]
            self.calibrations[calibrate] = doc
            log.info("link %s: %s", calibrate, json.dumps(doc))
        return self.calibrations[calibrate]

    def reset_link(self) -> None:
        self.topo.link(REMOTE).reset_stats()

    def link_stats(self) -> LinkStats:
        return self.topo.link_stats(REMOTE)

    def link_counters(self) -> dict[str, int]:
        stats = self.link_stats()
        return {"down_bytes": stats.down.bytes_out, "up_bytes": stats.up.bytes_out,
                "dropped_loss": stats.dropped_loss,
                "dropped_queue": stats.down.dropped_queue + stats.up.dropped_queue,
                "dropped_overrun": stats.down.dropped_overrun + stats.up.dropped_overrun}

    # --- buckets ---------------------------------------------------------------------------------

    def bucket(self, region: str, name: str) -> str:
        """Create bucket ``name`` on the region's S3 server; return its URL."""
        server = self.home_s3 if region == HOME else self.remote_s3
        server.create_bucket(name)
        return server.bucket_url(name)

    # --- processes -------------------------------------------------------------------------------

    def _placed(self) -> list[tuple[str, int]]:
        """(region, pid) of every process this environment started in a region (those gone meanwhile too:
        pinning skips them)."""
        placed = [(HOME, s.process.pid) for s in (self.home_s3, self.redis) if s and s.process]
        placed += [(REMOTE, s.process.pid) for s in (self.remote_s3,) if s and s.process]
        placed += [(a.region, a.proc.pid) for a in self._agents]
        return placed + [(REMOTE, p.pid) for p in self._relays.values()]

    def _pin(self, region: str, pid: int) -> None:
        if self._pinning is not None:
            pin_tree(pid, self._pinning[region])

    @contextlib.contextmanager
    def regions_on_own_cpus(self) -> Iterator[dict[str, frozenset[int]] | None]:
        """Inside: each region's processes (those running and those started meanwhile) on its own share of the
        CPUs, like separate machines (:mod:`benchmarks.wan.affinity`); yields the split, ``None`` when there are
        too few CPUs to split. Afterwards every process may use every CPU again."""
        split = split_cpus((HOME, REMOTE))
        self._pinning = split
        try:
            if split is not None:
                for region, pid in self._placed():
                    pin_tree(pid, split[region])
            yield split
        finally:
            self._pinning = None
            if split is not None:
                everything = all_cpus()
                for _, pid in self._placed():
                    pin_tree(pid, everything)

    def child_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **self.home_s3.env(), "PYTHONUNBUFFERED": "1",
                "AURORA_ADMISSION_SECRET": self.admission_secret, **(extra or {})}

    def agent(self, region: str, name: str, *, wait: bool = True) -> Agent:
        log_path = self.log_dir / f"agent-{name}.log"
        with open(log_path, "ab") as log_file:
            proc = self.topo.popen(region, [sys.executable, "-m", AGENT_MODULE], env=self.child_env(),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file)
        agent = Agent(proc, name, log_path, region)
        self._pin(region, proc.pid)
        self._agents.append(agent)
        if wait:
            agent.wait_ready()
        return agent

    def start_relay(self, run: str, source: str, dest: str, streams: int = 4, *, extra: list[str] | None = None,
                    env: dict[str, str] | None = None) -> subprocess.Popen:
        """``python -m workers.relay`` in the remote region, with the command line workers.cluster uses (plus
        ``extra`` arguments and ``env`` variables)."""
        argv = [sys.executable, "-m", "workers.relay", "--source", source, "--dest", dest, "--region", REMOTE,
                "--redis", self.redis.url, "--run", run, "--streams", str(streams), *(extra or [])]
        with open(self.log_dir / f"relay-{run}.log", "ab") as log_file:
            proc = self.topo.popen(REMOTE, argv, env=self.child_env(env), stdout=log_file, stderr=subprocess.STDOUT)
        self._relays[run] = proc
        self._pin(REMOTE, proc.pid)
        return proc

    def wait_relay(self, run: str, timeout: float = 180.0) -> None:
        from aurora_store.bus import ControlPlane

        plane = ControlPlane(self.redis.url, run)
        deadline = time.monotonic() + timeout
        try:
            while plane.relay(REMOTE) is None:
                proc = self._relays[run]
                if proc.poll() is not None:
                    raise AgentError(f"relay of {run} exited with {proc.returncode}; see {self.log_dir}")
                if time.monotonic() > deadline:
                    raise AgentError(f"relay of {run} sent no heartbeat within {timeout:.0f}s")
                time.sleep(0.3)
        finally:
            plane.close()

    def relay_state(self, run: str):
        from aurora_store.bus import ControlPlane

        plane = ControlPlane(self.redis.url, run)
        try:
            return plane.relay(REMOTE)
        finally:
            plane.close()

    def stop_relay(self, run: str) -> None:
        proc = self._relays.pop(run, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
