"""The one sequence that keeps a set of weights on a run: size → plan (replay vs snapshot) → stage → activate.

A :class:`Follower` reads versions from a :class:`~aurora_store.follow.chain.BucketChain`, fetches segments
through :func:`~aurora_store.store.transfer.fetch_segments` on the process's transfer pool (prefetched bytes and
a relay's cache come in as :class:`~aurora_store.store.transfer.HeldSegments` and
:class:`~aurora_store.follow.sources.SegmentSource`), decodes ahead when it has a prefetcher, stages without
writing, and activates in place only when the caller says so (a batch boundary) and only on the staged base.
Every manifest passes the verifier before anything it names is fetched — and before it enters a catch-up
plan: a listing names what a bucket holds, not what the trainer signed, so an unsigned, mis-signed or
foreign-run manifest in a (relay-fed, untrusted) regional bucket is never a plan's step or goal. A region
whose bucket offers no path to its newest signed version plans, and stages, from the source bucket.

The actor, the vLLM backend's pull mode, ``aurora patch`` and the WAN benchmark's agent all go through here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aurora_store.codec.decoder import Staged, StagedDelta, activate
from aurora_store.codec.layout import ModelLayout
from aurora_store.codec.manifest import DeltaManifest, SegmentRef
from aurora_store.codec.params import CodecParams
from aurora_store.codec.target import WeightTarget
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.errors import AuroraError, BaseVersionMismatchError, DigestMismatchError, VersionNotFoundError
from aurora_store.follow.ahead import DecodeAhead
from aurora_store.follow.chain import BAD_COPY_ERRORS, BucketChain
from aurora_store.follow.plan import CatchUpPlan, plan_catch_up
from aurora_store.follow.prefetch import Prefetcher
from aurora_store.follow.remote import StagesRemotely
from aurora_store.follow.sources import OnRead, SegmentReader, SourcesFor
from aurora_store.follow.stage import stage_snapshot, stage_version
from aurora_store.metrics import Metrics
from aurora_store.progress import Progress
from aurora_store.store.snapshot_manifest import SnapshotManifest, read_snapshot_manifest
from aurora_store.store.snapshots import load_snapshot
from aurora_store.store.transfer import fetch_segments
from aurora_store.store.versions import DeltaStore

log = logging.getLogger("aurora.follow")

#: Checks a manifest before anything it names is used (signature, run): raises to refuse it.
Verify = Callable[[DeltaManifest | SnapshotManifest], None]
#: Told of each decision worth a run-log line: ``(kind, fields)`` — ``catch_up``, ``catch_up_blocked``.
OnEvent = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Step:
    """One thing to stage: delta ``version`` (on ``version - 1``), or the full snapshot ``version``; from the
    source bucket when the current one offered no path to it."""

    version: int
    snapshot: bool = False
    from_source: bool = False


@dataclass(frozen=True)
class Bootstrap:
    """A snapshot downloaded for an engine to load (``model_dir``), and the plan to its goal."""

    store: DeltaStore
    plan: CatchUpPlan
    layout: ModelLayout
    manifest: SnapshotManifest
    model_dir: Path


@dataclass(frozen=True)
class FollowReport:
    """What :meth:`Follower.follow_to` did."""

    goal: int
    kind: Literal["none", "replay", "snapshot"]
    steps: tuple[Step, ...]
    store: str
    stage_s: float
    activate_s: float


class Follower:
    """Keeps one :class:`~aurora_store.codec.target.WeightTarget` on a run (see the module doc).

    ``sources_for(store)`` names the segment sources to try before ``store`` (a relay's cache); ``on_read`` is
    told of each segment read and what served it. ``prefetcher`` (optional) holds segments announced before
    their manifest; with it the follower also decodes the next version's segments ahead against the active
    weights. ``on_bytes`` is told of every byte downloaded (segments, prefetched or not, snapshots, manifests).
    """

    def __init__(self, chain: BucketChain, *, verify: Verify | None = None, streams: int | None = None,
                 sources_for: SourcesFor | None = None, on_read: OnRead | None = None,
                 prefetcher: Prefetcher | None = None,
                 metrics: Metrics | None = None, on_event: OnEvent | None = None,
                 on_bytes: Callable[[int], None] | None = None, progress: bool = False) -> None:
        self.chain = chain
        self.progress = progress  # a progress bar per version on an interactive terminal
        self.verify = verify
        self.streams = streams or chain.regional.settings.streams
        self._on_read = on_read
        self.reader = SegmentReader(sources_for, self._read)
        self.prefetcher = prefetcher
        self.metrics = metrics
        self._on_event = on_event
        self._on_bytes = on_bytes
        self._target: WeightTarget | None = None
        self.ahead: DecodeAhead | None = None
        self.decoded_ahead = 0  # segments the last staging found decoded already
        self.held_remotely: int | None = None  # the version the target staged on its own side, if any
        # (bucket, kind, version) → download bytes of a verified manifest; None: refused (never planned on)
        self._sizes: dict[tuple[str, str, int], int | None] = {}
        self.refused_manifests = 0  # manifests kept out of plans (unsigned, mis-signed, foreign run, corrupt)
        self._refusals: dict[tuple[str, str, int], str] = {}  # why each refused manifest was refused
        self._planned: tuple[int, int] | None = None  # (active version, goal) of the last catch-up decision
        self._blocked: int | None = None  # active version at which no catch-up path was found (said once)

    # --- the target --------------------------------------------------------------------------------

    @property
    def target(self) -> WeightTarget:
        if self._target is None:
            raise AuroraError("the follower has no target yet: attach one first")
        return self._target

    @property
    def attached(self) -> bool:
        return self._target is not None

    def bootstrap(self, store: DeltaStore, goal: int, download_dir: Path) -> Bootstrap:
        """Plan from nothing to ``goal`` (a snapshot, then deltas) and download that snapshot's files into
        ``download_dir`` for an engine to load; its signed manifest is verified first."""
        snapshots = self._sizes_of(store, "snapshot", [s for s in store.snapshot_versions() if s <= goal])
        plan = plan_catch_up(None, goal, self._sizes_of(store, "delta", [v for v in store.versions() if v <= goal]),
                             snapshots)
        assert plan.snapshot is not None  # from nothing, every plan starts at a snapshot
        snapshot = read_snapshot_manifest(store, plan.snapshot)
        if self.verify is not None:
            self.verify(snapshot)
        layout = store.layout(snapshot.layout_fingerprint)  # checked against the signed fingerprint
        model_dir = download_dir / f"snapshot-{plan.snapshot}"
        _, manifest = load_snapshot(store, plan.snapshot, layout, download_dir=model_dir,
                                    verify_manifest=self.verify)
        self._count(manifest.total_bytes)
        return Bootstrap(store, plan, layout, manifest, model_dir)

    def attach(self, target: WeightTarget, boot: Bootstrap | None = None) -> None:
        """Follow the run onto ``target``. After :meth:`bootstrap`: the target holds the snapshot's weights
        (checked from scratch against its digest), then the plan's deltas are replayed onto it. Without: the
        target already declares its version and digest."""
        self._target = target
        codec = None
        if boot is not None:
            target.version = boot.plan.snapshot
            target.digest = WeightsDigest.parse(boot.manifest.weights_digest)
            if target.full_digest() != target.digest:
                raise DigestMismatchError("the engine's weights differ from the snapshot it loaded")
            for version in boot.plan.deltas:
                staged = self._stage_delta(boot.store, version)
                self._write(staged)
                codec = staged.manifest.codec
        if self.prefetcher is not None and target.version is not None:
            self.prefetcher.retire(target.version)  # its window of versions starts after the active one
        if self.prefetcher is not None and self.ahead is None:  # decode-ahead needs the run's verified codec
            store = boot.store if boot is not None else self.chain.store()
            self.ahead = DecodeAhead(target, self.prefetcher, self.prefetcher.metrics,
                                     codec or self._codec_of(store, target.version))

    def _codec_of(self, store: DeltaStore, version: int | None) -> CodecParams | None:
        """The codec of ``version``'s verified delta manifest, if the bucket still has one."""
        if version is None or version < 1:
            return None
        try:
            manifest = store.manifest(version)
            if self.verify is not None:
                self.verify(manifest)
        except AuroraError as exc:
            log.info("no codec for decode-ahead yet", extra={"error": str(exc)})
            return None
        return manifest.codec

    # --- announcements ------------------------------------------------------------------------------

    def offer(self, version: int, ref: SegmentRef) -> bool:
        """A segment of ``version`` was announced: prefetch it if the version is newer than the active one."""
        if self.prefetcher is None or self._target is None or version <= (self._target.version or -1):
            return False
        store = self.chain.store()
        return self.prefetcher.offer(version, ref, lambda r: self.reader.read(store, r))

    # --- deciding what to stage ---------------------------------------------------------------------

    def next_step(self, want: int, cause: Literal["next", "behind", "missing"], *,
                  ceiling: int | None = None) -> Step | None:
        """What to stage next on the way to the bucket's newest version, ``want`` being the active version + 1:
        the delta ``want`` when it is next and present (``cause="next"``), else the cheapest path by bytes
        (``behind``: the bucket is further ahead; ``missing``: the last attempt found ``want`` absent — still
        copying, or removed by a gc). ``None``: nothing reachable yet, look again later.

        ``ceiling``: the newest version the caller may activate now (an actor: the committed one). A catch-up
        then plans to it, not past it: a snapshot newer than the ceiling could not be activated yet, and the
        caller would wait on an old version for it, on no version the run is working on (a trainer dispatching
        on the committed version would find nobody eligible)."""
        if cause == "next":
            return Step(want)
        try:
            plan, from_source = self._plan(cause, ceiling)
        except VersionNotFoundError as exc:
            # Neither the chain nor a snapshot reaches the bucket's newest version from here (yet): wait.
            current = self.target.version
            if self._blocked != current:  # said once per active version, not every retry
                self._blocked = current
                log.warning("no catch-up path", extra={"error": str(exc), "version": current})
                self._event("catch_up_blocked", version=current, cause=cause, error=str(exc)[:200])
            return None
        if plan is not None and plan.kind == "snapshot" and plan.snapshot is not None:
            return Step(plan.snapshot, snapshot=True, from_source=from_source)
        if plan is None and cause == "missing":
            return None  # not in this bucket yet (relay still copying)
        return Step(want, from_source=from_source)

    def plan(self, cause: str, *, ceiling: int | None = None) -> CatchUpPlan | None:
        """Replay or snapshot, by bytes, from the active version to the newest verified version the current
        bucket holds (or, when it offers no path there, the source bucket), but not past ``ceiling`` when that
        is ahead of the active version (see :meth:`next_step`). ``None`` when there is nothing to decide (not
        behind, or the next version is not there yet, or decided already). Raises
        :class:`VersionNotFoundError` when no snapshot or delta chain reaches it."""
        return self._plan(cause, ceiling)[0]

    def _plan(self, cause: str, ceiling: int | None) -> tuple[CatchUpPlan | None, bool]:
        """:meth:`plan`, and whether it is a plan in the source bucket."""
        store = self.chain.store()
        try:
            return self._plan_in(store, cause, ceiling), False
        except VersionNotFoundError as exc:
            source = self.chain.source
            if source is None or source is store:
                raise
            log.warning("no catch-up path in %s; planning from the source bucket", store.url,
                        extra={"error": str(exc)[:300]})
            return self._plan_in(source, cause, ceiling), True

    def _plan_in(self, store: DeltaStore, cause: str, ceiling: int | None) -> CatchUpPlan | None:
        current = self.target.version
        if current is None:
            raise VersionNotFoundError("the target declares no version: nothing to plan from")
        deltas = self._sizes_of(store, "delta", store.versions(after=current))
        snapshots = self._sizes_of(store, "snapshot", [s for s in store.snapshot_versions() if s > current])
        goal = max(list(deltas)[-1:] + list(snapshots)[-1:], default=None)
        if goal is not None and ceiling is not None:
            goal = min(goal, max(ceiling, current + 1))  # the next version is always worth staging
        if goal is None or goal <= current + (1 if cause == "behind" else 0):
            return None
        if self._planned == (current, goal) and cause == "behind":
            return None  # decided already; the caller is carrying it out
        with self._explained(store, goal):
            plan = plan_catch_up(current, goal, {v: n for v, n in deltas.items() if v <= goal},
                                 {s: n for s, n in snapshots.items() if s <= goal})
        self._planned = (current, goal)
        if self.metrics is not None:
            self.metrics.catch_up.labels(plan.kind, cause).inc()
        self._event("catch_up", version=current, goal=goal, cause=cause, path=plan.kind, snapshot=plan.snapshot,
                    deltas=len(plan.deltas), bytes=plan.bytes, replay_bytes=plan.replay_bytes, bucket=store.url)
        log.info("catch-up from %d to %d: %s", current, goal, plan.kind,
                 extra={"cause": cause, "snapshot": plan.snapshot, "bytes": plan.bytes,
                        "replay_bytes": plan.replay_bytes})
        return plan

    def _sizes_of(self, store: DeltaStore, kind: str, versions: Sequence[int]) -> dict[int, int]:
        """Download bytes of each of ``versions`` whose manifest passes the verifier, in ascending order."""
        sizes = {v: self._size(store, kind, v) for v in sorted(versions)}
        return {v: n for v, n in sizes.items() if n is not None}

    @contextlib.contextmanager
    def _explained(self, store: DeltaStore, goal: int) -> Iterator[None]:
        """A missing path that refused manifests would have made says so: which, and why (a foreign run's or a
        mis-signed version reads as such, not as a gap)."""
        try:
            yield
        except VersionNotFoundError as exc:
            why = [reason for (url, _, version), reason in sorted(self._refusals.items())
                   if url == store.url and version <= goal]
            if not why:
                raise
            raise VersionNotFoundError(f"{exc}; refused manifests: {'; '.join(why)}"[:2000]) from exc

    def _size(self, store: DeltaStore, kind: str, version: int) -> int | None:
        """Download bytes of a delta or snapshot, or ``None`` when its manifest does not pass the verifier
        (manifests are immutable: read and verified once)."""
        key = (store.url, kind, version)
        if key not in self._sizes:
            manifest: DeltaManifest | SnapshotManifest
            try:
                manifest = store.manifest(version) if kind == "delta" else read_snapshot_manifest(store, version)
                if self.verify is not None:
                    self.verify(manifest)
            except VersionNotFoundError:
                raise  # listed, then gone (a gc): not a verdict on the manifest
            except BAD_COPY_ERRORS as exc:
                self.refused_manifests += 1
                self._refusals[key] = f"{kind} {version}: {exc}"
                log.warning("%s manifest of version %d in %s refused; not planned on", kind, version, store.url,
                            extra={"error": str(exc)[:300], "kind": type(exc).__name__})
                self._sizes[key] = None
                return None
            self._sizes[key] = (manifest.segment_bytes + len(manifest.to_bytes())
                                if isinstance(manifest, DeltaManifest) else manifest.total_bytes)
        return self._sizes[key]

    # --- staging and activation ---------------------------------------------------------------------

    def stage(self, step: Step, *, full_sync: bool = False) -> Staged:
        """Stage ``step`` from the current bucket (no writes); a bad copy there is re-read from the source
        bucket. ``full_sync``: stage the delta's version from its full snapshot instead (the full-broadcast
        baseline)."""
        snapshot = step.snapshot or full_sync
        if step.from_source and self.chain.source is not None:
            return self._stage_from(self.chain.source, step.version, snapshot, remote=True)
        return self.chain.read(step.version,
                               lambda store: self._stage_from(store, step.version, snapshot, remote=True))

    def _stage_from(self, store: DeltaStore, version: int, snapshot: bool, *, remote: bool = False) -> Staged:
        self.decoded_ahead = 0
        if snapshot:
            staged = stage_snapshot(store, version, self.target, streams=self.streams, verify_manifest=self.verify)
            self._count(staged.snapshot_bytes)
            return staged
        delta = self._stage_delta(store, version)
        if remote:
            self._stage_remotely(delta, store)
        return delta

    def _stage_remotely(self, staged: StagedDelta, store: DeltaStore) -> None:
        """Ask a target that stages on its own side (:class:`~aurora_store.follow.remote.StagesRemotely`) to
        stage the version just verified here, from the same bucket; if it cannot, activation pushes the
        changes instead (never a failed staging: this copy is verified)."""
        target = self.target
        self.held_remotely = None
        if not isinstance(target, StagesRemotely):
            return
        try:
            if target.stage_remote(staged.manifest, store, self.reader.sources(store)):
                self.held_remotely = staged.version
        except AuroraError as exc:
            log.warning("the engine could not stage version %d itself; it will be pushed", staged.version,
                        extra={"error": str(exc)[:500], "kind": type(exc).__name__})

    def _stage_delta(self, store: DeltaStore, version: int) -> StagedDelta:
        def segments(v: int, refs: Sequence[SegmentRef]) -> Iterator[tuple[SegmentRef, bytes]]:
            bar = Progress(sum(ref.size for ref in refs), f"v{v}", interactive=None if self.progress else False)
            with bar:
                yield from fetch_segments(store, refs, streams=self.streams, held=self.prefetcher, version=v,
                                          read=lambda ref: self.reader.read(store, ref), progress=bar)

        ahead = self.ahead
        staged = stage_version(store, version, self.target, verify_manifest=self.verify, fetch=segments,
                               decode=ahead.stage if ahead is not None else None)
        self.decoded_ahead = ahead.last_decoded_ahead if ahead is not None else 0
        self._count(len(staged.manifest.to_bytes()))
        return staged

    def activate(self, staged: Staged) -> bool:
        """Write ``staged`` into the target in place — only if the target is at its base (``False``
        otherwise: the caller drops it). Waits for decodes against the old weights and drops them."""
        target = self.target
        if staged.base_version != target.version:
            return False
        self._write(staged)
        if self.prefetcher is not None:
            self.prefetcher.retire(staged.version)
        return True

    def _write(self, staged: Staged) -> None:
        target = self.target
        with self.ahead.writing() if self.ahead is not None else contextlib.nullcontext():
            try:
                # Held by the engine's own processes: one small call writes it there; else push the changes.
                held = (isinstance(target, StagesRemotely) and isinstance(staged, StagedDelta)
                        and self.held_remotely == staged.version and target.activate_held(staged))
                if not held:
                    activate(staged, target)
            except AuroraError:
                target.version = None  # the writes' outcome is unknown: no delta applies to unknown weights
                raise
        if self.ahead is not None:  # before the next staging can start on the new base
            self.ahead.resume()

    def follow_to(self, goal: int, *, store: DeltaStore | None = None, snapshots: bool = True) -> FollowReport:
        """Bring the target to ``goal`` now: plan by bytes from its version (``snapshots=False``: deltas
        only), then stage and activate each step in order, from ``store`` (default: the chain's current
        bucket; a bad copy there is re-read from the source)."""
        source = store or self.chain.store()
        current = self.target.version
        sizes = self._sizes_of(source, "snapshot", [s for s in source.snapshot_versions() if s <= goal]) \
            if snapshots else {}
        deltas = self._sizes_of(source, "delta", [
            v for v in source.versions() if v <= goal and (current is None or v > current)])
        with self._explained(source, goal):
            plan = plan_catch_up(current, goal, deltas, sizes)
        steps = ([Step(plan.snapshot, snapshot=True)] if plan.snapshot is not None else [])
        steps += [Step(v) for v in plan.deltas]
        stage_s = activate_s = 0.0
        for step in steps:
            t0 = time.perf_counter()
            if store is not None:
                staged = self._stage_from(store, step.version, step.snapshot)
            else:
                staged = self.stage(step)
            t1 = time.perf_counter()
            if not self.activate(staged):
                raise BaseVersionMismatchError(f"version {staged.version} is not based on the target's "
                                           f"{self.target.version}")
            stage_s += t1 - t0
            activate_s += time.perf_counter() - t1
        return FollowReport(goal, plan.kind, tuple(steps), source.url, stage_s, activate_s)

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()

    def _event(self, kind: str, **fields: Any) -> None:
        if self._on_event is not None:
            self._on_event(kind, fields)

    def _read(self, label: str, nbytes: int) -> None:
        self._count(nbytes)
        if self._on_read is not None:
            self._on_read(label, nbytes)

    def _count(self, nbytes: int) -> None:
        if self._on_bytes is not None:
            self._on_bytes(nbytes)
