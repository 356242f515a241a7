"""The control plane of one run on Redis: version events, live states, leases and results.

All methods survive a Redis restart: calls reconnect with backoff (:class:`Reconnecting`), states are
re-written by the next heartbeat, the results consumer group is re-created on demand, and lost
notifications are recovered by re-reading the bucket (the caller's job) or by lease expiry.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import redis

from aurora_store.bus import streams
from aurora_store.bus.client import BLOCK_MS, Reconnecting
from aurora_store.bus.identity import Credentials
from aurora_store.bus.messages import (
    ActorState,
    Lease,
    MessageError,
    RelayState,
    RolloutResult,
    TrainerState,
    UnknownKindError,
    VersionEvent,
)
from aurora_store.bus.redis_keys import RunKeys
from aurora_store.config import HEARTBEAT_TTL_S

RESULTS_GROUP = "trainer"
#: Results fetched per read. Each entry is at most the server's largest bulk (``proto-max-bulk-len``) per
#: field, so this bounds what one read can cost the trainer before any entry is looked at.
RESULTS_PER_READ = 16
#: The cap of a result whose lease the reader does not know: enough for a hand-back or a late answer to be
#: recognised and counted, nothing more.
UNKNOWN_LEASE_CAP = 4096


@dataclass(frozen=True)
class Received:
    """One entry of the results stream: its id, its arrival (server clock, ms), the parsed result or ``None``,
    and why it is ``None`` (``"malformed"``: a missing or ill-typed field; ``"oversized"``: more bytes than its
    lease allows, refused before parsing)."""

    entry_id: str
    arrival_ms: int
    result: RolloutResult | None
    problem: str | None = None

log = logging.getLogger("aurora.bus.plane")


class ControlPlane:
    """``heartbeat_ttl_s``: how long the states this client writes outlive their last heartbeat (the processes
    pass :func:`aurora_store.config.heartbeat_ttl_s`, which reads AURORA_HEARTBEAT_TTL)."""

    def __init__(self, url: str, run: str, *, wait_s: float = 30.0, heartbeat_ttl_s: int = HEARTBEAT_TTL_S,
                 on_reconnect: Callable[[], None] | None = None) -> None:
        self.keys = RunKeys(run)
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.run = run
        self.url = url
        self._redis = Reconnecting(url, wait_s=wait_s, on_reconnect=on_reconnect)
        #: Messages dropped at the parse gate, by ``"<message>:<reason>"`` (``unknown_kind`` or ``malformed``).
        self.rejected: Counter[str] = Counter()
        self._rejected_lock = threading.Lock()

    def reject(self, message: str, error: MessageError, entry_id: str) -> None:
        """Count (and log, sparingly: a flood of forgeries must not become a flood of log lines) a message
        dropped at the parse gate. Never raises: a bad message is not the reader's failure."""
        reason = "unknown_kind" if isinstance(error, UnknownKindError) else "malformed"
        key = f"{message}:{reason}"
        with self._rejected_lock:
            self.rejected[key] += 1
            count = self.rejected[key]
        if count & (count - 1) == 0:  # the 1st, 2nd, 4th, 8th, … of each kind
            log.warning("dropped a %s message", message, extra={"reason": reason, "error": str(error)[:300],
                                                                  "entry": entry_id, "count": count})

    @property
    def reconnects(self) -> int:
        return self._redis.reconnects

    def call(self, fn: Callable[[redis.Redis], object]):
        return self._redis.call(fn)

    def now_ms(self) -> int:
        return self._redis.call(streams.server_millis)

    def close(self) -> None:
        self._redis.close()

    # --- version events --------------------------------------------------------------------------

    def announce(self, event: VersionEvent) -> str:
        return self._redis.call(lambda r: streams.add(r, self.keys.events(event.region), event.to_fields()))

    def read_events(self, cursors: Mapping[str, str], *, block_ms: int | None = BLOCK_MS,
                    ) -> list[tuple[str, str, VersionEvent]]:
        """New events after ``cursors`` (region → last id); returns ``(region, id, event)``; malformed entries
        are skipped (they cannot be trusted, and the bucket is the truth anyway). A loop that reads on from the
        ids returned re-reads malformed entries at the end of a stream: loops use :meth:`read_event_batch`."""
        return self.read_event_batch(cursors, block_ms=block_ms)[0]

    def read_event_batch(self, cursors: Mapping[str, str], *, block_ms: int | None = BLOCK_MS,
                         ) -> tuple[list[tuple[str, str, VersionEvent]], dict[str, str]]:
        """:meth:`read_events`, and the cursors to read on from: past every entry read, malformed ones
        included — so that one bad message is parsed (and counted) once, never re-read in a spin."""
        keyed = {self.keys.events(region): cursor for region, cursor in cursors.items()}
        regions = {self.keys.events(region): region for region in cursors}
        out = []
        advanced = dict(cursors)
        for entry in self._redis.call(lambda r: streams.read(r, keyed, block_ms=block_ms)):
            advanced[regions[entry.stream]] = entry.id
            try:
                out.append((regions[entry.stream], entry.id, VersionEvent.from_fields(entry.fields)))
            except MessageError as exc:
                self.reject("event", exc, entry.id)
        return out, advanced

    def latest_event_id(self, region: str) -> str:
        """Id of the newest event of ``region`` (``"0"`` when none): read from here to see only new ones."""
        return self.latest_id(self.keys.events(region))

    def latest_id(self, stream: str) -> str:
        last = self._redis.call(lambda r: r.xrevrange(stream, count=1))
        return streams.decode(last[0][0]) if last else "0"

    # --- live states -----------------------------------------------------------------------------

    def register_actor(self, state: ActorState, credentials: Credentials) -> None:
        """Register (or re-register) an actor with its public key and admission proof (the trainer admits it
        only if the proof verifies; nothing secret is written)."""
        def go(r: redis.Redis) -> None:
            pipe = r.pipeline()
            pipe.sadd(self.keys.actors, state.actor_id)
            pipe.hset(self.keys.actor(state.actor_id),
                      mapping=streams.redis_fields({**state.to_fields(), **credentials.to_fields()}))
            pipe.expire(self.keys.actor(state.actor_id), self.heartbeat_ttl_s)
            pipe.execute()
            streams.add(r, self.keys.membership, {"kind": "join", "actor_id": state.actor_id,
                                                  "region": state.region})
        self._redis.call(go)

    def heartbeat_actor(self, state: ActorState, credentials: Credentials) -> None:
        def go(r: redis.Redis) -> None:
            pipe = r.pipeline()
            pipe.sadd(self.keys.actors, state.actor_id)
            pipe.hset(self.keys.actor(state.actor_id),
                      mapping=streams.redis_fields({**state.to_fields(), **credentials.to_fields()}))
            pipe.expire(self.keys.actor(state.actor_id), self.heartbeat_ttl_s)
            pipe.execute()
        self._redis.call(go)

    def deregister_actor(self, actor_id: str, region: str) -> None:
        def go(r: redis.Redis) -> None:
            pipe = r.pipeline()
            pipe.srem(self.keys.actors, actor_id)
            pipe.delete(self.keys.actor(actor_id))
            pipe.execute()
            streams.add(r, self.keys.membership, {"kind": "leave", "actor_id": actor_id, "region": region})
        self._redis.call(go)

    def actors(self) -> dict[str, tuple[ActorState, Credentials]]:
        """Live actors (heartbeat not expired) → ``(state, credentials)``; expired ones are pruned from the set,
        malformed ones skipped. The credentials are as registered: admitting them is the trainer's job."""
        def go(r: redis.Redis) -> dict[str, tuple[ActorState, Credentials]]:
            ids = [streams.decode(i) for i in r.smembers(self.keys.actors)]
            pipe = r.pipeline(transaction=False)  # independent reads: no MULTI/EXEC to queue and unwrap
            for actor_id in ids:
                pipe.hgetall(self.keys.actor(actor_id))
            out = {}
            for actor_id, raw in zip(ids, pipe.execute()):
                fields = {streams.decode(k): streams.decode(v) for k, v in (raw or {}).items()}
                if not fields:
                    r.srem(self.keys.actors, actor_id)
                    continue
                credentials = Credentials(fields.pop("public_key", ""), fields.pop("admission", ""))
                try:
                    state = ActorState.from_fields(fields)
                except MessageError:
                    continue
                if state.actor_id == actor_id:  # a hash claiming another actor's id under its own key is junk
                    out[actor_id] = (state, credentials)
            return out
        return self._redis.call(go)

    def heartbeat_relay(self, state: RelayState) -> None:
        def go(r: redis.Redis) -> None:
            pipe = r.pipeline()
            pipe.sadd(self.keys.relays, state.region)
            pipe.hset(self.keys.relay(state.region), mapping=streams.redis_fields(state.to_fields()))
            pipe.expire(self.keys.relay(state.region), self.heartbeat_ttl_s)
            pipe.execute()
        self._redis.call(go)

    def relay(self, region: str) -> RelayState | None:
        raw = self._redis.call(lambda r: r.hgetall(self.keys.relay(region)))
        fields = {streams.decode(k): streams.decode(v) for k, v in (raw or {}).items()}
        try:
            return RelayState.from_fields(fields) if fields else None
        except MessageError:
            return None

    def relays(self) -> dict[str, RelayState]:
        regions = [streams.decode(x) for x in self._redis.call(lambda r: r.smembers(self.keys.relays))]
        return {region: state for region in regions if (state := self.relay(region)) is not None}

    def set_trainer_state(self, state: TrainerState) -> None:
        def go(r: redis.Redis) -> None:
            r.hset(self.keys.trainer, mapping=streams.redis_fields(state.to_fields()))
            r.expire(self.keys.trainer, 6 * self.heartbeat_ttl_s)
        self._redis.call(go)

    def trainer_state(self) -> TrainerState | None:
        raw = self._redis.call(lambda r: r.hgetall(self.keys.trainer))
        fields = {streams.decode(k): streams.decode(v) for k, v in (raw or {}).items()}
        try:
            return TrainerState.from_fields(fields) if fields else None
        except MessageError:
            return None

    # --- leases and results ----------------------------------------------------------------------

    def grant(self, actor_id: str, leases: Iterable[Lease]) -> None:
        self.grant_many({actor_id: list(leases)})

    def grant_many(self, grants: Mapping[str, Iterable[Lease]]) -> None:
        """Append leases to several actors' work streams in one round trip (a step's dispatch to N actors must
        not cost N round trips: each one also hands the GIL to other threads)."""
        batch = [(actor_id, lease) for actor_id, leases in grants.items() for lease in leases]
        if not batch:
            return

        def go(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=False)
            for actor_id, lease in batch:
                pipe.xadd(self.keys.work(actor_id), streams.redis_fields(lease.to_fields()),
                          maxlen=streams.DEFAULT_MAXLEN, approximate=True)
            pipe.execute()
        self._redis.call(go)

    def read_work(self, actor_id: str, cursor: str, *, block_ms: int | None = BLOCK_MS,
                  ) -> list[tuple[str, Lease]]:
        out = []
        entries = self._redis.call(lambda r: streams.read(r, {self.keys.work(actor_id): cursor}, block_ms=block_ms))
        for entry in entries:
            try:
                out.append((entry.id, Lease.from_fields(entry.fields)))
            except MessageError:
                continue
        return out

    def send_result(self, result: RolloutResult) -> str:
        return self._redis.call(lambda r: streams.add(r, self.keys.results, result.to_fields()))

    def ensure_results_group(self) -> None:
        self._redis.call(lambda r: streams.ensure_group(r, self.keys.results, RESULTS_GROUP))

    def read_results(self, consumer: str, *, block_ms: int | None = BLOCK_MS,
                     cap_of: Callable[[str], int | None] | None = None) -> list[Received]:
        """New results for the trainer's group (at most :data:`RESULTS_PER_READ`). ``cap_of(lease_id)``: the
        most bytes a result for that lease may take (``None``: unknown lease, :data:`UNKNOWN_LEASE_CAP`); a
        larger entry is refused before its fields are decoded or parsed, so a huge message costs the trainer
        its raw bytes once, never its parsed size. No cap function: entries are parsed whatever their size."""
        entries = self._redis.call(
            lambda r: streams.read_group_raw(r, self.keys.results, RESULTS_GROUP, consumer, block_ms=block_ms,
                                             count=RESULTS_PER_READ))
        out = []
        for entry in entries:
            if cap_of is not None:
                cap = cap_of(streams.decode(entry.fields.get("lease_id", b""))[:64])
                if entry.size > (UNKNOWN_LEASE_CAP if cap is None else cap):
                    out.append(Received(entry.id, entry.millis, None, "oversized"))
                    continue
            try:
                fields = {k: streams.decode(v) for k, v in entry.fields.items()}
                out.append(Received(entry.id, entry.millis, RolloutResult.from_fields(fields)))
            except (MessageError, UnicodeDecodeError):
                out.append(Received(entry.id, entry.millis, None, "malformed"))
        return out

    def ack_results(self, ids: list[str]) -> None:
        self._redis.call(lambda r: streams.ack(r, self.keys.results, RESULTS_GROUP, ids))

    # --- run log (for operators and notebooks) ---------------------------------------------------

    def log_event(self, kind: str, **fields: object) -> None:
        self.log_events([(kind, fields)])

    def log_events(self, events: Iterable[tuple[str, Mapping[str, object]]]) -> None:
        """Append several run-log records in one round trip (e.g. every settlement of one read)."""
        payloads = [{"kind": kind, **{k: "" if v is None else v for k, v in fields.items()}} for kind, fields in events]
        if not payloads:
            return

        def go(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=False)
            for payload in payloads:
                pipe.xadd(self.keys.run_log, streams.encode(payload), maxlen=100_000, approximate=True)
            pipe.execute()
        self._redis.call(go)

    def run_log(self, count: int = 100_000) -> list[dict[str, str]]:
        entries = self._redis.call(lambda r: streams.read_range(r, self.keys.run_log, count=count))
        return [{"id": e.id, **e.fields} for e in entries]
