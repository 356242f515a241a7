"""A lifecycle that always ends, with real processes and a real Valkey: SIGTERM during a Redis outage ends an
actor, a relay and a trainer within the grace period, each with a log line naming the signal and its state;
a harness that is terminated (or SIGKILLed) leaves none of its children running; a process stuck after the
signal is ended by its watchdog."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from aurora_store.testing.servers import RedisServer
from workers.chaos.harness import fast_spec
from workers.cluster import LocalCluster

pytestmark = pytest.mark.redis

#: What a spot VM's notice leaves, with margin: every process here must be gone well within it.
GRACE_S = 10.0


# --- processes, observed through /proc ------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str, int] | None:
    """``(parent pid, state, start time)`` of a process, ``None`` once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid → start time (so a reused pid is not mistaken for a survivor)."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None and stat[1] != "Z":
            parents[int(entry)] = (stat[0], stat[2])
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, started) in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = started
                frontier.append(pid)
    return found


def _survivors(processes: dict[int, int]) -> list[int]:
    out = []
    for pid, started in processes.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == started and stat[1] != "Z":
            out.append(pid)
    return out


def _kill(processes: dict[int, int]) -> None:
    """Clean up after a failure: SIGKILL whatever of ``processes`` is still there."""
    for pid in _survivors(processes):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _exit_after_sigterm(process: subprocess.Popen, timeout: float = 60.0) -> float:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=timeout)
    return time.monotonic() - started


def _clients(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list())
    finally:
        client.close()


# --- SIGTERM during a Redis outage ----------------------------------------------------------------------------


