"""A discrete-event simulation (SimPy) of one deployment running the protocol as built.

The trainer loop is the real one (``workers/trainer``): collect ``B_k`` · dispatch ``B_{k+1}`` on ``v_{k-1}``
(one-step lag) · train on ``B_k`` → ``π_k`` · publish ``D_k`` (encode, with segments uploaded as they are
encoded: cut-through) · collect ``B_{k+1}`` … Each published segment is copied into every remote region once by
its relay (over the region's link with ``S`` parallel streams; a region without a relay has every actor pull
across the link), then fetched by the region's actors from the regional bucket and staged; an actor reports
"staged" with its next heartbeat. Scheduling is the trainer's own code (:mod:`aurora_store.sched`), not a model
of it: a dispatch on ``v`` waits until at least one actor is eligible (on ``v``, or on ``v − 1`` with ``D_v``
staged: it gets ``Commit(v)`` and activates first); the others sit the step out and their estimates decay. The
batch is split by the throughput estimator (self-reports as capped priors, then measured hold windows). A spot
actor preempted mid-batch loses its leases, which expire after the lease policy's duration (``lease_factor`` ×
the median of recent completions) and are re-granted to the survivors; its replacement joins after
``replace_s`` and catches up from the newest snapshot plus the deltas since.

Per-component costs come from :class:`~aurora_store.plan.config.Costs` (calibrated from our benchmarks).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

import simpy

from aurora_store import sched
from aurora_store.errors import PlanError
from aurora_store.plan.config import Plan, Region, validate

MBIT = 1e6 / 8  # bytes/s per Mbit/s


def stream_rate(region: Region, plan: Plan) -> float:
    """Bytes/s one TCP stream achieves to ``region``: the link rate, capped under loss by Mathis' bound."""
    rate = region.link_mbit * MBIT * plan.costs.stream_efficiency
    if region.loss > 0 and region.rtt_ms > 0:
        rate = min(rate, plan.costs.mathis_c * plan.costs.mss_bytes / (region.rtt_ms / 1000 * math.sqrt(region.loss)))
    return rate


def wan_rate(region: Region, plan: Plan, streams: int) -> float:
    """Bytes/s of ``streams`` parallel streams sharing the region's link."""
    return min(region.link_mbit * MBIT * plan.costs.stream_efficiency, streams * stream_rate(region, plan))


@dataclass
class Actor:
    actor_id: str
    region: Region
    tokens_per_s: float
    active: int = 0
    staged: dict[int, float] = field(default_factory=dict)  # version → time the trainer learns it is staged
    fetched_until: float = 0.0  # its download pipe is busy until then
    down: list[tuple[float, float]] = field(default_factory=list)  # (preempted at, back at)
    intervals: list[tuple[float, float]] = field(default_factory=list)  # generating
    rejoined: int = 0  # how many of its outages it has come back from
    calibrated_at: float = 0.0  # end of its last capacity measurement
    free_at: float = 0.0  # end of its last batch

    def idle_until(self, lease_at: float, costs) -> float:
        """When the actor can start on a lease arriving at ``lease_at``: while idle, its loop re-measures
        capacity whenever the last measurement is older than ``recalibrate_idle_s`` (workers/actor)."""
        t = self.free_at
        while costs.calibrate_s > 0:
            due = max(t + costs.work_poll_s, self.calibrated_at + costs.recalibrate_idle_s)
            if due >= lease_at:
                break
            self.calibrated_at = t = due + costs.calibrate_s
        return max(lease_at, t)

    def view(self, now: float, version: int) -> sched.ActorView:
        """What the trainer reads from this actor's heartbeat at ``now`` when dispatching on ``version``: its
        active version and the newest version between that and ``version`` it is known to have staged."""
        staged = next((v for v in range(version, self.active, -1) if self.staged.get(v, math.inf) <= now), None)
        return sched.ActorView(self.actor_id, self.active, staged)

    def alive_at(self, t: float) -> bool:
        return not any(a <= t < b for a, b in self.down)

    def preempted_between(self, t0: float, t1: float) -> float | None:
        for a, _ in self.down:
            if t0 <= a < t1:
                return a
        return None


@dataclass
class StepRecord:
    step: int
    version: int  # the version B_step was generated on
    dispatched_s: float
    collected_s: float
    eligible: int
    excluded: int
    need_commit: int
    train_end_s: float | None = None
    published_s: float | None = None  # every segment of D_step durable at home
    delivered_s: dict[str, float] = field(default_factory=dict)  # region → last segment in the regional bucket
    staged_s: dict[str, float] = field(default_factory=dict)  # region → last actor staged
    recorded_s: float | None = None  # the trainer's step record (what step times are measured between)
    preempted: int = 0
    lease_expiries: int = 0
    lease_s: float = math.nan  # the lease duration this step's prompts were granted with


