"""A benchmark worker that runs *inside* a region's namespace and takes commands from the orchestrator.

``python -m benchmarks.wan_bench.agent`` reads one JSON command per line on stdin and answers each with
one JSON line on stdout (``{"ready": true}`` first, once imports are done and the codec's kernels compiled, so
start-up never counts). Everything
it measures goes through the real library code: :class:`~aurora_store.follow.Follower` (manifest +
segments over ``S`` streams, SHA-256 checks, decode, digest; or the full snapshot, the full-weights
baseline), :class:`~aurora_store.store.publisher.VersionPublisher` (cut-through or
encode-then-upload publishing with ``segment`` / ``staged`` events on Redis, as the trainer does).

Commands (``op`` plus arguments):

* ``load`` — ``config``, ``state_file``, ``version``, ``digest``: hold those weights as the target (and the base
  state for publishing).
* ``load_new`` — ``state_file``: the new weights a ``publish`` encodes against the loaded base.
* ``deliver`` — ``url``, ``mode`` (``delta``/``full``), ``version``, ``streams``: stage the version against the
  target (no writes) and time it.
* ``watch`` — ``redis``, ``run``, ``region``: remember the region's event-stream position.
* ``await_stage`` — ``version``, ``url``, ``streams``, ``timeout``: block until a ``staged`` event for the version
  arrives on the watched stream, then stage it from ``url``; answers wall-clock times.
* ``follow`` — ``version``, ``url``, ``streams``, ``prefetch``, ``cache_token``, ``segment_bytes``, ``timeout``: an
  actor of the watched region until the version is staged. With ``prefetch`` (watch with ``home``): each segment
  announced on the home stream is read as soon as the region has it — from the relay's hot cache when the relay
  serves one (its state names a ``cache_url``), else from the regional bucket once the relay has written it —
  and decoded ahead (the follower's :class:`~aurora_store.follow.Prefetcher` and
  :class:`~aurora_store.follow.DecodeAhead`), so the ``staged`` event only fetches what is missing and checks.
  Without: wait for ``staged``, then fetch and stage everything.
  Answers wall-clock times and where each segment was read from.
* ``publish`` — ``url``, ``redis``, ``run``, ``region``, ``version``, ``base_version``, ``cut_through``,
  ``streams``, ``segment_bytes``: publish the loaded base → new delta like the trainer does.

Each ``deliver`` / ``await_stage`` / ``publish`` opens a new S3 client, so its TCP connections (handshake, slow
start) are part of what is timed. The client is one shared, thread-safe boto3 client handed to
:class:`~aurora_store.store.s3.S3Bucket` rather than one per transfer thread: building boto3 clients in parallel
threads takes seconds on a busy 2-core machine and would swamp the transfer being measured.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, TextIO
from urllib.parse import parse_qs, urlparse

from aurora_store.config import TransferSettings


def open_store(url: str, streams: int):
    """A :class:`DeltaStore` for ``url`` with ``streams`` transfer streams and a fresh S3 client (see above)."""
    from aurora_store.store import DeltaStore, open_bucket

    settings = TransferSettings(streams=streams)
    parsed = urlparse(url)
    if parsed.scheme != "s3":
        return DeltaStore(open_bucket(url, settings=settings), settings)
    import boto3
    from botocore.config import Config

    from aurora_store.store.s3 import S3Bucket

    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    client = boto3.session.Session().client(
        "s3", endpoint_url=query.get("endpoint_url"), region_name=query.get("region") or "us-east-1",
        config=Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=max(10, 2 * streams),
                      connect_timeout=settings.connect_timeout_s, read_timeout=settings.read_timeout_s))
    bucket = S3Bucket(parsed.netloc, parsed.path, endpoint_url=query.get("endpoint_url"), settings=settings,
                      check=False, client=client)
    return DeltaStore(bucket, settings)


class Agent:
    def __init__(self) -> None:
        self.layout = None
        self.state = None
        self.new_state = None
        self.target = None
        self.version: int | None = None
        self.digest: str | None = None
        self.plane = None
        self.region: str | None = None
        self.cursor: str | None = None
        self.home: str | None = None
        self.home_cursor: str | None = None

    # --- commands --------------------------------------------------------------------------------

    def load(self, config: dict[str, Any], state_file: str, version: int, digest: str) -> dict[str, Any]:
        from safetensors.torch import load_file

        from aurora_store.codec import ModelLayout, TensorTarget, WeightsDigest

        started = time.perf_counter()
        self.layout = ModelLayout.from_config(config)
        self.state = self.target = None
        self.state = load_file(state_file)
        self.target = TensorTarget.from_state(self.layout, self.state, version=version,
                                              digest=WeightsDigest.parse(digest))
        self.version, self.digest = version, digest
        return {"load_s": time.perf_counter() - started}

    def load_new(self, state_file: str) -> dict[str, Any]:
        from safetensors.torch import load_file

        self.new_state = None
        self.new_state = load_file(state_file)
        return {}

    def deliver(self, url: str, mode: str, version: int, streams: int) -> dict[str, Any]:
        from aurora_store.follow import Step

        store = open_store(url, streams)
        arrivals: list[float] = []
        downloaded = [0]
        follower = self._follower(store, streams, on_read=lambda _label, _n: arrivals.append(time.perf_counter()),
                                  on_bytes=lambda n: downloaded.__setitem__(0, downloaded[0] + n))
        started = time.perf_counter()
        if mode not in ("delta", "full"):
            raise ValueError(f"unknown mode {mode!r}")
        staged = follower.stage(Step(version, snapshot=mode == "full"))
        changed = staged.manifest.changed_total if mode == "delta" else staged.changed  # type: ignore[union-attr]
        total = time.perf_counter() - started
        store.close()
        return {"seconds": total, "fetch_s": (arrivals[-1] - started) if arrivals else None,
                "bytes": downloaded[0], "changed": changed, "streams": streams, "mode": mode}

    def _follower(self, store, streams: int, *, sources=(), prefetcher=None, on_read=None, on_bytes=None):
        """The library's follower over one store, on this agent's target (what an actor runs)."""
        from aurora_store.follow import BucketChain, Follower

        follower = Follower(BucketChain(store), streams=streams, sources_for=lambda _store: sources,
                            prefetcher=prefetcher, on_read=on_read, on_bytes=on_bytes)
        follower.attach(self.target)
        return follower

    def watch(self, redis: str, run: str, region: str, home: str | None = None) -> dict[str, Any]:
        from aurora_store.bus import ControlPlane

        if self.plane is not None:
            self.plane.close()
        self.plane = ControlPlane(redis, run)
        self.region = region
        self.cursor = self.plane.latest_event_id(region)
        self.home = home
        self.home_cursor = self.plane.latest_event_id(home) if home else None
        return {"cursor": self.cursor}

    def follow(self, version: int, url: str, streams: int, prefetch: bool, cache_token: str | None = None,
               segment_bytes: int | None = None, timeout: float = 600.0) -> dict[str, Any]:

        from aurora_store.codec import CodecParams
        from aurora_store.codec.manifest import SegmentRef
        from aurora_store.follow import Prefetcher, RelayCache, Step
        from aurora_store.metrics import Metrics

        store = open_store(url, streams)  # made before the clock starts, like an actor's long-lived store
        deadline = time.monotonic() + timeout
        metrics = Metrics("actor", "wan-bench", self.region or "")
        cache_url = None
        if prefetch:
            relay = self.plane.relay(self.region)
            cache_url = getattr(relay, "cache_url", None) if relay is not None else None
        staging = [False]
        cache = RelayCache(cache_url, cache_token or "", metrics, 10.0) if cache_url else None
        reader = _CopiedSoon(store, cache, deadline, staging)

        # the actor's own prefetch and decode-ahead: each prefetched segment is decoded and hashed against the
        # base as it arrives (the run's codec parameters; the manifest re-checks everything), so the manifest
        # leaves only the checks. The budget is not what is measured here: everything the version moves fits.
        prefetcher = Prefetcher(streams, 1 << 40, metrics)
        follower = self._follower(store, streams, sources=[reader], prefetcher=prefetcher)
        assert follower.ahead is not None
        follower.ahead.codec = CodecParams(segment_bytes=segment_bytes or CodecParams().segment_bytes)
        held: set[str] = set()
        event_at = None
        cursors = {self.region: self.cursor}
        if prefetch and self.home:
            cursors[self.home] = self.home_cursor
        while event_at is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no staged event for version {version} in {self.region} after {timeout:.0f}s")
            for region, entry_id, event in self.plane.read_events(cursors, block_ms=200):
                cursors[region] = entry_id
                if region == self.region and event.kind == "staged" and event.version >= version:
                    event_at = time.time()
                elif (region == self.home and region != self.region and event.kind == "segment"
                      and event.version == version and event.segment and event.size is not None
                      and event.segment not in held):
                    held.add(event.segment)
                    follower.offer(version, SegmentRef(event.segment, event.size, ()))
        self.cursor = cursors[self.region]
        if self.home in cursors:
            self.home_cursor = cursors[self.home]
        staging[0] = True
        started = time.perf_counter()
        staged = follower.stage(Step(version))
        stage_s = time.perf_counter() - started
        follower.close()
        store.close()
        return {"t_event": event_at, "t_staged": time.time(), "stage_s": stage_s,
                "bytes": staged.manifest.segment_bytes + len(staged.manifest.to_bytes()),
                "announced": len(held), "segments": len(staged.manifest.segments), "cache_url": cache_url,
                "decoded_ahead": follower.decoded_ahead, "reads": dict(reader.reads),
                "prefetch_arrivals": sorted(reader.arrivals)}

    def await_stage(self, version: int, url: str, streams: int, timeout: float = 600.0) -> dict[str, Any]:
        from aurora_store.follow import Step

        store = open_store(url, streams)  # made before the clock starts, like an actor's long-lived store
        follower = self._follower(store, streams)
        deadline = time.monotonic() + timeout
        event_at = None
        while event_at is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no staged event for version {version} in {self.region} after {timeout:.0f}s")
            for _, entry_id, event in self.plane.read_events({self.region: self.cursor}, block_ms=200):
                self.cursor = entry_id
                if event.kind == "staged" and event.version >= version:
                    event_at = time.time()
        started = time.perf_counter()
        staged = follower.stage(Step(version))
        stage_s = time.perf_counter() - started
        store.close()
        return {"t_event": event_at, "t_staged": time.time(), "stage_s": stage_s,
                "bytes": staged.manifest.segment_bytes + len(staged.manifest.to_bytes())}

    def publish(self, url: str, redis: str, run: str, region: str, version: int, base_version: int,
                cut_through: bool, streams: int, segment_bytes: int) -> dict[str, Any]:
        from aurora_store.bus import ControlPlane, VersionEvent
        from aurora_store.codec import CodecParams, WeightsDigest, pieces_from_states
        from aurora_store.store import object_names
        from aurora_store.store.publisher import VersionPublisher

        store = open_store(url, streams)
        plane = ControlPlane(redis, run)
        publisher = VersionPublisher(store, self.layout, CodecParams(segment_bytes=segment_bytes), streams,
                                     producer={"run": run, "process": "wan-bench"})

        def announce(ref) -> None:
            plane.announce(VersionEvent("segment", version, region, segment=ref.digest, size=ref.size))

        t_start = time.time()
        report = publisher.publish(version, base_version, WeightsDigest.parse(self.digest),
                                   pieces_from_states(self.layout, self.state, self.new_state),
                                   on_segment=announce, cut_through=cut_through)
        t_manifest = time.time()
        plane.announce(VersionEvent("staged", version, region, base=base_version,
                                    manifest_key=object_names.delta(version),
                                    weights_digest=report.manifest.weights_digest, sent_ms=plane.now_ms()))
        t_end = time.time()
        plane.close()
        store.close()
        return {"t_start": t_start, "t_manifest": t_manifest, "t_end": t_end, "encode_s": report.encode_s,
                "upload_s": report.upload_s, "publish_s": report.total_s, "first_segment_s": report.first_segment_s,
                "segments": report.segments, "bytes": report.total_bytes, "segment_bytes": report.segment_bytes,
                "cut_through": cut_through}

    # --- loop ------------------------------------------------------------------------------------

    def serve(self, commands: TextIO, replies: TextIO) -> int:
        ops = {"load": self.load, "load_new": self.load_new, "deliver": self.deliver, "watch": self.watch,
               "await_stage": self.await_stage, "follow": self.follow, "publish": self.publish}
        from aurora_store.codec.warm import warm_kernels

        warm_kernels()  # compiling the codec's kernels is start-up too (on a fresh checkout: seconds)
        _reply(replies, {"ready": True, "pid": os.getpid()})
        for line in commands:
            if not line.strip():
                continue
            try:
                command = json.loads(line)
                op = command.pop("op")
                if op == "quit":
                    break
                result = ops[op](**command)
                _reply(replies, {"ok": True, **result})
            except Exception as exc:  # reported to the orchestrator, which decides
                _reply(replies, {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                 "traceback": traceback.format_exc()[-4000:]})
        return 0


class _CopiedSoon:
    """A segment source for a segment announced at home and maybe not in the region yet: it asks the relay's
    hot cache and the regional bucket in turn until one has it (the relay is copying it) or the deadline passes,
    counting what served each read and when each prefetched one arrived."""

    label = "relay_cache|bucket"

    def __init__(self, store, cache, deadline: float, staging: list[bool]) -> None:
        import threading
        from collections import Counter

        self.store, self.cache, self.deadline, self.staging = store, cache, deadline, staging
        self.reads: Counter[str] = Counter()  # "relay_cache" / "bucket"
        self.arrivals: list[float] = []  # wall clock of each prefetched segment's arrival
        self._lock = threading.Lock()

    def get(self, ref) -> bytes | None:
        from aurora_store.errors import ObjectNotFoundError

        wait = 0.02
        while time.monotonic() <= self.deadline:
            data, source = (self.cache.get(ref), "relay_cache") if self.cache is not None else (None, "")
            if data is None:
                source = "bucket"
                try:
                    data = self.store.get_segment(ref)
                except ObjectNotFoundError:
                    time.sleep(wait)
                    wait = min(0.2, wait * 1.5)
                    continue
            with self._lock:
                self.reads[source] += 1
                if not self.staging[0]:
                    self.arrivals.append(time.time())
            return data
        return None


def _reply(stream: TextIO, doc: dict[str, Any]) -> None:
    stream.write(json.dumps(doc) + "\n")
    stream.flush()


def main() -> int:
    # The protocol owns the real stdout; anything else that prints (libraries, warnings) goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    import torch  # noqa: F401  (import cost before "ready")

    from aurora_store import follow  # noqa: F401

    return Agent().serve(sys.stdin, replies)


if __name__ == "__main__":
    sys.exit(main())
