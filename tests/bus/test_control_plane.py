"""The Redis control plane against a real Valkey server: events, states, leases, results, faults."""

from __future__ import annotations

import time

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from aurora_store.bus import ActorState, ControlPlane, Lease, RolloutResult, VersionEvent, connect
from aurora_store.bus.identity import Credentials
from aurora_store.bus.messages import MAX_MILLIS, MAX_SEGMENT_BYTES, MAX_VERSION
from aurora_store.errors import BusAuthError, BusError
from aurora_store.testing.members import Member
from aurora_store.testing.servers import RedisServer, closed_port

pytestmark = pytest.mark.redis


def actor_state(actor_id="a1", version=3, **kw) -> ActorState:
    base = dict(actor_id=actor_id, region="eu", engine="torch", active_version=version, active_digest="lthash128:"
                + "0" * 32, staged_version=None, tokens_per_s=12.5, leases=0, status="ready", heartbeat_ms=1,
                source="regional")
    return ActorState(**{**base, **kw})


def version_events(kinds: tuple[str, ...], segment: st.SearchStrategy, size: st.SearchStrategy):
    return st.builds(VersionEvent, kind=st.sampled_from(kinds), version=st.integers(0, MAX_VERSION),
                     region=st.from_regex(r"[a-z][a-z0-9-]{0,7}", fullmatch=True),
                     base=st.one_of(st.none(), st.integers(0, MAX_VERSION)),
                     manifest_key=st.one_of(st.none(), st.from_regex(r"[a-z0-9]{1,8}(/[a-z0-9_.-]{1,8}){0,2}\.json",
                                                                     fullmatch=True)),
                     weights_digest=st.one_of(st.none(), st.just("lthash128:" + "a" * 32)),
                     segment=segment, size=size, sent_ms=st.one_of(st.none(), st.integers(0, MAX_MILLIS)))


SEGMENT_NAMES = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
SIZES = st.integers(1, MAX_SEGMENT_BYTES)


@given(st.one_of(version_events(("segment",), SEGMENT_NAMES, SIZES),
                 version_events(("staged", "commit", "snapshot"), st.one_of(st.none(), SEGMENT_NAMES),
                                st.one_of(st.none(), SIZES))))
def test_version_events_roundtrip_through_fields(event):
    assert VersionEvent.from_fields(event.to_fields()) == event


def test_malformed_messages_are_typed_errors():
    from aurora_store.bus import MessageError

    with pytest.raises(MessageError):
        VersionEvent.from_fields({"kind": "bogus", "version": "1", "region": "x"})
    with pytest.raises(MessageError):
        VersionEvent.from_fields({"kind": "staged", "version": "one", "region": "x"})
    with pytest.raises(ValueError):
        Lease.from_fields({"lease_id": "x"})


L1, L2 = "1" * 32, "2" * 32


@pytest.mark.parametrize("change", [
    {"lease_id": "../../etc"}, {"actor_id": ""}, {"actor_id": "a" * 200}, {"version": "-1"},
    {"version": str(2**60)}, {"tokens": "1e9"}, {"gen_seconds": "nan"}, {"samples": '{"ids": []}'},
    {"samples": "[1,"}, {"kind": "bogus"}, {"signature": "x" * 1000},
])
def test_an_ill_typed_or_out_of_range_result_field_is_a_typed_error(change):
    from aurora_store.bus import MessageError

    good = RolloutResult("result", L1, "a1", "sig", 4, "d", 3, 0.5, [{"ids": [1], "logprobs": [-1.0], "text": ""}])
    assert RolloutResult.from_fields(good.to_fields()) == good
    with pytest.raises(MessageError):
        RolloutResult.from_fields({**good.to_fields(), **change})
    missing = {k: v for k, v in good.to_fields().items() if k != "lease_id"}
    with pytest.raises(MessageError, match="missing"):
        RolloutResult.from_fields(missing)


@pytest.mark.parametrize("change", [
    {"tokens_per_s": "inf"}, {"tokens_per_s": "1e12"}, {"tokens_per_s": "-1"}, {"status": "king"},
    {"active_version": "-3"}, {"actor_id": "a b"}, {"region": "r" * 300},
])
def test_an_actor_state_out_of_range_is_a_typed_error(change):
    from aurora_store.bus import MessageError

    with pytest.raises(MessageError):
        ActorState.from_fields({**actor_state("a1").to_fields(), **change})


def test_a_lease_is_bounded_and_caps_its_result():
    from aurora_store.bus import MessageError

    lease = Lease(L1, "p1", 1, 4, "d", 123, "2+2=", 4, 8)
    assert lease.result_cap < 8 * 1024  # 4 samples × 8 tokens: a few kB, never megabytes
    for change in ({"group_size": "0"}, {"max_new_tokens": str(10**9)}, {"lease_id": "L1"}):
        with pytest.raises(MessageError):
            Lease.from_fields({**lease.to_fields(), **change})


def test_events_are_delivered_in_order_and_blocking_reads_time_out_quietly(redis_url):
    plane = ControlPlane(redis_url, "r1")
    cursor = plane.latest_event_id("home")
    for v in (1, 2, 3):
        plane.announce(VersionEvent("staged", v, "home", base=v - 1, manifest_key=f"deltas/{v}.json"))
    got = plane.read_events({"home": cursor}, block_ms=100)
    assert [e.version for _, _, e in got] == [1, 2, 3]
    started = time.monotonic()
    assert plane.read_events({"home": got[-1][1]}, block_ms=1500) == []  # > default block, < socket timeout
    assert time.monotonic() - started >= 1.4


