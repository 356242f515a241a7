"""The job ledger of one step: per-prompt leases that expire, and the acceptance predicate.

A result for lease ``j`` is accepted iff it arrived before the lease expired (server clock: the result's
stream id), was generated on the job's version, carries that version's weights digest, comes from the
actor the lease was granted to (signed by the key that actor was admitted with when the lease was granted),
has the lease's shape (:func:`shape_problem`: the group size, at most ``max_new_tokens`` token ids each,
every id in the vocabulary, one finite logprob per token), and its prompt has not been accepted yet.
Everything else is rejected and counted by reason; a later check of an accepted result (e.g. the trainer's
logprob recomputation) rejects it through :meth:`StepLedger.reject`, the one place a result is taken back.
Expired or returned leases put their prompt back in the pool, so no prompt is ever lost or counted twice.
Time is always passed in (``now_ms``): the ledger is a pure state machine.

Settlement also measures each actor's throughput: from the grant that gave it work while it held none
until the settlement that leaves it holding none (a *hold window*, server clock), the tokens of its
accepted results over the window's duration (:class:`~aurora_store.sched.allocation.Measurement`). Counted
over the whole window, so an actor that generates its leases in several batches is measured at its real
rate. A window closed by an expiry is measured too (what it delivered, possibly nothing, over the time it
held the prompts): an actor too slow to finish must not keep its share. Tokens are counted from the
results' samples, which the trainer trains on, not from what the actor claims.
"""

from __future__ import annotations

import math
import statistics
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aurora_store.bus import identity
from aurora_store.bus.messages import Lease, RolloutResult
from aurora_store.errors import SchedulingError
from aurora_store.sched.allocation import Measurement

REASONS = ("late", "wrong_version", "wrong_digest", "unknown_lease", "duplicate", "wrong_actor", "bad_signature",
           "unregistered", "malformed", "oversized", "bad_shape", "not_active", "logprobs")


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class LeaseRecord:
    lease: Lease
    actor_id: str
    granted_ms: int
    state: str = "active"  # active | accepted | expired | returned | superseded | voided | rejected
    public_key: str = ""  # the holder's admitted key when the lease was granted: its results must be signed by it


@dataclass
class HoldWindow:
    """An actor's uninterrupted stretch of holding leases of this step (see the module docstring)."""

    opened_ms: int
    tokens: int = 0
    expired: bool = False


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str  # "ok" or one of REASONS
    lease: LeaseRecord | None = None
    latency_ms: int | None = None


@dataclass
class LeasePolicy:
    """Lease duration = ``factor`` × median completion time, clamped; ``initial_ms`` until measured."""

    factor: float = 2.5
    initial_ms: int = 60_000
    # A floor well above scheduling jitter (activating a version, a busy host): a fast engine's median
    # completion can be far below one second, and leases that short expire under honest actors.
    min_ms: int = 4_000
    max_ms: int = 600_000
    window: int = 256  # completions the median is taken over (the newest)
    _samples: deque = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._samples = deque(maxlen=self.window)

    def observe(self, completion_ms: int) -> None:
        self._samples.append(max(int(completion_ms), 1))

    def duration_ms(self) -> int:
        if not self._samples:
            return self.initial_ms
        median = statistics.median(self._samples)
        return int(min(max(self.factor * median, self.min_ms), self.max_ms))


