"""Getting an actor onto the run: wait for the first snapshot, then — through the follower — download the
snapshot its plan starts from, load the engine from it, check its weights from scratch, and replay the plan's
deltas. A corrupt or forged regional copy sends the whole bootstrap to the source bucket."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aurora_store.bus import ControlPlane
from aurora_store.errors import FormatError, VersionNotFoundError
from aurora_store.follow import BAD_COPY_ERRORS, BucketChain, Follower
from aurora_store.store import DeltaStore
from workers.engines import Engine

log = logging.getLogger("aurora.actor.bootstrap")

#: Loads the engine from a snapshot directory, for the snapshot's layout.
EngineFactory = Callable[..., Engine]


@dataclass(frozen=True)
class Booted:
    engine: Engine
    snapshot: int
    deltas: tuple[int, ...]
    planned_bytes: int
    latest: int  # newest version the bucket held at bootstrap
    committed: int  # newest version the trainer had committed (or the bucket's latest but one)


def run_record(store: DeltaStore) -> dict | None:
    """The advisory run record; a malformed one counts as absent (it is never trusted for anything)."""
    try:
        return store.run_info()
    except FormatError as exc:
        log.warning("ignoring a malformed run record in %s", store.url, extra={"error": str(exc)})
        return None


def wait_for_run(chain: BucketChain, timeout_s: float, stopped: Callable[[], bool] = lambda: False) -> dict:
    """The run record, once a bucket of the chain holds it and a snapshot (logging every 30 s while waiting:
    a spot actor is often up before the trainer has written its first snapshot). ``timeout_s`` 0: for ever."""
    started = time.monotonic()
    next_note = started + 30.0
    while not stopped():
        for store in (chain.regional, chain.source):
            info = run_record(store) if store is not None else None
            if info is not None and store is not None and store.snapshot_versions():
                return info
        now = time.monotonic()
        if timeout_s > 0 and now - started > timeout_s:
            raise VersionNotFoundError(f"no run and snapshot appeared in {chain.regional.url} in {timeout_s:g} s "
                                       f"(is the trainer running? raise --wait-for-run to wait longer)")
        if now >= next_note:  # say why nothing happens yet, so a waiting actor does not look hung
            log.info("waiting for the run's first snapshot", extra={"bucket": chain.regional.url,
                                                                    "waited_s": round(now - started)})
            next_note = now + 30.0
        time.sleep(0.5)
    raise VersionNotFoundError("stopped while waiting for the run's first snapshot")


def bootstrap(follower: Follower, plane: ControlPlane, load_engine: EngineFactory, cache_dir: Path,
              actor_id: str) -> Booted:
    """Bootstrap from the chain's current bucket (the source bucket if the regional one is not seeded yet, or
    if its copy proves bad)."""
    chain = follower.chain
    store = chain.store()
    if not store.snapshot_versions() and chain.source is not None:
        store = chain.source  # regional bucket not seeded yet
    try:
        return _bootstrap_from(follower, plane, store, load_engine, cache_dir)
    except BAD_COPY_ERRORS as exc:
        if chain.source is None or store is chain.source:
            raise
        # A corrupt or forged regional copy: the source bucket is the truth.
        log.warning("bootstrap from %s failed; using the source bucket", store.url, extra={"error": str(exc)})
        plane.log_event("refetch_source", actor=actor_id, version=-1, error=type(exc).__name__)
        return _bootstrap_from(follower, plane, chain.source, load_engine, cache_dir)


def _bootstrap_from(follower: Follower, plane: ControlPlane, store: DeltaStore, load_engine: EngineFactory,
                    cache_dir: Path) -> Booted:
    trainer = plane.trainer_state()
    latest = store.latest_version() or 0
    committed = trainer.committed if trainer is not None and trainer.committed >= 0 else max(latest - 1, 0)
    boot = follower.bootstrap(store, min(latest, committed), cache_dir)
    engine = load_engine(boot.model_dir, boot.layout)
    try:
        follower.attach(engine.target, boot)
    except BaseException:
        engine.close()
        raise
    engine.weights_changed()
    assert boot.plan.snapshot is not None
    return Booted(engine, boot.plan.snapshot, boot.plan.deltas, boot.plan.bytes, latest, committed)
