"""Handing out a step's prompts as leases and collecting the results (the trainer's job ledger).

Each step: find the eligible actors (on ``v``, or on ``v − 1`` with ``D_v`` staged — those get
``Commit(v)``), decay the excluded ones' throughput estimates, split the batch by estimated throughput,
grant per-prompt leases, then settle results as they arrive. Throughput estimates come from settlements:
every time an actor's hold window closes (see :mod:`aurora_store.sched.ledger`) its measured tokens/s is
folded into τ_a; the rate an actor reports in its heartbeat is only a capped prior until then. Expired
and returned leases go back to the pool and are re-granted to whoever is eligible, so a vanished actor
costs throughput, never correctness.

Membership: an actor is live only if its registration carries an admission proof made with the operator's
admission secret (:mod:`aurora_store.bus.identity`); its public key is bound to every lease granted to it, and
only results (and hand-backs) signed by that key count. Actors never measured get a probation share; actors
whose leases keep expiring are probed only every few steps (:class:`~aurora_store.sched.ExpiryBackoff`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from aurora_store.bus import ControlPlane, VersionEvent, identity
from aurora_store.bus.messages import ActorState, RolloutResult
from aurora_store.bus.plane import RESULTS_PER_READ
from aurora_store.errors import NoEligibleActors
from aurora_store.metrics import Metrics
from aurora_store.sched import (
    ActorView,
    ExpiryBackoff,
    LeasePolicy,
    Prompt,
    StepLedger,
    ThroughputEstimator,
    allocate,
    eligibility,
    refill,
)

log = logging.getLogger("aurora.trainer.dispatch")


@dataclass
class DispatchStats:
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)
    results_received: int = 0
    returned: int = 0
    expired: int = 0
    per_actor_accepted: Counter = field(default_factory=Counter)
    stale: int = 0  # results for leases of earlier steps (or an earlier trainer incarnation)
    unadmitted: int = 0  # registrations seen without a valid admission proof (polls, not distinct actors)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def as_counters(self) -> dict:
        return {"accepted": self.accepted, "rejected": dict(self.rejected), "results_received": self.results_received,
                "returned": self.returned, "expired": self.expired, "per_actor_accepted": dict(self.per_actor_accepted),
                "stale": self.stale, "unadmitted": self.unadmitted}

    def restore(self, counters: dict) -> None:
        self.accepted = int(counters.get("accepted", 0))
        self.rejected = Counter(counters.get("rejected", {}))
        self.results_received = int(counters.get("results_received", 0))
        self.returned = int(counters.get("returned", 0))
        self.expired = int(counters.get("expired", 0))
        self.per_actor_accepted = Counter(counters.get("per_actor_accepted", {}))
        self.stale = int(counters.get("stale", 0))
        self.unadmitted = int(counters.get("unadmitted", 0))




class Dispatcher:
    """``admission_secret``: the operator's secret registrations are proven with (required: an actor that
    cannot prove admission gets no work). ``vocab_size``: token ids of results must be below it."""

    def __init__(self, plane: ControlPlane, region: str, consumer: str, policy: LeasePolicy,
                 estimator: ThroughputEstimator | None = None, *, admission_secret: str, uniform: bool = False,
                 metrics: Metrics | None = None, backoff: ExpiryBackoff | None = None, vocab_size: int | None = None,
                 on_verdict: Callable[[str, RolloutResult | None, object], None] | None = None) -> None:
        self.admission_secret = identity.check_secret(admission_secret)
        self.backoff = backoff or ExpiryBackoff()
        self.vocab_size = vocab_size
        self.plane = plane
        self.region = region
        self.consumer = consumer
        self.policy = policy
        self.estimator = estimator or ThroughputEstimator()
        self.stats = DispatchStats()
        self.uniform = uniform
        self.metrics = metrics or Metrics("trainer", plane.run, region)
        self.committed = -1
        self.on_verdict = on_verdict
        self._keys: dict[str, str] = {}  # actor → the public key it was last admitted with
        plane.ensure_results_group()

    # --- membership ------------------------------------------------------------------------------

    def live_actors(self) -> dict[str, ActorState]:
        """Live, admitted actors. A registration without a valid admission proof is counted and ignored (the
        key bound by an earlier valid one stays: leases already granted remain answerable)."""
        actors = {}
        for actor_id, (state, credentials) in self.plane.actors().items():
            if not identity.admitted(self.admission_secret, self.plane.run, actor_id, credentials.public_key,
                                     credentials.admission):
                self.stats.unadmitted += 1
                self.metrics.rollouts.labels("rejected", "unadmitted").inc()
                continue
            if self._keys.get(actor_id) not in (None, credentials.public_key):
                log.warning("actor %s registered a new key", actor_id)  # a restart under the same id
            self._keys[actor_id] = credentials.public_key
            actors[actor_id] = state
        # Registered actors missing from here (deregistered, or heartbeat expired) for long enough have departed:
        # their throughput estimates go (leases keep their holder's key: a late result of theirs is still theirs).
        for actor_id in self.estimator.seen(actors, time.monotonic()):
            self.backoff.forget(actor_id)
            log.info("forgot departed actor %s", actor_id)
        return {a: state for a, state in actors.items() if state.status == "ready"}

    def key_of(self, actor_id: str) -> str | None:
        """The public key ``actor_id`` was last admitted with; ``None`` if never."""
        return self._keys.get(actor_id)

    def _eligible(self, version: int):
        actors = self.live_actors()
        for actor_id, state in actors.items():  # self-reports: a prior for actors never measured, no more
            if state.tokens_per_s > 0 and math.isfinite(state.tokens_per_s):
                self.estimator.report(actor_id, state.tokens_per_s)
        views = {a: ActorView(a, s.active_version, s.staged_version, s.staging_version) for a, s in actors.items()}
        return eligibility(views, version), actors

    def commit(self, version: int) -> None:
        if version > self.committed:
            self.plane.announce(VersionEvent("commit", version, self.region, sent_ms=self.plane.now_ms()))
            self.committed = version

    # --- a step ----------------------------------------------------------------------------------

    def _probed(self, eligible: tuple[str, ...], step: int) -> tuple[str, ...]:
        """``eligible`` less the actors whose leases keep expiring and whose probe is not due this step (all of
        them when nobody else is left: a step must go on)."""
        allowed = tuple(a for a in eligible if self.backoff.allowed(a, step))
        return allowed or eligible

    def start_step(self, step: int, version: int, digest: str, prompts: list[Prompt], *, group_size: int,
                   max_new_tokens: int, wait_s: float = 600.0, stop: Callable[[], bool] | None = None,
                   quorum: int = 1) -> StepLedger:
        """Dispatch ``step`` once ``quorum`` actors are eligible for ``version``, or once ``wait_s`` has passed
        with at least one (a warning then says how many came). ``stop``: raise :class:`NoEligibleActors` as soon
        as it returns true (the process is leaving) instead of waiting on."""
        if quorum < 1:
            raise ValueError(f"a step needs a quorum of at least one actor, got {quorum}")
        deadline = time.monotonic() + wait_s
        while True:
            elig, actors = self._eligible(version)
            late = time.monotonic() > deadline
            if len(elig.eligible) >= quorum or (elig.eligible and late):
                if len(elig.eligible) < quorum:
                    log.warning("step %d: %d of %d actors eligible after %.0fs; going ahead with them", step,
                                len(elig.eligible), quorum, wait_s, extra={"eligible": list(elig.eligible)})
                break
            if late:
                raise NoEligibleActors(f"no actor became eligible for version {version} within {wait_s:.0f}s")
            if stop is not None and stop():
                raise NoEligibleActors(f"stopped while waiting for an actor eligible for version {version}")
            if elig.excluded or not actors:
                # Lagging actors must know the version is committed to activate it once staged.
                self.commit(version)
            time.sleep(0.2)
        for actor_id in elig.excluded:
            self.estimator.decay(actor_id)
        self.commit(version)
        ledger = StepLedger(step, version, digest, prompts, self.policy, group_size=group_size,
                            max_new_tokens=max_new_tokens, key_of=self.key_of, run=self.plane.run,
                            vocab_size=self.vocab_size)
        chosen = self._probed(elig.eligible, step)
        shares = (allocate(len(prompts), dict.fromkeys(chosen, 1.0)) if self.uniform
                  else self.estimator.shares(len(prompts), chosen))
        now = self.plane.now_ms()
        grants = {}
        for actor_id, count in shares.items():
            grants[actor_id] = leases = ledger.grant(actor_id, count, now)
            self.metrics.leases.labels("granted").inc(len(leases))
            self.metrics.share.labels(actor_id).set(count)
            self.metrics.throughput_estimate.labels(actor_id).set(self.estimator.get(actor_id))
        self.plane.grant_many(grants)  # one round trip for all actors: N actors must not cost N round trips
        self.plane.log_event("dispatch", step=step, version=version, shares=shares,
                             excluded=list(elig.excluded), need_commit=list(elig.need_commit),
                             backed_off=sorted(set(elig.eligible) - set(chosen)),
                             lease_ms=self.policy.duration_ms(),
                             estimates={a: round(self.estimator.get(a), 1) for a in elig.eligible})
        log.info("step %d dispatched on version %d", step, version,
                 extra={"shares": shares, "excluded": list(elig.excluded)})
        return ledger

    def collect(self, ledger: StepLedger, *, timeout_s: float, tick: Callable[[], None] | None = None,
                stop: Callable[[], bool] | None = None) -> bool:
        """Settle results until every prompt of ``ledger`` is accepted; ``False`` if ``stop`` returned true
        first (the process is leaving: the step is abandoned, and redone from the checkpoint on restart)."""
        deadline = time.monotonic() + timeout_s
        accepted_before = len(ledger.accepted)
        while not ledger.complete:
            if stop is not None and stop():
                return False
            self.pump(ledger)
            if tick is not None:
                tick()
            if len(ledger.accepted) > accepted_before:
                accepted_before = len(ledger.accepted)
                deadline = time.monotonic() + timeout_s
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {ledger.step}: no progress for {timeout_s:.0f}s "
                                   f"({len(ledger.accepted)}/{len(ledger.prompts)} prompts accepted)")
        ledger.check_invariants()
        self._settle_backoff(ledger)
        return True

    def _settle_backoff(self, ledger: StepLedger) -> None:
        """Strike the actors of ``ledger`` that let leases expire without delivering anything; clear those that
        delivered."""
        delivered = {r.actor_id for r in ledger.leases.values() if r.state == "accepted"}
        expired = {r.actor_id for r in ledger.leases.values() if r.state in ("expired", "superseded")}
        for actor_id in {r.actor_id for r in ledger.leases.values()}:
            self.backoff.settled(actor_id, delivered=actor_id in delivered, expired=actor_id in expired)

    def pump(self, ledger: StepLedger, block_ms: int = 200) -> None:
        # Every result stamped (server clock) at or before ``now`` is delivered by the read that follows,
        # so expiring up to ``now`` afterwards can never pre-empt an on-time result.
        now = self.plane.now_ms()
        settled: list[tuple[str, dict]] = []
        block: int | None = block_ms
        while True:  # drain everything already in the stream before expiring, one bounded read at a time
            entries = self.plane.read_results(self.consumer, block_ms=block, cap_of=ledger.cap_of)
            for entry in entries:
                self._handle(ledger, entry.result, entry.arrival_ms, settled, entry.problem)
            self.plane.ack_results([entry.entry_id for entry in entries])
            if len(entries) < RESULTS_PER_READ:
                break
            block = None
        expired = ledger.expire(now)
        if expired:
            self.stats.expired += len(expired)
            self.metrics.leases.labels("expired").inc(len(expired))
            settled.append(("expire", dict(step=ledger.step, leases=len(expired),
                                           actors=sorted({r.actor_id for r in expired}))))
        self._measure(ledger, settled)
        # One round trip for every record of this pump (settlements, expiries, measurements), not one each.
        self.plane.log_events(settled)
        if ledger.pool:
            self._regrant(ledger)

    def _handle(self, ledger: StepLedger, result: RolloutResult | None, arrival: int,
                settled: list[tuple[str, dict]], problem: str | None = None) -> None:
        self.stats.results_received += 1
        self.metrics.results.inc()
        if result is not None and result.kind == "return":
            # Only the lease holder's own signed hand-back re-pools a prompt: anyone else's would take work away.
            if ledger.authentic(result) is None and ledger.give_back(result.lease_id, result.actor_id, arrival):
                self.stats.returned += 1
                self.metrics.leases.labels("returned").inc()
            else:
                self.metrics.rollouts.labels("rejected", "stale_return").inc()
            return
        if result is not None and result.lease_id not in ledger.leases:
            self.stats.stale += 1
        verdict = ledger.settle(result, arrival, problem)
        if verdict.accepted and result is not None:  # settle() rejects a missing (malformed) result
            self.stats.accepted += 1
            self.stats.per_actor_accepted[result.actor_id] += 1
            self.metrics.rollouts.labels("accepted", "ok").inc()
        else:
            self.stats.rejected[verdict.reason] += 1
            self.metrics.rollouts.labels("rejected", verdict.reason).inc()
        lease = verdict.lease.lease if verdict.lease is not None else None
        settled.append(("settle", dict(
            trainer=self.consumer, step=ledger.step, actor=getattr(result, "actor_id", ""),
            version=getattr(result, "version", None), digest=getattr(result, "weights_digest", None),
            job_version=lease.version if lease else None, job_digest=lease.weights_digest if lease else None,
            expires_ms=lease.expires_ms if lease else None, arrival_ms=arrival,
            prompt=lease.prompt_id if lease else None, accepted=int(verdict.accepted), reason=verdict.reason)))
        if self.on_verdict is not None:
            self.on_verdict(verdict.reason, result, verdict)

    def take_back(self, ledger: StepLedger, prompt_id: str, reason: str, **detail: object) -> str | None:
        """A result accepted earlier failed a later check (the logprob check): out of the step, counted under
        ``reason`` and logged, its prompt pooled to be leased again. Returns the actor whose result it was
        (``None``: no result was accepted for ``prompt_id``; nothing changes but the count)."""
        verdict = ledger.reject(prompt_id, reason)
        self.stats.rejected[reason] += 1
        self.metrics.rollouts.labels("rejected", reason).inc()
        if verdict.lease is None:
            return None
        actor_id = verdict.lease.actor_id
        self.stats.accepted -= 1
        self.stats.per_actor_accepted[actor_id] -= 1
        self.plane.log_event("take_back", step=ledger.step, actor=actor_id, prompt=prompt_id, reason=reason,
                             **detail)
        log.warning("step %d: result of %s for %s taken back (%s)", ledger.step, actor_id, prompt_id, reason,
                    extra=detail)
        return actor_id

    def _measure(self, ledger: StepLedger, records: list[tuple[str, dict]]) -> None:
        """Fold every settled hold window into the estimates (the paper's EMA after each settlement); the
        ``measure`` run-log records are appended to ``records`` (written in one batch by the caller)."""
        for m in ledger.take_measurements():
            estimate = self.estimator.observe_settlement(m)
            self.metrics.throughput_estimate.labels(m.actor_id).set(estimate)
            records.append(("measure", dict(step=ledger.step, actor=m.actor_id, tokens=m.tokens,
                                            seconds=round(m.seconds, 3), tokens_per_s=round(m.tokens_per_s, 2),
                                            estimate=round(estimate, 2))))

    def _regrant(self, ledger: StepLedger) -> None:
        elig, _ = self._eligible(ledger.version)
        if not elig.eligible:
            return
        chosen = self._probed(elig.eligible, ledger.step)
        self.commit(ledger.version)
        now = self.plane.now_ms()
        outstanding = Counter(r.actor_id for r in ledger.leases.values() if r.state == "active")
        # Whoever has the least outstanding work relative to its speed gets the next prompt.
        counts = refill(len(ledger.pool), outstanding, {a: self.estimator.get(a) for a in chosen})
        grants: dict[str, list] = {}
        for actor_id, count in counts.items():
            grants[actor_id] = leases = ledger.grant(actor_id, count, now)
            self.metrics.leases.labels("granted").inc(len(leases))
        self.plane.grant_many(grants)
