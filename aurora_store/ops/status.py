"""``aurora status``: who is on which version right now, read from the control plane.

Everything shown comes from the live states that actors, relays and the trainer heartbeat into Redis
(hashes that expire when heartbeats stop), so a row disappears on its own when its process dies. The
heartbeat age is measured against the Redis server's clock, the same clock the lease deadlines use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from aurora_store.bus import ControlPlane
from aurora_store.bus.client import connect, redact
from aurora_store.errors import ConfigError
from aurora_store.textfmt import human_bytes, table

#: Keys every run has at least one of while it is alive (see aurora_store.bus.redis_keys.RunKeys).
_RUN_MARKERS = ("trainer", "actors", "relays", "log")


@dataclass(frozen=True)
class ActorRow:
    actor_id: str
    region: str
    status: str
    version: int | None
    staged: int | None
    tokens_per_s: float
    leases: int
    source: str
    heartbeat_age_s: float
    downloaded_bytes: int


@dataclass(frozen=True)
class RelayRow:
    region: str
    version: int | None
    segments_copied: int
    bytes_copied: int
    cache_hit_ratio: float | None  # None until the cache has been asked anything
    heartbeat_age_s: float


@dataclass(frozen=True)
class TrainerRow:
    version: int
    committed: int
    step: int
    status: str
    region: str
    bucket: str
    heartbeat_age_s: float


@dataclass(frozen=True)
class ClusterStatus:
    run: str
    redis: str  # the URL without its password
    now_ms: int
    actors: tuple[ActorRow, ...]
    relays: tuple[RelayRow, ...]
    trainer: TrainerRow | None

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "redis": self.redis, "now_ms": self.now_ms,
                "trainer": asdict(self.trainer) if self.trainer else None,
                "actors": [asdict(a) for a in self.actors], "relays": [asdict(r) for r in self.relays]}


def discover_runs(redis_url: str, *, wait_s: float = 2.0) -> list[str]:
    """Names of the runs that have any state in this Redis (so ``--run`` can be omitted when there is one)."""
    client = connect(redis_url, wait_s=wait_s)
    try:
        runs = set()
        for raw in client.scan_iter(match="aurora:*", count=1000):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            run, _, suffix = key.removeprefix("aurora:").rpartition(":")
            if run and suffix in _RUN_MARKERS:
                runs.add(run)
        return sorted(runs)
    finally:
        client.close()


def resolve_run(redis_url: str, run: str | None) -> str:
    """``run`` if given, else the only run present; :class:`ConfigError` when that is ambiguous."""
    if run:
        return run
    runs = discover_runs(redis_url)
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise ConfigError(f"no Aurora run has state in {redact(redis_url)}")
    raise ConfigError(f"{redact(redis_url)} holds several runs ({', '.join(runs)}): choose one with --run")


def read_status(plane: ControlPlane) -> ClusterStatus:
    """One consistent-enough view (a few reads, no transaction: states change every heartbeat anyway)."""
    now = plane.now_ms()

    def age(ms: int) -> float:
        return round(max(0, now - ms) / 1000, 3)

    actors = tuple(sorted((ActorRow(s.actor_id, s.region, s.status, s.active_version, s.staged_version,
                                    s.tokens_per_s, s.leases, s.source, age(s.heartbeat_ms), s.downloaded_bytes)
                           for s, _ in plane.actors().values()), key=lambda a: (a.region, a.actor_id)))
    relays = []
    for region, r in sorted(plane.relays().items()):
        asked = r.cache_hits + r.cache_misses
        relays.append(RelayRow(region, r.version, r.segments_copied, r.bytes_copied,
                               r.cache_hits / asked if asked else None, age(r.heartbeat_ms)))
    t = plane.trainer_state()
    trainer = TrainerRow(t.version, t.committed, t.step, t.status, t.region, t.bucket, age(t.heartbeat_ms)) \
        if t is not None else None
    return ClusterStatus(plane.run, redact(plane.url), now, actors, tuple(relays), trainer)


def render_status(status: ClusterStatus) -> str:
    """The three tables ``aurora status`` prints."""
    lines = [f"run {status.run} on {status.redis}", ""]
    t = status.trainer
    if t is None:
        lines.append("trainer: no live state")
    else:
        lines.append(f"trainer ({t.region}): version {t.version}, committed {t.committed}, step {t.step}, "
                     f"{t.status}, heartbeat {t.heartbeat_age_s:.1f}s ago; bucket {t.bucket}")
    lines += ["", "actors:", table([{
        "actor": a.actor_id, "region": a.region, "status": a.status, "version": a.version, "staged": a.staged,
        "tokens/s": f"{a.tokens_per_s:,.0f}", "leases": a.leases, "source": a.source,
        "heartbeat": f"{a.heartbeat_age_s:.1f}s"} for a in status.actors],
        ["actor", "region", "status", "version", "staged", "tokens/s", "leases", "source", "heartbeat"])]
    lines += ["", "relays:", table([{
        "region": r.region, "version": r.version, "segments": r.segments_copied,
        "copied": human_bytes(r.bytes_copied),
        "cache hits": f"{100 * r.cache_hit_ratio:.1f}%" if r.cache_hit_ratio is not None else None,
        "heartbeat": f"{r.heartbeat_age_s:.1f}s"} for r in status.relays],
        ["region", "version", "segments", "copied", "cache hits", "heartbeat"])]
    return "\n".join(lines)