def test_an_actor_waiting_for_its_run_stops_at_once_on_sigterm_during_a_redis_outage(tmp_path):
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    with RedisServer().start() as server:
        actor = subprocess.Popen(
            [sys.executable, "-m", "workers.actor", "--bucket", str(bucket), "--redis", server.url, "--region", "r1",
             "--run", "early", "--engine", "torch", "--wait-for-run", "0", "--cache-dir", str(tmp_path / "cache")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # Connected (the control plane comes up first), then waiting for a run that never comes.
            _wait_until(lambda: _clients(server.url) > 1, 120, "the actor's Redis connection")
            server.stop()
            time.sleep(1.0)
            seconds = _exit_after_sigterm(actor)
        finally:
            if actor.poll() is None:
                actor.kill()
        out = actor.communicate()[0]
    print(f"actor waiting for its run gone {seconds:.2f} s after SIGTERM")
    assert seconds < GRACE_S, out[-2000:]
    assert actor.returncode == -signal.SIGTERM, out[-2000:]
    assert "received SIGTERM while starting" in out, out[-2000:]


@pytest.mark.slow
def test_sigterm_mid_run_during_a_redis_outage_ends_actor_relay_and_trainer_within_the_grace(tmp_path):
    spec = fast_spec(tmp_path, steps=500, actors={"eu-west": 1}, actor_args=["--sim-tokens-per-s", "400"])
    with LocalCluster(spec) as cluster:
        cluster.wait_for(lambda: "eu-west-1" in cluster.plane.actors() and cluster.trainer_version() >= 1, 240,
                         "the actor serving and the trainer training")
        processes = {"actor": cluster.group["actor-eu-west-1"], "relay": cluster.group["relay-eu-west"],
                     "trainer": cluster.trainer()}
        assert "relay ready" in processes["relay"].log_path.read_text()
        cluster.redis.stop()
        time.sleep(2.0)  # every process is in its reconnect loop now
        sent = time.monotonic()
        for managed in processes.values():
            managed.process.send_signal(signal.SIGTERM)
        exits: dict[str, float] = {}
        while len(exits) < len(processes) and time.monotonic() - sent < 60:
            for name, managed in processes.items():
                if name not in exits and managed.process.poll() is not None:
                    exits[name] = round(time.monotonic() - sent, 2)
            time.sleep(0.05)
        logs = {name: managed.log_tail(400) for name, managed in processes.items()}
        codes = {name: managed.process.returncode for name, managed in processes.items()}
    print("seconds from SIGTERM to exit:", exits, "exit codes:", codes)
    assert set(exits) == set(processes) and max(exits.values()) < GRACE_S, (exits, logs)
    assert all(code not in (None, 128 + signal.SIGTERM, -signal.SIGKILL) for code in codes.values()), (codes, logs)
    assert "received SIGTERM while serving: stopping gracefully" in logs["actor"], logs["actor"]
    assert "received SIGTERM while serving: stopping gracefully" in logs["relay"], logs["relay"]
    assert "received SIGTERM while training: stopping gracefully" in logs["trainer"], logs["trainer"]


def test_a_graceful_path_that_does_not_end_is_unwound_then_the_process_is_ended_by_its_watchdog():
    """A graceful path that never ends (a real sleep standing in for a batch that generates on) is unwound at
    half the grace period, running its ``finally``; a ``finally`` that never ends either cannot hold the
    process past the grace period."""
    script = textwrap.dedent("""
        import time
        from workers import lifecycle
        life = lifecycle.install("stuck", grace_s=2.0)
        lifecycle.enter("serving")  # graceful: the signal only asks, and nothing here listens
        print("ready", flush=True)
        try:
            time.sleep(120)
        finally:
            print("unwound", flush=True)
            time.sleep(120)  # a cleanup that never ends
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        lines = []
        while (line := process.stdout.readline()) and line.strip() != "unwound":
            lines.append(line)
        assert line, lines
        unwound = time.monotonic() - sent
        process.wait(timeout=30)
        seconds = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
    out = "".join(lines) + process.communicate()[0]
    print(f"unwound {unwound:.2f} s and ended {seconds:.2f} s after SIGTERM (grace 2 s)")
    assert 0.9 < unwound < 1.9 and 1.9 < seconds < 5.0, out
    assert process.returncode == 128 + signal.SIGTERM, out
    assert "received SIGTERM while serving: stopping gracefully" in out, out
    assert "still serving 1 s after SIGTERM: unwinding now" in out, out
    assert "still running 2 s after SIGTERM (while serving): exiting now" in out, out


# --- harnesses leave no child behind ---------------------------------------------------------------------------


HARNESSES = {
    # Valkey, the trainer, the relay and three actors.
    "demo": (["workers.demo", "--steps", "40", "--run-dir", "{tmp}/run"], 6),
    # Valkey, the trainer and the scenario's three actors.
    "chaos": (["workers.chaos", "--quick", "--only", "sigterm_graceful_leave", "--keep", "{tmp}/run"], 5),
}


@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_sigterm_to_a_harness_stops_every_process_and_server_it_started(harness, tmp_path):
    args, expected = HARNESSES[harness]
    with open(tmp_path / "harness.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", *(a.format(tmp=tmp_path) for a in args)], stdout=log,
                                   stderr=subprocess.STDOUT)
    children: dict[int, int] = {}
    try:
        children = _wait_until(lambda: (found := _descendants(process.pid)) and len(found) >= expected and found,
                               120, f"the {harness}'s {expected} children")
        time.sleep(2.0)
        seconds = _exit_after_sigterm(process, timeout=90)
        survivors = _survivors(children)
    finally:
        if process.poll() is None:
            process.kill()
        _kill(children)
    out = (tmp_path / "harness.log").read_text(errors="replace")
    assert process.returncode == -signal.SIGTERM, out[-3000:]
    assert "received SIGTERM: stopping every process started here" in out, out[-3000:]
    assert not survivors, (children, out[-3000:])
    print(f"{harness} and its {len(children)} children gone {seconds:.1f} s after SIGTERM")


def test_a_sigkilled_cluster_driver_leaves_no_child_running(tmp_path):
    """Nothing unwinds a SIGKILL: the children's parent-death signal stops them (Valkey, trainer, actor)."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from workers.chaos.harness import fast_spec
        from workers.cluster import LocalCluster
        with LocalCluster(fast_spec(Path({str(tmp_path / "run")!r}), steps=100, actors={{"us-east": 1}})):
            print("started", flush=True)
            time.sleep(300)
    """)
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    children: dict[int, int] = {}
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "started"
        children = _wait_until(lambda: (found := _descendants(driver.pid)) and len(found) >= 3 and found, 60,
                               "the driver's three children")
        driver.kill()
        driver.wait(timeout=10)
        killed = time.monotonic()
        _wait_until(lambda: not _survivors(children), 30, "every child of the killed driver to end")
    finally:
        if driver.poll() is None:
            driver.kill()
        _kill(children)
    print(f"{len(children)} children gone {time.monotonic() - killed:.1f} s after their driver's SIGKILL")