class StepLedger:
    def __init__(self, step: int, version: int, weights_digest: str, prompts: Iterable[Prompt],
                 policy: LeasePolicy | None = None, *, group_size: int = 1, max_new_tokens: int = 16,
                 temperature: float = 1.0, key_of: Callable[[str], str | None] | None = None, run: str = "",
                 vocab_size: int | None = None) -> None:
        """``key_of(actor_id)``: the public key ``actor_id`` was admitted with (``None``: not admitted);
        without ``key_of`` results are not authenticated (unit tests of the scheduling alone). ``run``: what
        signatures are bound to. ``vocab_size``: token ids must be below it (``None``: not checked)."""
        self.step = step
        self.version = version
        self.weights_digest = weights_digest
        self.prompts = {p.prompt_id: p for p in prompts}
        if not self.prompts:
            raise SchedulingError("a step needs at least one prompt")
        self.policy = policy or LeasePolicy()
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.key_of = key_of
        self.run = run
        self.vocab_size = vocab_size
        self.pool: deque[str] = deque(self.prompts)
        self.leases: dict[str, LeaseRecord] = {}
        self.accepted: dict[str, RolloutResult] = {}
        self.rejected: Counter[str] = Counter()
        self.expired = 0
        self.returned = 0
        self.granted = 0
        self.started_ms: int | None = None  # first grant (server clock)
        self.completed_ms: int | None = None  # arrival of the result that completed the step
        self._active: Counter[str] = Counter()  # active leases per actor
        self._windows: dict[str, HoldWindow] = {}
        self.measurements: list[Measurement] = []  # settled hold windows, drained by take_measurements()

    # --- granting --------------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        return len(self.accepted) == len(self.prompts)

    @property
    def outstanding(self) -> int:
        return sum(1 for r in self.leases.values() if r.state == "active")

    def grant(self, actor_id: str, count: int, now_ms: int) -> list[Lease]:
        """Lease up to ``count`` pooled prompts to ``actor_id``."""
        out: list[Lease] = []
        duration = self.policy.duration_ms()
        while self.pool and len(out) < count:
            prompt = self.prompts[self.pool.popleft()]
            lease = Lease(lease_id=uuid.uuid4().hex, prompt_id=prompt.prompt_id, step=self.step,
                          version=self.version, weights_digest=self.weights_digest, expires_ms=now_ms + duration,
                          prompt=prompt.text, group_size=self.group_size, max_new_tokens=self.max_new_tokens,
                          temperature=self.temperature)
            key = (self.key_of(actor_id) or "") if self.key_of is not None else ""
            self.leases[lease.lease_id] = LeaseRecord(lease, actor_id, now_ms, public_key=key)
            out.append(lease)
        if out:
            if not self._active[actor_id]:
                self._windows[actor_id] = HoldWindow(now_ms)
            self._active[actor_id] += len(out)
        self.granted += len(out)
        if out and self.started_ms is None:
            self.started_ms = now_ms
        return out

    def expire(self, now_ms: int) -> list[LeaseRecord]:
        """Return every lease past its expiry to the pool."""
        expired = []
        for record in self.leases.values():
            if record.state == "active" and now_ms > record.lease.expires_ms:
                record.state = "expired"
                self.pool.append(record.lease.prompt_id)
                expired.append(record)
                self._release(record, now_ms, expired=True)
        self.expired += len(expired)
        return expired

    def give_back(self, lease_id: str, actor_id: str, now_ms: int | None = None) -> bool:
        """An actor hands back an unfinished lease (graceful leave): its prompt is re-pooled at once."""
        record = self.leases.get(lease_id)
        if record is None or record.state != "active" or record.actor_id != actor_id:
            return False
        record.state = "returned"
        self.pool.append(record.lease.prompt_id)
        self.returned += 1
        self._release(record, now_ms)
        return True

    # --- settlement ------------------------------------------------------------------------------

    def cap_of(self, lease_id: str) -> int | None:
        """The most bytes a result for ``lease_id`` may take (``None``: not a lease of this step)."""
        record = self.leases.get(lease_id)
        return record.lease.result_cap if record is not None else None

    def authentic(self, result: RolloutResult) -> str | None:
        """``None`` if ``result`` (or hand-back) is signed by the key its lease is bound to, else the reason."""
        record = self.leases.get(result.lease_id)
        if record is None:
            return "unknown_lease"
        if record.actor_id != result.actor_id:
            return "wrong_actor"
        if self.key_of is None:
            return None
        if not record.public_key:
            return "unregistered"
        if not identity.verify(record.public_key, self.run, result.to_fields(), result.signature):
            return "bad_signature"
        return None

    def settle(self, result: RolloutResult | None, arrival_ms: int, problem: str | None = None) -> Verdict:
        """Settle one entry of the results stream; ``problem``: why it could not be parsed (``result`` is then
        ``None``; ``"malformed"`` when not given)."""
        if result is None or result.kind != "result":
            return self._reject(problem if problem in REASONS else "malformed", None)
        refused = self.authentic(result)
        record = self.leases.get(result.lease_id)
        if refused is not None or record is None:
            return self._reject(refused or "unknown_lease", record)
        if arrival_ms > record.lease.expires_ms:
            return self._reject("late", record)
        if result.version != record.lease.version:
            return self._reject("wrong_version", self._void(record))
        if result.weights_digest != record.lease.weights_digest:
            return self._reject("wrong_digest", self._void(record))
        if shape_problem(result, record.lease, self.vocab_size) is not None:
            return self._reject("bad_shape", self._void(record))
        prompt_id = record.lease.prompt_id
        if prompt_id in self.accepted:
            return self._reject("duplicate", record)
        if record.state not in ("active", "expired"):
            return self._reject("not_active", record)
        if record.state == "expired":
            # On time by the server clock, but the expiry sweep ran before we read it: still valid. Take the
            # prompt back from the pool, or from whoever it was re-leased to.
            if prompt_id in self.pool:
                self.pool.remove(prompt_id)
            for other in self.leases.values():
                if other.lease.prompt_id == prompt_id and other.state == "active":
                    other.state = "superseded"
                    self._release(other, arrival_ms)
        was_active = record.state == "active"
        record.state = "accepted"
        self.accepted[prompt_id] = result
        if was_active:
            self._release(record, arrival_ms, tokens=_sample_tokens(result))
        if self.complete:
            self.completed_ms = arrival_ms
        latency = arrival_ms - record.granted_ms
        self.policy.observe(latency)
        return Verdict(True, "ok", record, latency)

    def reject(self, prompt_id: str, reason: str, now_ms: int | None = None) -> Verdict:
        """Take back the accepted result of ``prompt_id`` because a later check refused it (``reason``, e.g. the
        trainer's logprob recomputation): it leaves :attr:`accepted`, is counted under ``reason``, and the
        prompt goes back to the pool so a caller still collecting the step has it generated again. The tokens
        it contributed to its holder's throughput measurement are not taken back (that window is settled);
        the caller decides what else the actor deserves."""
        result = self.accepted.pop(prompt_id, None)
        if result is None:
            return self._reject(reason, None)
        record = self.leases.get(result.lease_id)
        if record is not None:
            record.state = "rejected"
        self.pool.append(prompt_id)
        self.completed_ms = None
        return self._reject(reason, record)

    def drop(self, prompt_id: str) -> bool:
        """Take a pooled prompt out of the step (it will not be leased again; the step completes without it);
        ``False`` (nothing changes) unless ``prompt_id`` is in the pool."""
        if prompt_id not in self.pool:
            return False
        self.pool.remove(prompt_id)
        del self.prompts[prompt_id]
        return True

    def _void(self, record: LeaseRecord) -> LeaseRecord:
        """The lease holder answered from the wrong weights: that answer will not change, so the prompt goes
        back to the pool now instead of at expiry."""
        if record.state == "active":
            record.state = "voided"
            self.pool.append(record.lease.prompt_id)
            self._release(record, None)
        return record

    # --- throughput measurement ------------------------------------------------------------------

    def _release(self, record: LeaseRecord, now_ms: int | None, *, tokens: int = 0, expired: bool = False) -> None:
        """``record`` stopped being active; close its holder's window when it was the last active lease."""
        actor_id = record.actor_id
        self._active[actor_id] -= 1
        window = self._windows.get(actor_id)
        if window is None:
            return
        window.tokens += tokens
        window.expired = window.expired or expired
        if self._active[actor_id] > 0:
            return
        del self._windows[actor_id]
        # Only windows with something to say: delivered tokens, or prompts held until they expired. A window
        # closed by a hand-back or a wrong answer without any accepted work measures nothing.
        if now_ms is not None and (window.tokens > 0 or window.expired):
            seconds = max(now_ms - window.opened_ms, 1) / 1000
            self.measurements.append(Measurement(actor_id, window.tokens, seconds))

    def take_measurements(self) -> list[Measurement]:
        """Hold windows settled since the last call."""
        out, self.measurements = self.measurements, []
        return out

    def _reject(self, reason: str, record: LeaseRecord | None) -> Verdict:
        self.rejected[reason] += 1
        return Verdict(False, reason, record)

    # --- invariants (cheap enough to assert in tests and at step end) ----------------------------

    def check_invariants(self) -> None:
        active = [r.lease.prompt_id for r in self.leases.values() if r.state == "active"]
        pooled = list(self.pool)
        accepted = list(self.accepted)
        everything = pooled + active + accepted
        # every prompt is pooled, leased or accepted, and prompts never duplicate across those
        if sorted(set(everything)) != sorted(self.prompts):
            raise SchedulingError("a prompt was lost")
        if len(set(accepted)) != len(accepted) or len(set(pooled) & set(accepted)) or len(set(active) & set(accepted)):
            raise SchedulingError("a prompt is counted twice")

    @property
    def makespan_ms(self) -> int | None:
        """From the first grant to the arrival of the last needed result."""
        if self.started_ms is None or self.completed_ms is None:
            return None
        return self.completed_ms - self.started_ms

    def counters(self) -> dict[str, int]:
        return {"accepted": len(self.accepted), "rejected": sum(self.rejected.values()), "granted": self.granted,
                "expired": self.expired, "returned": self.returned,
                **{f"rejected_{k}": v for k, v in self.rejected.items()}}


