"""Control-plane load test: the real trainer-side dispatcher and ledger against N simulated actors on a real Valkey.

``python -m benchmarks control_plane --json [--actors 10,100,1000]`` prints one JSON object.

The trainer side is the production code (:class:`workers.trainer.dispatch.Dispatcher`, :mod:`aurora_store.sched`,
:class:`aurora_store.bus.ControlPlane`). The actors are simulated without a model, but speak the real protocol on
the real keys: they register (token), heartbeat their state, follow the version events (``staged`` → report the
version staged, ``commit`` → activate it), read their lease streams, and send results stamped with the version and
digest they generated on. N actors share a few threads (one Redis connection each, one multi-key ``XREAD`` for the
work streams of a thread's actors), so 1,000 actors fit on two cores.

To exercise the acceptance predicate, actors also send forged results (wrong token), resend results already
sent (duplicates) and send results for leases that do not exist; a fraction of actors vanish mid-run without a
word (their leases must expire and be re-granted). Per N the run reports dispatch latency (``start_step``:
eligibility, allocation, grants), settle throughput, Redis commands/s and memory, and the safety counters
(``lost_leases``, ``duplicate_leases``, ``wrong_accepts``: all must be 0); ``growth`` gives the log-log slope of
each figure against N (1 = linear).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import secrets
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aurora_store.bus import ActorState, ControlPlane, Lease, RolloutResult
from aurora_store.bus import streams as st
from aurora_store.bus.identity import ActorKey, Credentials
from aurora_store.metrics import Metrics
from aurora_store.sched import LeasePolicy, Prompt
from aurora_store.testing.servers import RedisServer
from workers.trainer.dispatch import Dispatcher

REGION = "home"
ADMISSION = secrets.token_urlsafe(24)  # the operator's admission secret of this load test
FORGER = ActorKey.generate()  # a key nobody was admitted with
#: What one simulated result carries: one sample of 64 tokens (the shape its lease asks for).
SAMPLES = [{"ids": [1] * 64, "logprobs": [-0.5] * 64, "text": ""}]


@dataclass
class SimActor:
    actor_id: str
    key: ActorKey = field(default_factory=ActorKey.generate)
    active: int = 0
    staged: int | None = None
    cursor: str = "0"
    alive: bool = True
    next_heartbeat: float = 0.0
    waiting: list[Lease] = field(default_factory=list)  # leases for a version not yet active
    running: list[tuple[float, Lease]] = field(default_factory=list)  # (due time, lease)

    def state(self, now_ms: int) -> ActorState:
        return ActorState(self.actor_id, REGION, "sim", self.active, f"d{self.active}", self.staged, 1000.0,
                          len(self.waiting) + len(self.running), "ready", now_ms, "regional")


@dataclass
class Tally:
    """What the simulated actors saw (merged across threads under a lock)."""

    received: Counter = field(default_factory=Counter)  # lease id → deliveries
    forged: int = 0
    resent: int = 0
    unknown: int = 0
    sent: int = 0


class ActorShard(threading.Thread):
    """Simulates a group of actors over one Redis connection."""

    def __init__(self, url: str, run: str, actors: list[SimActor], *, gen_ms: tuple[float, float],
                 heartbeat_s: float, bad_rate: float, seed: int, stop: threading.Event, tally: Tally,
                 lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.plane = ControlPlane(url, run)
        self.actors = {a.actor_id: a for a in actors}
        self.gen_ms = gen_ms
        self.heartbeat_s = heartbeat_s
        self.bad_rate = bad_rate
        self.rng = random.Random(seed)
        self.stop = stop
        self.tally = tally
        self.lock = lock
        self.event_cursor = "0"
        self.error: BaseException | None = None

    def register(self) -> None:
        now = self.plane.now_ms()
        for actor in self.actors.values():
            actor.cursor = self.plane.latest_id(self.plane.keys.work(actor.actor_id))
            self.plane.register_actor(actor.state(now), self.credentials(actor))
            actor.next_heartbeat = time.monotonic() + self.heartbeat_s * self.rng.random()

    def credentials(self, actor: SimActor) -> Credentials:
        return Credentials.issue(actor.key, ADMISSION, self.plane.run, actor.actor_id)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._events()
                self._work()
                self._finish()
                self._heartbeats()
        except BaseException as exc:  # reported by the driver
            self.error = exc

    def _events(self) -> None:
        for _, entry_id, event in self.plane.read_events({REGION: self.event_cursor}, block_ms=None):
            self.event_cursor = entry_id
            for actor in self.actors.values():
                if event.kind == "staged" and event.version == actor.active + 1:
                    actor.staged = event.version
                    actor.next_heartbeat = 0.0  # report it now, as the real actor's stager does
                elif event.kind == "commit" and actor.staged == event.version:
                    actor.active, actor.staged = event.version, None
                    actor.next_heartbeat = 0.0
                    self._release(actor)

    def _release(self, actor: SimActor) -> None:
        ready = [lease for lease in actor.waiting if lease.version == actor.active]
        actor.waiting = [lease for lease in actor.waiting if lease.version != actor.active]
        now = time.monotonic()
        for lease in ready:
            actor.running.append((now + self.rng.uniform(*self.gen_ms) / 1000, lease))

    def _work(self) -> None:
        live = {self.plane.keys.work(a.actor_id): a for a in self.actors.values() if a.alive}
        if not live:
            time.sleep(0.01)
            return
        # One XREAD over this thread's actors' lease streams (the command each real actor issues for its own).
        entries = self.plane.call(lambda r: st.read(r, {k: a.cursor for k, a in live.items()}, block_ms=20,
                                                    count=1000))
        with self.lock:
            for entry in entries:
                actor = live[entry.stream]
                actor.cursor = entry.id
                lease = Lease.from_fields(entry.fields)
                self.tally.received[lease.lease_id] += 1
                actor.waiting.append(lease)
        for actor in live.values():
            if actor.waiting and any(lease.version == actor.active for lease in actor.waiting):
                self._release(actor)

    def _finish(self) -> None:
        now = time.monotonic()
        out: list[RolloutResult] = []
        forged = resent = unknown = 0
        for actor in self.actors.values():
            if not actor.alive or not actor.running:
                continue
            done = [lease for due, lease in actor.running if due <= now]
            actor.running = [(due, lease) for due, lease in actor.running if due > now]
            for lease in done:
                run = self.plane.run
                honest = actor.key.signed(run, RolloutResult("result", lease.lease_id, actor.actor_id, "",
                                                             lease.version, lease.weights_digest, tokens=64,
                                                             gen_seconds=0.05, samples=SAMPLES))
                if self.rng.random() < self.bad_rate:  # a forger races the honest result, signed by its own key
                    out.append(FORGER.signed(run, RolloutResult("result", lease.lease_id, actor.actor_id, "",
                                                                lease.version, lease.weights_digest, tokens=64,
                                                                samples=SAMPLES)))
                    forged += 1
                out.append(honest)
                if self.rng.random() < self.bad_rate:  # an at-least-once retry: the same result twice
                    out.append(honest)
                    resent += 1
                if self.rng.random() < self.bad_rate:  # a result for a lease nobody granted
                    out.append(actor.key.signed(run, RolloutResult("result", uuid.uuid4().hex, actor.actor_id, "",
                                                                   lease.version, lease.weights_digest, tokens=64,
                                                                   samples=SAMPLES)))
                    unknown += 1
        if out:
            # The XADD of ControlPlane.send_result, pipelined because one thread speaks for many actors.
            def go(r):
                pipe = r.pipeline(transaction=False)
                for result in out:
                    pipe.xadd(self.plane.keys.results, result.to_fields(), maxlen=st.DEFAULT_MAXLEN,
                              approximate=True)
                pipe.execute()
            self.plane.call(go)
        with self.lock:
            self.tally.sent += len(out)
            self.tally.forged += forged
            self.tally.resent += resent
            self.tally.unknown += unknown

    def _heartbeats(self) -> None:
        now = time.monotonic()
        due = [a for a in self.actors.values() if a.alive and a.next_heartbeat <= now]
        if not due:
            return
        server_ms = self.plane.now_ms()
        for actor in due:
            self.plane.heartbeat_actor(actor.state(server_ms), self.credentials(actor))
            actor.next_heartbeat = now + self.heartbeat_s

    def vanish(self, actor_id: str) -> None:
        """A spot preemption: the actor stops without a word (no return, no deregistration)."""
        self.actors[actor_id].alive = False


def _info(url: str) -> dict[str, Any]:
    client = ControlPlane(url, "info")
    try:
        return client.call(lambda r: {**r.info("stats"), **r.info("memory")})
    finally:
        client.close()


def run_one(n_actors: int, *, steps: int = 5, prompts_per_actor: int = 2, gen_ms: tuple[float, float] = (20, 120),
            threads: int = 4, bad_rate: float = 0.02, vanish: float = 0.01, seed: int = 0,
            step_timeout_s: float = 60.0) -> dict[str, Any]:
    """One load test with ``n_actors`` simulated actors on a fresh Valkey; bounded by ``steps`` and timeouts."""
    rng = random.Random(seed)
    run = f"load-{n_actors}"
    with RedisServer() as server:
        server.start()
        url = server.url
        plane = ControlPlane(url, run, heartbeat_ttl_s=30)
        verdicts: list[tuple[str, RolloutResult | None, Any]] = []
        dispatcher = Dispatcher(plane, REGION, "trainer-load", LeasePolicy(initial_ms=3_000, min_ms=1_500),
                                admission_secret=ADMISSION, metrics=Metrics("trainer", run, REGION),
                                on_verdict=lambda reason, result, verdict: verdicts.append((reason, result, verdict)))
        sims = [SimActor(f"a{i:04d}") for i in range(n_actors)]
        stop, lock, tally = threading.Event(), threading.Lock(), Tally()
        n_threads = max(1, min(threads, n_actors))
        shards = [ActorShard(url, run, sims[i::n_threads], gen_ms=gen_ms, heartbeat_s=2.0, bad_rate=bad_rate,
                             seed=seed + i, stop=stop, tally=tally, lock=lock) for i in range(n_threads)]
        t0 = time.monotonic()
        for shard in shards:
            shard.register()
        register_s = time.monotonic() - t0
        for shard in shards:
            shard.start()
        doomed = rng.sample([a.actor_id for a in sims], k=int(n_actors * vanish)) if vanish > 0 else []
        dispatch_ms: list[float] = []
        step_ms: list[float] = []
        lost = duplicate_active = 0
        ledgers = []
        completed = False
        info0 = _info(url)
        t_start = time.monotonic()
        try:
            for step in range(1, steps + 1):
                version = step - 1  # version 0 is what actors start on; each step then publishes the next
                if step > 1:
                    plane.announce(_staged(version))
                    _wait_reported(dispatcher, version, n_actors - len(doomed if step > 2 else []), step_timeout_s)
                if step == 2:
                    for actor_id in doomed:  # vanish with leases in flight on the next dispatch
                        next(s for s in shards if actor_id in s.actors).vanish(actor_id)
                prompts = [Prompt(f"s{step}-p{i}", "x" * 64) for i in range(n_actors * prompts_per_actor)]
                t = time.perf_counter()
                ledger = dispatcher.start_step(step, version, f"d{version}", prompts, group_size=1, max_new_tokens=64,
                                               wait_s=step_timeout_s)
                dispatch_ms.append((time.perf_counter() - t) * 1000)
                dispatcher.collect(ledger, timeout_s=step_timeout_s)
                step_ms.append((time.perf_counter() - t) * 1000)
                lost += len(ledger.prompts) - len(ledger.accepted)
                active = Counter(r.lease.prompt_id for r in ledger.leases.values() if r.state == "active")
                duplicate_active += sum(1 for c in active.values() if c > 1)
                ledgers.append(ledger)
                for shard in shards:
                    if shard.error is not None:
                        raise RuntimeError(f"simulated actors failed: {shard.error!r}") from shard.error
            completed = True
        finally:
            wall_s = time.monotonic() - t_start
            info1 = _info(url)
            stop.set()
            for shard in shards:
                shard.join(timeout=10)
                shard.plane.close()
            if completed and ledgers:
                # What the actors sent after the read that completed the last step (a resend pipelined right
                # behind the result it repeats can land after it) is settled too: every injected message is judged.
                dispatcher.pump(ledgers[-1], block_ms=100)
            plane.close()
    accepted = [(result, verdict) for reason, result, verdict in verdicts if reason == "ok"]
    accepted_leases = Counter(result.lease_id for result, _ in accepted)
    accepted_prompts = Counter(verdict.lease.lease.prompt_id for _, verdict in accepted)
    wrong = (sum(1 for result, _ in accepted if result.signature == FORGER.signed(run, result).signature)
             + sum(c - 1 for c in accepted_leases.values() if c > 1)
             + sum(c - 1 for c in accepted_prompts.values() if c > 1))
    granted = {lease_id for ledger in ledgers for lease_id in ledger.leases}
    # A lease is lost when it was granted to a live actor but never reached it (doomed actors' leases expire).
    live_granted = {lid for ledger in ledgers for lid, r in ledger.leases.items() if r.actor_id not in doomed}
    lost += len(live_granted - set(tally.received))
    settle_s = sum(step_ms) / 1000 - sum(dispatch_ms) / 1000
    reasons = Counter(reason for reason, _, _ in verdicts)
    return {
        "actors": n_actors, "steps": steps, "prompts_per_step": n_actors * prompts_per_actor,
        "actor_threads": n_threads, "vanished": len(doomed),
        "register_s": round(register_s, 3),
        "dispatch_p50_ms": round(statistics.median(dispatch_ms), 2),
        "dispatch_p99_ms": round(_quantile(dispatch_ms, 0.99), 2),
        "step_p50_ms": round(statistics.median(step_ms), 1),
        "settles_per_s": round(dispatcher.stats.results_received / settle_s, 1) if settle_s > 0 else None,
        "results_received": dispatcher.stats.results_received,
        "redis_cmds_per_s": round((info1["total_commands_processed"] - info0["total_commands_processed"]) / wall_s, 1),
        "redis_cmds_per_result": round((info1["total_commands_processed"] - info0["total_commands_processed"])
                                       / max(dispatcher.stats.results_received, 1), 2),
        "redis_memory_bytes": int(info1["used_memory"]),
        "lost_leases": lost, "duplicate_leases": duplicate_active + sum(1 for c in tally.received.values() if c > 1),
        "wrong_accepts": wrong,
        "leases_granted": len(granted), "leases_expired": dispatcher.stats.expired,
        "rejected": {k: v for k, v in reasons.items() if k != "ok"},
        "injected": {"forged": tally.forged, "resent": tally.resent, "unknown_lease": tally.unknown},
        "wall_s": round(wall_s, 2),
    }


def _staged(version: int):
    from aurora_store.bus import VersionEvent
    return VersionEvent("staged", version, REGION, base=version - 1)


def _wait_reported(dispatcher: Dispatcher, version: int, expected: int, timeout_s: float) -> None:
    """Wait until ``expected`` actors report ``version`` staged (the trainer would otherwise exclude them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = dispatcher.live_actors().values()
        if sum(1 for s in states if s.staged_version == version or s.active_version == version) >= expected:
            return
        time.sleep(0.05)
    raise TimeoutError(f"actors did not report version {version} staged within {timeout_s:.0f}s")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


GROWTH_KEYS = ("dispatch_p50_ms", "dispatch_p99_ms", "settles_per_s", "redis_cmds_per_s", "redis_memory_bytes",
               "redis_cmds_per_result", "step_p50_ms")


def growth(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Least-squares slope of log(figure) against log(N): 0 = flat, 1 = linear, >1 = superlinear."""
    out: dict[str, float | None] = {}
    xs = [math.log(r["actors"]) for r in runs]
    for key in GROWTH_KEYS:
        ys = [r.get(key) for r in runs]
        if len(runs) < 2 or any(y is None or y <= 0 for y in ys):
            out[key] = None
            continue
        ly = [math.log(y) for y in ys]
        mx, my = statistics.fmean(xs), statistics.fmean(ly)
        den = sum((x - mx) ** 2 for x in xs)
        out[key] = round(sum((x - mx) * (y - my) for x, y in zip(xs, ly)) / den, 3) if den else None
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--actors", default="10,100,1000", help="comma-separated actor counts (default 10,100,1000)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts-per-actor", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="threads the simulated actors share")
    parser.add_argument("--bad-rate", type=float, default=0.02,
                        help="per result: chance of a forged copy, a resend, and a result for an unknown lease")
    parser.add_argument("--vanish", type=float, default=0.01, help="fraction of actors that vanish at step 2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(x) for x in str(args.actors).split(",") if x.strip()]
    if not counts or any(n < 1 or n > 5000 for n in counts):
        raise SystemExit("--actors: counts between 1 and 5000")
    runs = [run_one(n, steps=args.steps, prompts_per_actor=args.prompts_per_actor, threads=args.threads,
                    bad_rate=args.bad_rate, vanish=args.vanish, seed=args.seed) for n in counts]
    return {"benchmark": "control_plane", "runs": runs, "growth": growth(runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks control_plane", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    json.dump(run_from_args(args), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
