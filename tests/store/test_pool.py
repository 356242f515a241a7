"""The process's long-lived transfer pool: bounded per caller, shared without deadlock, warm across versions."""

from __future__ import annotations

import threading
import time

import pytest

from aurora_store.codec import CodecParams, DeltaEncoder, ModelLayout, digest_state, pieces_from_states
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.store.pool import PoolClosedError, TransferPool, shared_pool
from aurora_store.store.transfer import fetch_segments, upload_segments
from aurora_store.testing.builders import TINY_QWEN3, perturb, publish, random_state

LAYOUT = ModelLayout.from_config(TINY_QWEN3)
PARAMS = CodecParams(segment_bytes=4096)


def chain(n: int) -> list:
    states = [random_state(LAYOUT, seed=1)]
    for i in range(n):
        states.append(perturb(states[-1], 0.02, seed=10 + i))
    return states


def test_lanes_run_at_most_limit_calls_at_once_in_submission_order():
    pool = TransferPool(workers=8)
    try:
        lanes = pool.lanes(2)
        running, peak, order = [0], [0], []
        lock = threading.Lock()

        def work(i: int) -> int:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                order.append(i)
            time.sleep(0.01)
            with lock:
                running[0] -= 1
            return i * i

        futures = [lanes.submit(work, i) for i in range(12)]
        assert [f.result(timeout=10) for f in futures] == [i * i for i in range(12)]
        assert peak[0] == 2  # eight threads free, but this caller asked for two streams
        assert order == sorted(order)
    finally:
        pool.close()


def test_work_submitted_from_pool_work_does_not_deadlock_a_saturated_pool():
    pool = TransferPool(workers=1)  # one thread: queueing the inner call behind the outer one would hang
    try:
        lanes = pool.lanes(4)

        def outer(i: int) -> int:
            return lanes.submit(lambda: i + 1).result(timeout=5)  # e.g. a fetch callback fetching more

        assert [f.result(timeout=10) for f in [lanes.submit(outer, i) for i in range(5)]] == [1, 2, 3, 4, 5]
    finally:
        pool.close()


def test_errors_reach_the_caller_and_a_closed_pool_refuses_work():
    pool = TransferPool(workers=2)
    lanes = pool.lanes(2)
    with pytest.raises(ZeroDivisionError):
        lanes.submit(lambda: 1 // 0).result(timeout=5)
    assert lanes.submit(lambda: 7).result(timeout=5) == 7  # a failed call does not kill its lane
    pool.close()
    with pytest.raises(PoolClosedError):
        lanes.submit(lambda: 1)


def test_one_pool_and_one_client_serve_every_version(s3_bucket_url):
    """Versions after the first reuse the same threads and the same S3 client (hence its open connections),
    where a pool per call started new threads — and, with a client per thread, new connections — each time."""
    store = DeltaStore(open_bucket(s3_bucket_url, create=True))
    states = chain(3)
    threads: list[set[int]] = []
    clients: set[int] = set()

    def on_segment(_ref) -> None:  # runs on the thread that uploaded the segment
        threads[-1].add(threading.get_ident())
        clients.add(id(store.bucket.client))

    for v in (1, 2, 3):
        threads.append(set())
        report = upload_segments(store, DeltaEncoder(LAYOUT, PARAMS),
                                 pieces_from_states(LAYOUT, states[v - 1], states[v]),
                                 streams=2, on_segment=on_segment)
        assert report.refs
        assert len(list(fetch_segments(store, report.refs, streams=2))) == len(report.refs)
        clients.add(id(store.bucket.client))
    pool_threads = set(t.ident for t in threading.enumerate() if t.name.startswith("aurora-xfer"))
    assert all(seen <= pool_threads for seen in threads)  # every upload ran on the shared pool's threads
    assert len(clients) == 1
    assert len(pool_threads) <= shared_pool().workers


def test_a_publish_fails_fast_and_leaves_the_shared_pool_usable(s3_bucket_url):
    store = DeltaStore(open_bucket(s3_bucket_url, create=True))
    states = chain(2)

    def boom(_ref) -> None:
        raise OSError("announce failed")

    with pytest.raises(OSError, match="announce failed"):
        upload_segments(store, DeltaEncoder(LAYOUT, PARAMS),
                        pieces_from_states(LAYOUT, states[0], states[1]), streams=2,
                        on_segment=boom)
    assert publish(store, LAYOUT, states[0], states[1], 1, digest_state(LAYOUT, states[0])).segments > 0
