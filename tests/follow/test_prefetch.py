"""Cut-through on the actor's side, with a real bucket and a real relay cache endpoint: segments fetched
before the manifest exists are staged without being downloaded again, segments the manifest does not name
are dropped (and counted), and wrong bytes from the cache are refused for the bucket's."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from aurora_store.codec import CodecParams, ModelLayout, TensorTarget, digest_state, pieces_from_states
from aurora_store.codec.manifest import SegmentRef
from aurora_store.follow import Prefetcher, RelayCache, SegmentReader
from aurora_store.follow.stage import stage_version
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from tests.follow.helpers import staging_fetcher
from workers.relay.relay import SegmentCache
from workers.relay.serve import CacheServer

LAYOUT = ModelLayout.from_config(TINY_QWEN3)
TOKEN = "run-token"


class CountingReads:
    """A follower's read chain (relay cache, then bucket), counting what each source served."""

    def __init__(self, store: DeltaStore, cache: RelayCache | None = None) -> None:
        self.store = store
        self.served: dict[str, int] = {"relay_cache": 0, "bucket": 0}
        self.reader = SegmentReader(lambda _store: [cache] if cache is not None else [], self._served)

    def _served(self, label: str, _nbytes: int) -> None:
        self.served[label] += 1

    def __call__(self, ref: SegmentRef) -> bytes:
        return self.reader.read(self.store, ref)


@pytest.fixture()
def unpublished(tmp_path):
    """Version 1's segments are durable in the bucket; its manifest is not written yet."""
    store = DeltaStore(open_bucket(str(tmp_path / "bucket"), create=True))
    old = random_state(LAYOUT, 3)
    new = perturb(old, 0.05, 4)
    publisher = VersionPublisher(store, LAYOUT, CodecParams(segment_bytes=4096), producer={"run": "t"},
                                 record_history=False)
    part, _ = publisher.upload_part(pieces_from_states(LAYOUT, old, new))
    assert len(part.segments) >= 3
    return store, publisher, part, old


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_prefetched_segments_are_staged_without_a_second_download(unpublished):
    store, publisher, part, old = unpublished
    metrics = Metrics("actor", "t")
    prefetcher = Prefetcher(streams=2, budget_bytes=1 << 30, metrics=metrics)
    reads = CountingReads(store)
    stray = os.urandom(3000)  # announced for version 1, never named by its manifest
    stray_ref = SegmentRef(hashlib.sha256(stray).hexdigest(), len(stray), ())
    store.put_segment(stray_ref, stray)
    for ref in (*part.segments, stray_ref):
        assert prefetcher.offer(1, ref, reads)
    assert not prefetcher.offer(1, part.segments[0], reads), "a segment announced twice is fetched twice"
    total = sum(ref.size for ref in part.segments) + stray_ref.size
    wait_until(lambda: prefetcher.held_bytes() == total)
    assert not store.versions(), "the manifest existed before the prefetch: nothing was tested"
    manifest = publisher.publish_parts(1, 0, digest_state(LAYOUT, old), [part]).manifest
    for ref in (*part.segments, stray_ref):  # the bucket no longer has them: staging cannot download them
        store.bucket.delete(object_names.segment(ref.digest))
    fetched_before = dict(reads.served)
    target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in old.items()}, version=0)
    staged = stage_version(store, 1, target, fetch=staging_fetcher(reads.store, 2, prefetcher, read=reads))
    assert staged.weights_digest == manifest.weights_digest
    assert reads.served == fetched_before == {"relay_cache": 0, "bucket": len(part.segments) + 1}
    assert prefetcher.used_bytes == manifest.segment_bytes
    assert prefetcher.dropped_bytes == stray_ref.size == metrics.prefetch_dropped_bytes._value.get()
    assert metrics.prefetched_bytes._value.get() == total and prefetcher.held_bytes() == 0
    assert metrics.segment_reads.labels("prefetched")._value.get() == len(part.segments)


def test_a_reader_that_missed_the_announcements_stages_from_the_bucket(unpublished):
    store, publisher, part, old = unpublished
    prefetcher = Prefetcher(streams=2, budget_bytes=1 << 30, metrics=Metrics("actor", "t"))
    prefetcher.offer(1, part.segments[0], CountingReads(store))  # it saw one announcement of several
    wait_until(lambda: prefetcher.held_bytes() == part.segments[0].size)
    manifest = publisher.publish_parts(1, 0, digest_state(LAYOUT, old), [part]).manifest
    reads = CountingReads(store)
    target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in old.items()}, version=0)
    staged = stage_version(store, 1, target, fetch=staging_fetcher(reads.store, 2, prefetcher, read=reads))
    assert staged.weights_digest == manifest.weights_digest
    assert reads.served["bucket"] == len(part.segments) - 1 and prefetcher.used_bytes == part.segments[0].size


def test_over_the_budget_and_for_older_versions_nothing_is_prefetched(unpublished):
    store, _, part, _ = unpublished
    first, second = part.segments[:2]
    prefetcher = Prefetcher(streams=1, budget_bytes=first.size, metrics=Metrics("actor", "t"))
    reads = CountingReads(store)
    assert prefetcher.offer(2, first, reads)
    assert not prefetcher.offer(2, second, reads) and prefetcher.over_budget == 1
    wait_until(lambda: prefetcher.held_bytes() == first.size)
    prefetcher.retire(2)  # the actor activated version 2 meanwhile: what was held for it is dropped
    assert prefetcher.held_bytes() == 0 and prefetcher.dropped_bytes == first.size
    assert not prefetcher.offer(2, second, reads) and not prefetcher.offer(1, second, reads)
    assert prefetcher.offer(3, second, reads)  # the budget was freed


