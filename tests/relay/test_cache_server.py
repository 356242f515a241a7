"""The relay's segment endpoint as a real HTTP server on a real socket: hits, misses, credentials, its
concurrency bound, and that every byte it serves is the segment its name says."""

from __future__ import annotations

import hashlib
import http.client
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from aurora_store.errors import ConfigError
from aurora_store.metrics import Metrics
from workers.relay.relay import SegmentCache
from workers.relay.serve import CacheServer

TOKEN = "s3cret-run-token"


def segment(n: int) -> tuple[str, bytes]:
    data = os.urandom(1000 + 997 * n)
    return hashlib.sha256(data).hexdigest(), data


@pytest.fixture()
def served(tmp_path):
    metrics = Metrics("relay", "t", "eu-west")
    # A memory tier smaller than what is put: some answers come from the disk tier.
    cache = SegmentCache(20_000, str(tmp_path / "disk"), metrics)
    segments = dict(segment(n) for n in range(12))
    for digest, data in segments.items():
        cache.put(digest, data)
    # The bound on connections has a test (and a server) of its own: here one request follows another, and a
    # handler may still hold its slot after its client has read the whole answer (under load a run got 503 once)
    server = CacheServer(("127.0.0.1", 0), cache.get, TOKEN, metrics, max_connections=16).start()
    try:
        yield server, cache, segments, metrics
    finally:
        server.stop()


def request(server: CacheServer, method: str, path: str, token: str | None = TOKEN) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token is not None else {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_every_cached_segment_is_served_whole_and_true(served):
    server, cache, segments, metrics = served
    assert cache.disk is not None and any(cache.disk.iterdir()), "nothing spilled: the disk tier is untested"
    for digest, data in segments.items():
        status, headers, body = request(server, "GET", f"/segments/{digest}")
        assert status == 200 and hashlib.sha256(body).hexdigest() == digest and body == data
        status, headers, body = request(server, "HEAD", f"/segments/{digest}")
        assert status == 200 and body == b"" and int(headers["Content-Length"]) == len(data)
    assert cache.hits == 2 * len(segments) and cache.misses == 0
    # The server counts a body once it has handed it to the socket, which may be just after the client has
    # read it: wait for the handler threads, never for longer than a moment.
    expected = sum(len(d) for d in segments.values())
    deadline = time.monotonic() + 5
    while metrics.cache_served_bytes._value.get() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metrics.cache_served_bytes._value.get() == expected


def test_a_miss_is_404_and_counted(served):
    server, cache, _, _ = served
    assert request(server, "GET", "/segments/" + "0" * 64)[0] == 404
    assert request(server, "HEAD", "/segments/" + "1" * 64)[0] == 404
    assert request(server, "GET", "/segments/../../etc/passwd")[0] == 404  # only digests are names
    assert cache.misses == 2


@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN + "x", TOKEN[:-1]])
def test_no_bytes_without_the_runs_token(served, token):
    server, cache, segments, metrics = served
    digest = next(iter(segments))
    for method in ("GET", "HEAD"):
        status, headers, body = request(server, method, f"/segments/{digest}", token)
        assert status == 401 and body == b"" and headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert cache.hits == 0 and metrics.cache_refused.labels("auth")._value.get() == 2
    assert metrics.cache_served_bytes._value.get() == 0


def test_authorised_requests_over_the_bound_get_503_and_a_freed_slot_serves_again(tmp_path):
    metrics = Metrics("relay", "t", "eu-west")
    digest, data = segment(1)
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def slow_lookup(name: str) -> bytes | None:  # each request holds its slot until the gate opens
        entered.release()
        gate.wait(10)
        return data if name == digest else None

    server = CacheServer(("127.0.0.1", 0), slow_lookup, TOKEN, metrics, max_connections=2).start()
    try:
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(request, server, "GET", f"/segments/{digest}") for _ in range(2)]
            assert all(entered.acquire(timeout=5) for _ in range(2)), "the two requests were not being served"
            status, headers, _ = request(server, "GET", f"/segments/{digest}")
            assert status == 503 and headers.get("Retry-After") == "1"
            assert metrics.cache_refused.labels("busy")._value.get() == 1
            gate.set()
            assert [f.result(timeout=10)[0] for f in held] == [200, 200]
        assert request(server, "GET", f"/segments/{digest}")[0] == 200  # the freed slots serve again
    finally:
        gate.set()
        server.stop()


def test_no_token_no_server():
    with pytest.raises(ConfigError):
        CacheServer(("127.0.0.1", 0), lambda _: None, "", Metrics("relay", "t"))