def shape_problem(result: RolloutResult, lease: Lease, vocab_size: int | None = None) -> str | None:
    """What is wrong with ``result``'s samples for ``lease`` (``None``: nothing): exactly ``group_size`` samples,
    each a mapping with at most ``max_new_tokens`` integer ``ids`` (each below ``vocab_size``, when given), as
    many finite, non-positive ``logprobs``, and a string ``text``. The trainer trains on these and measures
    throughput from them, so a result the lease could not have produced is refused whole."""
    samples = result.samples
    if not isinstance(samples, list) or len(samples) != lease.group_size:
        return f"{len(samples) if isinstance(samples, list) else 'no'} samples for a group of {lease.group_size}"
    high = vocab_size if vocab_size is not None else 1 << 31
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            return f"sample {i} is not an object"
        ids, logprobs, text = sample.get("ids"), sample.get("logprobs"), sample.get("text")
        if not isinstance(ids, list) or len(ids) > lease.max_new_tokens:
            return f"sample {i}: ids must be a list of at most {lease.max_new_tokens} tokens"
        if not all(type(t) is int and 0 <= t < high for t in ids):
            return f"sample {i}: a token id outside [0, {high})"
        if not isinstance(logprobs, list) or len(logprobs) != len(ids):
            return f"sample {i}: logprobs must be one per token"
        if not all(type(x) in (int, float) and math.isfinite(x) and x <= 0 for x in logprobs):
            return f"sample {i}: logprobs must be finite and at most 0"
        if not isinstance(text, str):
            return f"sample {i}: text must be a string"
    return None


def _sample_tokens(result: RolloutResult) -> int:
    """Completion tokens of a result, counted from its samples (the ``tokens`` field is the actor's claim)."""
    total = 0
    for sample in result.samples:
        ids = sample.get("ids") if isinstance(sample, Mapping) else None
        if isinstance(ids, list):
            total += len(ids)
    return total