def test_actor_registration_heartbeat_expiry_and_leave(redis_url):
    plane = ControlPlane(redis_url, "r2", heartbeat_ttl_s=1)
    member = Member("a1", "r2")
    plane.register_actor(actor_state("a1"), member.credentials)
    plane.register_actor(actor_state("a2", version=2), Credentials())
    actors = plane.actors()
    assert set(actors) == {"a1", "a2"} and actors["a1"][1] == member.credentials
    assert actors["a2"][0].active_version == 2
    plane.deregister_actor("a2", "eu")
    assert set(plane.actors()) == {"a1"}
    time.sleep(1.3)  # no heartbeat: the actor's state expires and it is pruned
    assert plane.actors() == {}
    membership = plane.call(lambda r: r.xrange(plane.keys.membership))
    assert [f[b"kind"] for _, f in membership] == [b"join", b"join", b"leave"]


def test_leases_and_results_with_a_consumer_group(redis_url):
    plane = ControlPlane(redis_url, "r3")
    plane.ensure_results_group()
    lease = Lease(L1, "p1", 1, 4, "lthash128:" + "1" * 32, 123, "2+2=", 4, 8)
    plane.grant("a1", [lease])
    work = plane.read_work("a1", "0", block_ms=100)
    assert [w for _, w in work] == [lease]
    result = RolloutResult("result", L1, "a1", "tok", 4, "lthash128:" + "1" * 32, 17, 0.5,
                           [{"ids": [1, 2], "logprobs": [-0.1, -0.2], "text": "4"}])
    plane.send_result(result)
    got = plane.read_results("trainer-old", block_ms=100)
    assert got[0].result == result and got[0].arrival_ms > 0 and got[0].problem is None
    plane.ack_results([got[0].entry_id])
    assert plane.read_results("trainer-old", block_ms=100) == []


def test_redis_unreachable_at_start_is_a_clear_error():
    started = time.monotonic()
    with closed_port() as port, pytest.raises(BusError, match=str(port)):
        connect(f"redis://127.0.0.1:{port}/0", wait_s=1.0)
    assert time.monotonic() - started < 10


def test_redis_that_comes_up_late_is_waited_for():
    server = RedisServer()
    import threading

    threading.Timer(1.0, server.start).start()
    try:
        client = connect(server.url, wait_s=20)
        assert client.ping()
    finally:
        time.sleep(0.2)
        server.stop()


def test_wrong_password_fails_fast_without_a_retry_storm():
    with RedisServer(password="s3cret").start() as server:
        started = time.monotonic()
        with pytest.raises(BusAuthError, match="credentials"):
            connect(server.url.replace("s3cret", "wrong"), wait_s=30)
        assert time.monotonic() - started < 3, "auth errors must not be retried for wait_s"
        with pytest.raises(BusAuthError):
            connect(server.url.replace(":s3cret@", ""), wait_s=30)
        assert connect(server.url).ping()


def test_restart_mid_run_reconnects_and_recreates_the_group():
    with RedisServer().start() as server:
        reconnected = []
        plane = ControlPlane(server.url, "r4", on_reconnect=lambda: reconnected.append(1))
        plane.ensure_results_group()
        plane.send_result(RolloutResult("return", L1, "a1", "t"))
        assert len(plane.read_results("c", block_ms=100)) == 1
        server.restart()  # all data lost: streams, groups, states
        time.sleep(1.1)
        plane.register_actor(actor_state("a9"), Credentials())  # reconnects transparently
        assert reconnected and set(plane.actors()) == {"a9"}
        plane.send_result(RolloutResult("return", L2, "a9", "t"))
        got = plane.read_results("c", block_ms=100)  # NOGROUP → group re-created → reads new entry
        assert [entry.result.lease_id for entry in got if entry.result] == [L2]


def test_plain_client_api_still_works(redis_url):
    assert isinstance(connect(redis_url), redis.Redis)


needs_tls_server = pytest.mark.skipif(
    __import__("shutil").which("redis-server") is None,
    reason="TLS needs Debian's redis-server (make test installs it; the PyPI Valkey build has no TLS)")


@needs_tls_server
def test_tls_and_auth_end_to_end_and_clear_errors_on_misconfiguration():
    with RedisServer(tls=True, password="s3cret").start() as server:
        plane = ControlPlane(server.url, "tls")
        plane.register_actor(actor_state("a1"), Credentials())
        assert set(plane.actors()) == {"a1"}
        started = time.monotonic()
        with pytest.raises(BusAuthError, match="TLS"):
            connect(server.plain_url, wait_s=30)  # plain connection to a TLS-only server
        with pytest.raises(BusAuthError, match="credentials"):
            connect(server.url.replace("s3cret", "wrong"), wait_s=30)
        assert time.monotonic() - started < 5, "misconfiguration must not be retried for wait_s"
        no_ca = server.url.split("?")[0]  # TLS without trusting the server's certificate
        with pytest.raises(BusAuthError, match="TLS"):
            connect(no_ca, wait_s=30)