@dataclass(frozen=True)
class SimResult:
    mode: str  # "delta" | "full" | "ideal"
    streams: int
    steps: list[StepRecord]
    step_s: float
    idle_fraction: float
    wan_bytes: dict[str, float]  # region → bytes over its link during the run
    duration_s: float
    preemptions: int

    def timeline(self) -> list[dict[str, Any]]:
        return [{k: (round(v, 3) if isinstance(v, float) else
                     {r: round(x, 3) for r, x in v.items()} if isinstance(v, dict) else v)
                 for k, v in dataclasses.asdict(s).items()} for s in self.steps]


class Simulation:
    def __init__(self, plan: Plan, *, mode: str = "delta", streams: int | None = None) -> None:
        if mode not in ("delta", "full", "ideal"):
            raise ValueError(f"unknown mode {mode!r}")
        if mode == "ideal":  # the same run over unlimited, zero-delay links: no transfer cost
            plan = dataclasses.replace(plan, regions=tuple(
                dataclasses.replace(r, link_mbit=math.inf, rtt_ms=0.0, loss=0.0, local_gbit=math.inf)
                for r in plan.regions))
        self.plan = validate(plan)
        self.mode = mode
        self.streams = streams or plan.streams
        self.env = simpy.Environment()
        self.rng = random.Random(plan.seed)
        self.actors = [Actor(f"{r.name}-{i}", r, r.tokens_per_s) for r in plan.regions for i in range(r.actors)]
        self.records: dict[int, StepRecord] = {}
        self.collected: dict[int, simpy.Event] = {}
        self.link_free = {r.name: 0.0 for r in plan.regions}
        self.upload_free = 0.0
        self.wan_bytes = {r.name: 0.0 for r in plan.regions if r.name != plan.home}
        self.preemptions = 0
        # The trainer's scheduler state, with its defaults (--throughput-ema, --exclusion-decay).
        self.estimator = sched.ThroughputEstimator()
        self.leases = sched.LeasePolicy(factor=plan.lease_factor, initial_ms=int(1000 * plan.initial_lease_s))
        self._draw_preemptions()

    # --- inputs -----------------------------------------------------------------------------------

    @property
    def payload(self) -> float:
        return float(self.plan.full_bytes) if self.mode == "full" else self.plan.delta_bytes

    def _draw_preemptions(self) -> None:
        if self.plan.preempt_per_hour <= 0:
            return
        horizon = 2 * 24 * 3600.0  # preemption times are drawn this far ahead (a run longer than that stops)
        for actor in self.actors:
            if not actor.region.spot:
                continue
            t = 0.0
            while True:
                t += self.rng.expovariate(self.plan.preempt_per_hour / 3600)
                if t > horizon:
                    break
                back = t + self.plan.replace_s + self.catch_up(actor.region)["seconds"]
                actor.down.append((t, back))
                t = back

    def catch_up(self, region: Region) -> dict[str, float]:
        """A fresh actor: the newest snapshot plus, on average, half a snapshot interval of deltas."""
        plan = self.plan
        k = plan.snapshot_every / 2
        nbytes = plan.full_bytes + k * plan.delta_bytes
        local = region.local_gbit * 1e9 / 8
        if region.name != plan.home and not region.relay:  # nothing regional: it all crosses the link
            local = min(local, wan_rate(region, plan, self.streams))
        seconds = nbytes / local + plan.full_bytes / (plan.costs.load_gb_per_s * 1e9) \
            + k * plan.full_bytes / (plan.costs.apply_gb_per_s * 1e9)
        wan = nbytes if region.name != plan.home and not region.relay else 0.0
        return {"seconds": seconds, "bytes": nbytes, "wan_bytes": wan, "deltas_replayed": k}

    # --- transfer ---------------------------------------------------------------------------------

    def _segments(self, nbytes: float) -> list[float]:
        seg = self.plan.segment_mb * 1e6
        n = max(1, math.ceil(nbytes / seg))
        return [nbytes / n] * n

    def deliver(self, version: int, start: float, nbytes: float, *, cut_through: bool, encode_s: float,
                record: StepRecord | None, to_actors: bool = True) -> float:
        """Times of one object's path home bucket → regions → actors; returns when it is durable at home."""
        plan = self.plan
        segs = self._segments(nbytes)
        ready = [start + encode_s * (i + 1) / len(segs) if cut_through else start + encode_s for i in range(len(segs))]
        durable = []
        t = self.upload_free
        for r, size in zip(ready, segs):
            t = max(t, r) + size / (plan.costs.upload_mb_per_s * 1e6)
            durable.append(t)
        self.upload_free = t
        for region in plan.regions:
            actors = [a for a in self.actors if a.region is region]
            if region.name == plan.home:
                regional = durable
            elif region.relay:
                regional = self._cross(region, durable, segs, share=1)
                self.wan_bytes[region.name] += nbytes
            else:
                regional = None
            last_staged = 0.0
            for actor in actors if to_actors else ():
                arrivals = regional
                if arrivals is None:  # every actor pulls across the link itself
                    arrivals = self._cross(region, durable, segs, share=1)
                    self.wan_bytes[region.name] += nbytes
                local = region.local_gbit * 1e9 / 8
                t = max(actor.fetched_until, actor.staged.get(version - 1, 0.0) if version > 0 else 0.0)
                for arrival, size in zip(arrivals, segs):
                    t = max(t, arrival) + size / local
                actor.fetched_until = t
                # staging: verify + decode a delta; a full snapshot is read and verified at the load rate
                staged = t + (nbytes / (plan.costs.load_gb_per_s * 1e9) if self.mode == "full"
                              else nbytes / (plan.costs.decode_mb_per_s * 1e6))
                # the trainer learns it from the next heartbeat, which crosses the link to home Redis
                actor.staged[version] = staged + plan.costs.heartbeat_s / 2 + region.rtt_ms / 2000
                last_staged = max(last_staged, staged)
            if record is not None:
                record.delivered_s[region.name] = regional[-1] if regional else last_staged
                if actors:
                    record.staged_s[region.name] = last_staged
        return durable[-1]

    def _cross(self, region: Region, durable: list[float], segs: list[float], share: int) -> list[float]:
        """Segments copied over the region's link, FIFO behind whatever the link is still carrying; segments are
        striped over the streams, so fewer segments than streams use fewer streams."""
        rate = wan_rate(region, self.plan, min(self.streams, len(segs))) / share
        rtt = region.rtt_ms / 1000
        t = self.link_free[region.name]
        out = []
        for d, size in zip(durable, segs):
            t = max(t, d + rtt) + size / rate  # a GET costs a round trip before its first byte
            out.append(t)
        self.link_free[region.name] = t
        return out

    # --- processes --------------------------------------------------------------------------------

    def run(self) -> SimResult:
        plan = self.plan
        for actor in self.actors:
            actor.staged[0] = 0.0
        self.collected = {k: self.env.event() for k in range(1, plan.steps + 1)}
        self.env.process(self._trainer())
        self.env.run()
        records = [self.records[k] for k in sorted(self.records)]
        stamps = [r.recorded_s for r in records if r.recorded_s is not None]
        skip = 2 if len(stamps) > 4 else 0
        intervals = [b - a for a, b in zip(stamps[skip:], stamps[skip + 1:])]
        step_s = statistics.fmean(intervals) if intervals else float("nan")
        t0, t1 = (stamps[skip], stamps[-1]) if len(stamps) > skip + 1 else (0.0, self.env.now)
        busy = sum(self._busy_between(a, t0, t1) for a in self.actors)
        alive = sum(self._alive_between(a, t0, t1) for a in self.actors)
        idle = 1 - busy / alive if alive > 0 else 0.0
        return SimResult(self.mode, self.streams, records, step_s, max(0.0, idle), self.wan_bytes, self.env.now,
                         sum(1 for a in self.actors for d in a.down if d[0] < self.env.now))

    def _alive_between(self, actor: Actor, t0: float, t1: float) -> float:
        down = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in actor.down)
        return max(0.0, (t1 - t0) - down)

    def _busy_between(self, actor: Actor, t0: float, t1: float) -> float:
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in actor.intervals)

    def _trainer(self):
        plan = self.plan
        env = self.env
        self.env.process(self._dispatch(1, 0))
        for k in range(1, plan.steps + 1):
            yield self.collected[k]
            if k < plan.steps:
                env.process(self._dispatch(k + 1, max(k - 1, 0)))
            yield env.timeout(plan.train_s)
            record = self.records[k]
            record.train_end_s = env.now
            if self.mode == "full":
                # a full snapshot every version: written after training, copied across, loaded by the actors
                durable = self.deliver(k, env.now, self.payload, cut_through=False, encode_s=0.0, record=record)
            else:
                encode_s = plan.full_bytes / (plan.costs.encode_gb_per_s * 1e9)
                durable = self.deliver(k, env.now, self.payload, cut_through=plan.cut_through, encode_s=encode_s,
                                       record=record)
                if k % plan.snapshot_every == 0:  # a periodic snapshot rides the same upload and links
                    self.deliver(-k, durable, float(plan.full_bytes), cut_through=False, encode_s=0.0, record=None,
                                 to_actors=False)
            yield env.timeout(max(0.0, durable - env.now))
            record.published_s = env.now
            record.recorded_s = env.now

    def _known_staged(self, actor: Actor, version: int) -> float:
        return actor.staged.get(version, math.inf)

    def _dispatch(self, step: int, version: int):
        """start_step + collect of one batch, as the dispatcher and the ledger do it, by the scheduler's own
        rules (:mod:`aurora_store.sched`): eligibility, the estimator's shares (self-reports as capped priors,
        exclusion decay, measured settlements), lease durations, the re-grant of expired prompts."""
        plan, env = self.plan, self.env
        waited_from = env.now
        while True:
            now = env.now
            live = [a for a in self.actors if a.alive_at(now)]
            self.estimator.seen([a.actor_id for a in live], now)  # departed actors are forgotten
            views = {}
            for a in live:
                self._rejoin(a, now, version)
                # A lagging actor activates every committed version it has staged, in order (commits go to
                # everyone, not only to the actors a step is dispatched to), so it can catch up to v − 1.
                while a.active < version - 1 and self._known_staged(a, a.active + 1) <= now:
                    a.active += 1
                views[a.actor_id] = a.view(now, version)
                self.estimator.report(a.actor_id, a.tokens_per_s)  # its heartbeat's claim: a prior at most
            elig = sched.eligibility(views, version)
            if elig.eligible:
                break
            if now - waited_from > 86400:
                raise PlanError(f"step {step}: no actor became eligible for version {version} within a day")
            # the dispatcher polls every 0.2 s until someone is eligible
            wake = min([self._known_staged(a, version) for a in self.actors]
                       + [b for a in self.actors for _, b in a.down if b > now] + [now + 60.0])
            yield env.timeout(max(0.2, math.ceil((wake - now) / 0.2) * 0.2))
        for actor_id in elig.excluded:
            self.estimator.decay(actor_id)
        # ready actors first, then those committed forward, each in deployment order (the order random draws
        # are taken in)
        ready, commit = set(elig.ready), set(elig.need_commit)
        eligible = [a for a in live if a.actor_id in ready] + [a for a in live if a.actor_id in commit]
        record = StepRecord(step, version, now, math.nan, len(eligible), len(self.actors) - len(eligible), len(commit))
        self.records[step] = record
        shares = (sched.allocate(plan.batch_size, dict.fromkeys(elig.eligible, 1.0)) if plan.split == "uniform"
                  else self.estimator.shares(plan.batch_size, elig.eligible))
        record.lease_s = lease_s = self.leases.duration_ms() / 1000  # fixed at grant, from past completions
        finish: dict[str, float] = {}
        start: dict[str, float] = {}
        for a in eligible:
            activate = 0.0
            if a.actor_id in commit:
                # activation at the batch boundary: an in-place sparse scatter, or loading full weights
                activate = plan.full_bytes / ((plan.costs.load_gb_per_s if self.mode == "full"
                                               else plan.costs.apply_gb_per_s) * 1e9)
                a.active = version
            if not shares[a.actor_id]:  # eligible, but the batch ran out before its turn
                continue
            lease_at = a.idle_until(now + a.region.rtt_ms / 2000, plan.costs)
            start[a.actor_id] = lease_at + activate
            jitter = max(0.5, self.rng.gauss(1.0, plan.costs.gen_cv)) if plan.costs.gen_cv > 0 else 1.0
            finish[a.actor_id] = start[a.actor_id] + jitter * shares[a.actor_id] * plan.tokens_per_rollout \
                / a.tokens_per_s
        own = dict(finish)  # when each actor's own share is done
        working = [a for a in eligible if a.actor_id in finish]
        # Preemptions mid-batch: what the actor had not delivered expires with its leases and is re-granted
        # to the survivors (whoever holds the least work for its speed first).
        expires = now + lease_s
        delivered: dict[str, int] = {}
        regranted: dict[str, int] = {}
        for a in working:
            hit = a.preempted_between(start[a.actor_id], finish[a.actor_id])
            if hit is None:
                continue
            record.preempted += 1
            record.lease_expiries += 1
            n = shares[a.actor_id]
            delivered[a.actor_id] = math.floor(n * (hit - start[a.actor_id]) / (finish[a.actor_id] - start[a.actor_id]))
            finish[a.actor_id] = hit
            survivors = [b for b in eligible if b is not a and b.preempted_between(now, expires) is None]
            if not survivors:
                continue
            holding = {b.actor_id: shares[b.actor_id] + regranted.get(b.actor_id, 0)
                       for b in survivors if finish.get(b.actor_id, -math.inf) > expires}
            counts = sched.refill(n - delivered[a.actor_id], holding,
                            {b.actor_id: self.estimator.get(b.actor_id) for b in survivors})
            for b in survivors:
                if counts.get(b.actor_id):
                    regranted[b.actor_id] = regranted.get(b.actor_id, 0) + counts[b.actor_id]
                    finish[b.actor_id] = max(finish.get(b.actor_id, expires), expires) \
                        + counts[b.actor_id] * plan.tokens_per_rollout / b.tokens_per_s
                    start.setdefault(b.actor_id, expires)
                    own.setdefault(b.actor_id, -math.inf)
        busy = [a for a in eligible if a.actor_id in finish]
        for a in busy:
            if a.actor_id in regranted and own[a.actor_id] <= expires:  # idle from its own share to the expiry
                if shares[a.actor_id]:
                    a.intervals.append((start[a.actor_id], own[a.actor_id]))
                a.intervals.append((expires, finish[a.actor_id]))
            else:
                a.intervals.append((start[a.actor_id], finish[a.actor_id]))
            a.free_at = finish[a.actor_id]
        self._settle(now, expires, busy, shares, own, start, finish, delivered, regranted)
        done = max(finish[a.actor_id] + a.region.rtt_ms / 2000 for a in busy) + plan.costs.control_s
        yield env.timeout(max(0.0, done - env.now))
        record.collected_s = env.now
        self.collected[step].succeed()

    def _settle(self, granted: float, expires: float, busy: list[Actor], shares: dict[str, int],
                own: dict[str, float], start: dict[str, float], finish: dict[str, float], delivered: dict[str, int],
                regranted: dict[str, int]) -> None:
        """What the ledger learns from one step's results, in arrival order: each accepted prompt's completion
        time (the lease policy's samples) and each closed hold window (a measured settlement for the
        estimator). Folded in now: no dispatch happens before the step's last result."""
        tpr = self.plan.tokens_per_rollout
        arrivals: list[tuple[float, float]] = []  # (arrival, completion) per accepted prompt
        windows: list[tuple[float, sched.Measurement]] = []  # (closed at, measurement)
        for a in busy:
            half_rtt = a.region.rtt_ms / 2000
            n = shares.get(a.actor_id, 0)
            if a.actor_id in delivered:  # streamed its results until preempted; the window closes at expiry
                per_prompt = (own[a.actor_id] - start[a.actor_id]) / n
                for i in range(delivered[a.actor_id]):
                    t = start[a.actor_id] + (i + 1) * per_prompt + half_rtt
                    arrivals.append((t, t - granted))
                tokens = round(delivered[a.actor_id] * tpr)
                windows.append((expires, sched.Measurement(a.actor_id, tokens, expires - granted)))
                continue
            first = own[a.actor_id] + half_rtt
            arrivals += [(first, first - granted)] * n
            extra = regranted.get(a.actor_id, 0)
            last = finish[a.actor_id] + half_rtt
            arrivals += [(last, last - expires)] * extra
            if extra and (not n or first <= expires):  # idle when the expired prompts came: a second window
                if n:
                    windows.append((first, sched.Measurement(a.actor_id, round(n * tpr), first - granted)))
                windows.append((last, sched.Measurement(a.actor_id, round(extra * tpr), last - expires)))
            else:
                windows.append((last, sched.Measurement(a.actor_id, round((n + extra) * tpr), last - granted)))
        for _, completion in sorted(arrivals, key=lambda x: x[0]):
            self.leases.observe(int(completion * 1000))
        for _, measurement in sorted(windows, key=lambda x: x[0]):
            self.estimator.observe_settlement(measurement)

    def _rejoin(self, actor: Actor, now: float, version: int) -> None:
        """A replacement that is back (snapshot + deltas replayed: ``catch_up``) registers on the version
        before the one being dispatched, like any lagging actor, and is committed forward."""
        back = [b for _, b in actor.down if b <= now]
        if len(back) > actor.rejoined:
            actor.rejoined = len(back)
            self.estimator.forget(actor.actor_id)  # a replacement registers under a new id: nothing known of it
            actor.active = max(version - 1, 0)
            actor.staged[version] = now  # caught up to the newest published version


def simulate(plan: Plan, *, mode: str = "delta", streams: int | None = None) -> SimResult:
    return Simulation(plan, mode=mode, streams=streams).run()