@pytest.fixture()
def relay_cache(tmp_path):
    metrics = Metrics("relay", "t")
    cache = SegmentCache(1 << 20, None, metrics)
    server = CacheServer(("127.0.0.1", 0), cache.get, TOKEN, metrics).start()
    try:
        yield cache, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def test_segments_come_from_the_relay_cache_before_the_regional_write(unpublished, tmp_path, relay_cache):
    source, _, part, _ = unpublished
    cache, url = relay_cache
    regional = DeltaStore(open_bucket(str(tmp_path / "regional"), create=True))  # the relay has not written yet
    for ref in part.segments:
        cache.put(ref.digest, source.get_segment(ref))
    metrics = Metrics("actor", "t")
    reads = CountingReads(regional, RelayCache(url, TOKEN, metrics))
    prefetcher = Prefetcher(streams=2, budget_bytes=1 << 30, metrics=metrics)
    for ref in part.segments:
        prefetcher.offer(1, ref, reads)
    wait_until(lambda: prefetcher.held_bytes() == sum(r.size for r in part.segments))
    assert reads.served == {"relay_cache": len(part.segments), "bucket": 0}
    assert metrics.relay_cache_reads.labels("hit")._value.get() == len(part.segments)
    assert cache.hits == len(part.segments)


def test_wrong_bytes_from_the_cache_are_refused_for_the_buckets(unpublished, relay_cache):
    store, publisher, part, old = unpublished
    cache, url = relay_cache
    bad, good = part.segments[0], part.segments[1]
    data = bytearray(store.get_segment(bad))
    data[len(data) // 2] ^= 0x01
    cache.put(bad.digest, bytes(data))  # one flipped bit
    cache.put(good.digest, store.get_segment(good))
    metrics = Metrics("actor", "t")
    reads = CountingReads(store, RelayCache(url, TOKEN, metrics))
    manifest = publisher.publish_parts(1, 0, digest_state(LAYOUT, old), [part]).manifest
    target = TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in old.items()}, version=0)
    staged = stage_version(store, 1, target, fetch=staging_fetcher(reads.store, 2, read=reads))
    assert staged.weights_digest == manifest.weights_digest
    assert metrics.relay_cache_reads.labels("corrupt")._value.get() == 1
    assert metrics.relay_cache_reads.labels("hit")._value.get() == 1
    assert metrics.relay_cache_reads.labels("miss")._value.get() == len(part.segments) - 2
    assert reads.served == {"relay_cache": 1, "bucket": len(part.segments) - 1}


def test_a_wrong_token_or_a_dead_cache_falls_through_to_the_bucket(unpublished, relay_cache):
    store, _, part, _ = unpublished
    cache, url = relay_cache
    ref = part.segments[0]
    cache.put(ref.digest, store.get_segment(ref))
    for client in (RelayCache(url, "not-the-token", Metrics("actor", "t")),
                   RelayCache("http://127.0.0.1:9", TOKEN, Metrics("actor", "t"), timeout_s=1.0)):
        reads = CountingReads(store, client)
        data = reads(ref)
        source = next(label for label, n in reads.served.items() if n)
        assert source == "bucket" and hashlib.sha256(data).hexdigest() == ref.digest
        assert client.metrics.relay_cache_reads.labels("error")._value.get() == 1


def test_a_closed_prefetcher_ignores_offers_and_releases_its_waiters():
    """An actor leaving on SIGTERM closes its prefetcher while its event loop may still offer segments: offers
    are then ignored (no crash of the loop), and fetches that never started are released to staging, which
    reads them itself, instead of leaving it waiting for ever."""
    import threading

    release, started = threading.Event(), threading.Event()

    def slow_read(ref: SegmentRef) -> bytes:
        started.set()
        release.wait(10)
        return b"x" * ref.size

    refs = [SegmentRef(hashlib.sha256(bytes([i])).hexdigest(), 4, ()) for i in range(3)]
    prefetcher = Prefetcher(streams=1, budget_bytes=1 << 20, metrics=Metrics("actor", "t"))
    assert all(prefetcher.offer(1, ref, slow_read) for ref in refs)  # one runs, two queue behind it
    assert started.wait(10)
    _, pending = prefetcher.claim(1, refs)
    prefetcher.close()
    assert not prefetcher.offer(2, SegmentRef("ab" * 32, 4, ()), slow_read)
    queued = [pending[ref.digest] for ref in refs[1:]]
    assert all(f.done() and f.result() is False for f in queued)  # released at once: staging reads them
    release.set()
    assert pending[refs[0].digest].result(timeout=10) is True  # the running fetch still completes


def test_fetches_that_end_before_offer_returns_leave_no_task_behind():
    """A fetch can finish on a pool thread before ``offer`` records its task; nothing of it may stay behind
    (the task map would otherwise grow by one entry per such fetch for the actor's lifetime)."""
    prefetcher = Prefetcher(streams=4, budget_bytes=1 << 30, metrics=Metrics("actor", "t"))
    try:
        refs = []
        for i in range(300):
            data = f"segment {i}".encode()
            refs.append((SegmentRef(hashlib.sha256(data).hexdigest(), len(data), ()), data))
        payload = {ref.digest: data for ref, data in refs}
        for ref, _ in refs:
            assert prefetcher.offer(1, ref, lambda r: payload[r.digest])
        wait_until(lambda: len(prefetcher.held_of(1)) == len(refs))
        assert prefetcher._tasks == {} and prefetcher._inflight == {}
    finally:
        prefetcher.close()
