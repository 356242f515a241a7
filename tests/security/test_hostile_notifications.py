"""Notifications from an attacker who holds only the Redis URL (and, for the catch-up plan, write access to a
region's relay-fed bucket), sent to a running relay and a running actor intake against a real Valkey and
real buckets: each hostile input is dropped and counted, nothing it names is acted on, the state it could
grow stays bounded, and the process goes on forwarding and following the real versions.

Each test is one row of the threat model's notification side (docs/THREAT_MODEL.md)."""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import pytest
import redis

from aurora_store.bus import ControlPlane, RunKeys, VersionEvent
from aurora_store.bus.messages import MAX_VERSION
from aurora_store.codec import CodecParams, ModelLayout, TensorTarget, digest_state, pieces_from_states
from aurora_store.codec.manifest import SegmentRef
from aurora_store.errors import MessageError, ObjectNotFoundError
from aurora_store.follow import BucketChain, Follower, Prefetcher
from aurora_store.metrics import Metrics
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.store.snapshots import write_snapshot
from aurora_store.testing.builders import TINY_QWEN3, perturb, random_state
from aurora_store.trust import Signer, Verifier, write_keypair
from workers.actor.intake import EventIntake
from workers.actor.relay_watch import RelayWatch
from workers.actor.versions import VersionView
from workers.relay.cli import parse_args
from workers.relay.relay import MAX_EVENT_COPIES, SEGMENT_WINDOW, Relay, SegmentCache

pytestmark = [pytest.mark.redis]

LAYOUT = ModelLayout.from_config(TINY_QWEN3)
HOME, REGION = "us-east", "eu-west"
TOKEN = "cache-token-of-the-run"


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@dataclass
class Chain:
    """A trainer's bucket: signed versions 0..latest (snapshot 0), and how to publish the next one."""

    store: DeltaStore
    publisher: VersionPublisher
    states: list
    signer: Signer
    public_key: str

    def publish_next(self, plane: ControlPlane | None = None, *, announce_segments: bool = False) -> int:
        version = len(self.states)
        old, new = self.states[-1], perturb(self.states[-1], 0.03, 100 + version)
        on_segment = None
        if plane is not None and announce_segments:
            on_segment = lambda ref: plane.announce(  # noqa: E731
                VersionEvent("segment", version, HOME, segment=ref.digest, size=ref.size))
        part, _ = self.publisher.upload_part(pieces_from_states(LAYOUT, old, new), on_segment=on_segment)
        report = self.publisher.publish_parts(version, version - 1, digest_state(LAYOUT, old), [part])
        self.states.append(new)
        if plane is not None:
            plane.announce(VersionEvent("staged", version, HOME, base=version - 1,
                                        manifest_key=object_names.delta(version),
                                        weights_digest=report.manifest.weights_digest))
        return version


def signed_chain(tmp_path, run: str, versions: int = 2) -> Chain:
    key, pub = write_keypair(tmp_path / "keys")
    signer = Signer.load(str(key))
    store = DeltaStore(open_bucket(str(tmp_path / HOME), create=True))
    store.put_run_info({"run": run, "home_region": HOME, "layout": LAYOUT.fingerprint})
    state = random_state(LAYOUT, 7)
    write_snapshot(store, 0, state, LAYOUT, digest_state(LAYOUT, state), extra_files={"config.json": b"{}"},
                   producer={"run": run}, sign=signer)
    publisher = VersionPublisher(store, LAYOUT, CodecParams(segment_bytes=4096), streams=2, producer={"run": run},
                                 sign=signer, record_history=False)
    chain = Chain(store, publisher, [state], signer, str(pub))
    for _ in range(versions):
        chain.publish_next()
    return chain


def attacker(redis_url: str) -> redis.Redis:
    """A client holding nothing but the Redis URL."""
    return redis.Redis.from_url(redis_url)


def forge(client: redis.Redis, run: str, region: str, entries: list[dict[str, str]]) -> None:
    """XADD raw entries to a region's event stream, as any holder of the URL can."""
    stream = RunKeys(run).events(region)
    pipe = client.pipeline(transaction=False)
    for fields in entries:
        pipe.xadd(stream, fields)  # type: ignore[arg-type]
    pipe.execute()


def region_events(plane: ControlPlane, kind: str) -> list[VersionEvent]:
    """Every event of ``kind`` the relay has announced to its region so far."""
    out: list[VersionEvent] = []
    cursor = "0"
    while batch := plane.read_events({REGION: cursor}, block_ms=None):
        out += [e for _, _, e in batch if e.kind == kind]
        cursor = batch[-1][1]
    return out


# --- the relay ---------------------------------------------------------------------------------------


@pytest.fixture()
def relay(tmp_path, redis_url) -> Iterator[tuple[Relay, Chain, ControlPlane]]:
    run = f"hostile-{os.getpid()}-{time.monotonic_ns()}"
    chain = signed_chain(tmp_path, run)
    relay = Relay(parse_args([
        "--source", str(tmp_path / HOME), "--dest", str(tmp_path / REGION), "--redis", redis_url,
        "--region", REGION, "--run", run, "--cache-dir", str(tmp_path / "cache"), "--cache-bytes", "20000",
        "--cache-token", TOKEN, "--cache-bind", "127.0.0.1", "--cache-port", "0", "--cache-header-deadline-s", "3",
        "--trainer-public-key", chain.public_key]))
    thread = threading.Thread(target=relay.run, name="relay-under-attack", daemon=True)
    thread.start()
    plane = ControlPlane(redis_url, run)
    try:
        assert wait_for(lambda: {1, 2} <= relay.forwarded and plane.relay(REGION) is not None), "relay not up"
        yield relay, chain, plane
    finally:
        relay.stopping.set()
        thread.join(timeout=30)
        plane.close()


def forwards_the_next_version(relay: Relay, chain: Chain, plane: ControlPlane, timeout: float = 20.0) -> int:
    """The relay still does its job: a real version announced now reaches the regional bucket, and its
    commit is forwarded once it is there."""
    version = chain.publish_next(plane, announce_segments=True)
    plane.announce(VersionEvent("commit", version, HOME))
    assert wait_for(lambda: version in relay.forwarded, timeout), f"version {version} was not forwarded"
    assert wait_for(lambda: any(e.version == version for e in region_events(plane, "commit")), timeout), \
        f"commit {version} was not forwarded"
    return version


def test_malformed_events_are_dropped_at_the_parse_gate_and_name_no_file(relay, tmp_path, redis_url):
    """Digest-as-file-name: a ``segment`` event whose digest is a path (or any malformed event: a negative
    size, an oversized field, an unknown kind, a missing field) is dropped and counted where it is parsed;
    the file it names outside the cache directory is neither read, announced nor deleted."""
    relay_, chain, plane = relay
    secret = tmp_path / "secret"
    secret.write_bytes(b"not a segment")
    climb = os.path.relpath(secret, tmp_path / "cache")
    hostile = [
        {"kind": "segment", "version": "3", "region": HOME, "segment": climb, "size": "13"},
        {"kind": "segment", "version": "3", "region": HOME, "segment": str(secret), "size": "13"},
        {"kind": "segment", "version": "3", "region": HOME, "segment": "A" * 64, "size": "13"},  # not lower-case
        {"kind": "segment", "version": "3", "region": HOME, "segment": "a" * 64, "size": "-5"},
        {"kind": "segment", "version": "3", "region": HOME, "segment": "a" * 64, "size": str(1 << 40)},
        {"kind": "segment", "version": "3", "region": HOME, "segment": "a" * 64},
        {"kind": "staged", "version": "3", "region": "x" * 1_000_000},  # a megabyte field: refused unparsed
        {"kind": "staged", "version": "9" * 5000, "region": HOME},
        {"kind": "commit", "version": "-1", "region": HOME},
        {"kind": "launch", "version": "3", "region": HOME},
        {"version": "3", "region": HOME},
    ]
    forge(attacker(redis_url), plane.run, HOME, hostile)
    assert wait_for(lambda: sum(relay_.plane.rejected.values()) == len(hostile), 10), relay_.plane.rejected
    assert relay_.plane.rejected["event:unknown_kind"] == 1
    assert secret.read_bytes() == b"not a segment"
    assert not any(e.segment in (climb, str(secret)) for e in region_events(plane, "segment"))
    forwards_the_next_version(relay_, chain, plane)
    # and the cache itself never turns a name into a path outside its directory, whoever asks
    cache = relay_.cache
    assert cache.peek(climb) is None and not cache.holds(climb)
    cache.discard({climb, str(secret)})
    assert secret.exists()
    with pytest.raises(ValueError):
        cache.put(climb, b"x")


def test_a_forged_commit_with_a_huge_version_does_not_stop_commits(relay, redis_url):
    relay_, chain, plane = relay
    plane.announce(VersionEvent("commit", MAX_VERSION, HOME))  # the largest a message may name
    assert wait_for(lambda: relay_.dropped["commit_not_in_source"] == 1, 10)
    assert relay_.committed < MAX_VERSION
    forwards_the_next_version(relay_, chain, plane)
    assert max(e.version for e in region_events(plane, "commit")) == len(chain.states) - 1


def test_a_burst_of_forged_staged_events_is_not_slept_on(relay, redis_url):
    """Two thousand ``staged`` events for versions the source does not hold cost a look each, never a sleep:
    the real version behind them is forwarded as fast as ever (before: 0.2 s per event, 400 s)."""
    relay_, chain, plane = relay
    burst = [{"kind": "staged", "version": str(v), "region": HOME} for v in range(1000, 3000)]
    forge(attacker(redis_url), plane.run, HOME, burst)
    started = time.monotonic()
    forwards_the_next_version(relay_, chain, plane, timeout=60)
    assert time.monotonic() - started < 30
    assert wait_for(lambda: relay_.dropped["staged_not_in_source"] == len(burst), 30)
    assert not set(range(1000, 3000)) & relay_.forwarded


def test_forged_segment_names_hold_no_state_beyond_the_bounds(relay, redis_url):
    """Thousands of ``segment`` events naming segments that do not exist: those outside the version window
    are dropped at once, the others are tried once within the bound on copies in flight and forgotten; no
    forged name is kept, announced or copied, and the copy lanes stay free for the real version."""
    relay_, chain, plane = relay
    newest = max(relay_.forwarded)
    in_window = [{"kind": "segment", "version": str(newest + 1), "region": HOME,
                  "segment": hashlib.sha256(b"forged %d" % i).hexdigest(), "size": "4096"} for i in range(3000)]
    far = [{"kind": "segment", "version": str(newest + SEGMENT_WINDOW + 1 + i), "region": HOME,
            "segment": hashlib.sha256(b"far %d" % i).hexdigest(), "size": "4096"} for i in range(3000)]
    forge(attacker(redis_url), plane.run, HOME, in_window + far)
    peak = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with relay_._lock:
            peak = max(peak, len(relay_.inflight))
        if relay_.dropped["segment_out_of_window"] == len(far) and not relay_.inflight:
            break  # the far ones were sent last: every event has been handled
        time.sleep(0.01)
    assert relay_.dropped["segment_out_of_window"] == len(far)
    assert peak <= MAX_EVENT_COPIES
    forged = {f["segment"] for f in in_window + far}
    assert not relay_.inflight and not forged & relay_.present and not forged & relay_.announced
    assert not any(forged & names for names in relay_.segments_by_version.values())
    assert not forged & set(DeltaStore(relay_.config.dest).segment_digests())
    forwards_the_next_version(relay_, chain, plane)


class _Finished:
    """Lanes whose copies are over by the time ``submit`` returns (a fast failure on an idle machine)."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        future.set_exception(ObjectNotFoundError("no such segment"))
        return future


def test_a_copy_over_before_it_is_recorded_leaves_no_state_and_no_deadlock(relay):
    """The race a flood of forged names makes likely, made certain: a copy that has failed by the time it is
    recorded is forgotten at once — and the relay does not deadlock on its own lock doing so."""
    relay_, chain, plane = relay
    lanes, relay_.pool = relay_.pool, _Finished()
    try:
        name = hashlib.sha256(b"over at once").hexdigest()
        copier = threading.Thread(target=relay_.copy_segment, args=(SegmentRef(name, 10, ()), 3), daemon=True)
        copier.start()
        copier.join(timeout=5)
        assert not copier.is_alive(), "the relay deadlocked recording a copy that was already over"
        assert name not in relay_.inflight
    finally:
        relay_.pool = lanes
    forwards_the_next_version(relay_, chain, plane)


def test_slow_connections_without_a_token_do_not_lock_actors_out_of_the_cache(relay):
    """Fifty connections from one address that never finish their request line: eight are let wait (the
    per-client cap) and closed at the header deadline (3 s here), the rest are refused at once; none takes a
    serving slot, so an actor with the token is served at once meanwhile."""
    relay_, _, _ = relay
    server = relay_.server
    assert server is not None
    digest = next(d for d in relay_.present if relay_.cache.holds(d))
    slow = []
    for _ in range(50):
        sock = socket.socket()
        sock.bind(("127.0.0.2", 0))  # another client address than the actor's (127.0.0.1)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"GET /segments/")
        slow.append(sock)
    try:
        started = time.monotonic()
        for _ in range(20):  # more than the serving slots (16): none of them is held by the slow ones
            status, body = _get(server.port, digest, TOKEN)
            assert status == 200 and hashlib.sha256(body).hexdigest() == digest
        assert time.monotonic() - started < 3, "honest reads waited for the slow connections"
        assert wait_for(lambda: server.unheard() == 0, 10), "slow connections outlived the header deadline"
        # each was either let wait and closed at the deadline, or refused at once (a slot freed by an expiry
        # lets a later one of them wait in turn: accepting fifty takes a while on a loaded machine)
        refused = relay_.metrics.cache_refused.labels("busy")._value.get()
        assert server.expired >= server.per_client and server.expired + refused == len(slow)
        for sock in slow:  # every one of them is closed by now
            sock.settimeout(2)
            assert _closed(sock)
    finally:
        for sock in slow:
            sock.close()


def _get(port: int, digest: str, token: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", f"/segments/{digest}", headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _closed(sock: socket.socket) -> bool:
    try:
        while chunk := sock.recv(4096):  # a 503 answer, then the end; or the end at once
            del chunk
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_the_cache_listens_on_one_private_address_by_default(tmp_path, redis_url):
    chain = signed_chain(tmp_path, "bind-default", versions=0)
    relay_ = Relay(parse_args(["--source", str(tmp_path / HOME), "--dest", str(tmp_path / REGION),
                               "--redis", redis_url, "--region", REGION, "--run", "bind-default",
                               "--cache-token", TOKEN, "--cache-port", "0",
                               "--trainer-public-key", chain.public_key]))
    try:
        assert relay_.server is not None
        bound = relay_.server.server_address[0]
        assert bound not in ("0.0.0.0", "::") and relay_.cache_url == f"http://{bound}:{relay_.server.port}"
    finally:
        if relay_.server is not None:
            relay_.server.server_close()
        relay_.plane.close()


def test_every_version_a_message_may_name_is_one_a_bucket_can_spell():
    assert MAX_VERSION == 10**object_names.VERSION_DIGITS - 1
    object_names.delta(MAX_VERSION)
    with pytest.raises(MessageError):
        VersionEvent("commit", MAX_VERSION + 1, HOME)


def test_the_disk_tier_keeps_only_sha256_names(tmp_path):
    cache = SegmentCache(10, str(tmp_path / "cache"))
    data = os.urandom(64)
    digest = hashlib.sha256(data).hexdigest()
    cache.put(digest, data)  # larger than the memory tier: not cached
    cache.put(hashlib.sha256(b"a").hexdigest(), b"a")
    cache.put(hashlib.sha256(b"bb").hexdigest(), b"bb" * 5)  # spills "a" to disk
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [hashlib.sha256(b"a").hexdigest()]
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    for name in ("../outside", str(outside), "", ".", "..", "a" * 63, "g" * 64):
        assert cache.peek(name) is None and not cache.holds(name)
        cache.discard({name})
    assert outside.read_bytes() == b"keep"


# --- the actor -----------------------------------------------------------------------------------------


@pytest.fixture()
def actor(tmp_path, redis_url) -> Iterator[tuple[EventIntake, Follower, Chain, ControlPlane]]:
    run = f"hostile-actor-{os.getpid()}-{time.monotonic_ns()}"
    chain = signed_chain(tmp_path, run)
    metrics = Metrics("actor", run, HOME)
    prefetcher = Prefetcher(2, 1 << 20, metrics, hold_s=1.0)
    home = BucketChain(DeltaStore(str(tmp_path / HOME)))  # an actor of the home region: no relay involved
    follower = Follower(home, prefetcher=prefetcher, verify=Verifier.load(chain.public_key, run))
    state = chain.states[-1]
    follower.attach(TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in state.items()},
                                            version=len(chain.states) - 1))
    plane = ControlPlane(redis_url, run)
    view = VersionView()
    view.published(len(chain.states) - 1)
    stopped = threading.Event()
    watch = RelayWatch(plane, home, HOME, HOME, "actor-1", cache_token=None, cache_timeout_s=1.0, metrics=metrics)
    intake = EventIntake(plane, watch, follower, view, stopped)
    thread = threading.Thread(target=intake.run, name="intake-under-attack", daemon=True)
    thread.start()
    time.sleep(0.5)  # the intake reads from the stream's end: let it take its cursor
    try:
        yield intake, follower, chain, plane
    finally:
        stopped.set()
        thread.join(timeout=10)
        follower.close()
        plane.close()


def test_forged_staged_and_commit_events_do_not_move_what_the_actor_knows(actor, redis_url):
    intake, _, chain, plane = actor
    latest = len(chain.states) - 1
    plane.announce(VersionEvent("staged", MAX_VERSION, HOME, base=MAX_VERSION - 1))
    plane.announce(VersionEvent("commit", MAX_VERSION, HOME))
    assert wait_for(lambda: intake.dropped["staged_not_in_bucket"] == 1
                    and intake.dropped["commit_not_in_bucket"] == 1, 10), intake.dropped
    assert intake.view.known_latest == latest and intake.view.committed < MAX_VERSION
    version = chain.publish_next(plane)  # the real next version is still seen, by its event or the listing
    plane.announce(VersionEvent("commit", version, HOME))
    assert wait_for(lambda: intake.view.known_latest == version and intake.view.committed == version, 10)


def test_segment_events_for_a_version_that_never_comes_do_not_pin_the_prefetch_budget(actor, redis_url):
    """Real segments (an old version's) announced for versions that never come: those beyond the window are
    refused, the others are held only until the hold time runs out; a negative size never gets past the
    parse gate; and the real next version is then prefetched (cut-through goes on)."""
    intake, follower, chain, plane = actor
    prefetcher = follower.prefetcher
    assert prefetcher is not None
    active = follower.target.version
    assert active is not None
    old = chain.store.manifest(1).segments
    for i, ref in enumerate(old):  # far ahead first: a name already held would be ignored for that alone
        plane.announce(VersionEvent("segment", active + 100 + i, HOME, segment=ref.digest, size=ref.size))
    for ref in old:
        plane.announce(VersionEvent("segment", active + 2, HOME, segment=ref.digest, size=ref.size))
    forge(attacker(redis_url), plane.run, HOME,
          [{"kind": "segment", "version": str(active + 1), "region": HOME, "segment": old[0].digest, "size": "-1"}])
    assert wait_for(lambda: prefetcher.held_bytes() == sum(r.size for r in old), 10), "not held in the window"
    assert prefetcher.refused == len(old)
    assert wait_for(lambda: intake.plane.rejected["event:malformed"] == 1, 10)
    time.sleep(1.2)  # past the hold time
    prefetcher.expire()
    assert prefetcher.held_bytes() == 0 and prefetcher.expired_bytes == sum(r.size for r in old)
    version = chain.publish_next(plane, announce_segments=True)
    refs = chain.store.manifest(version).segments
    assert wait_for(lambda: len(prefetcher.held_of(version)) == len(refs), 10), "the real version was not prefetched"


# --- catch-up planning -------------------------------------------------------------------------------


def regional_copy(chain: Chain, regional: DeltaStore, versions: list[int]) -> None:
    """What an honest relay wrote: the signed manifests of ``versions`` and their segments."""
    regional.put_run_info(chain.store.run_info() or {})
    regional.put_layout(LAYOUT)
    for version in versions:
        for ref in chain.store.manifest(version).segments:
            regional.put_segment(ref, chain.store.get_segment(ref))
        regional.publish_manifest(chain.store.manifest_bytes(version))


def test_an_unsigned_snapshot_in_the_regional_bucket_never_enters_a_catch_up_plan(tmp_path):
    run = "plan-attack"
    chain = signed_chain(tmp_path, run, versions=3)
    regional = DeltaStore(open_bucket(str(tmp_path / REGION), create=True))
    regional_copy(chain, regional, [1, 2, 3])
    # the attacker (write access to the regional bucket) plants a cheap, unsigned snapshot far ahead
    state = chain.states[0]
    write_snapshot(regional, 50, state, LAYOUT, digest_state(LAYOUT, state), extra_files={"config.json": b"{}"},
                   producer={"run": run})
    follower = Follower(BucketChain(regional, chain.store), verify=Verifier.load(chain.public_key, run))
    follower.attach(TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in chain.states[1].items()}, version=1))
    step = follower.next_step(2, "behind")
    assert step is not None and not step.snapshot and step.version == 2 and not step.from_source
    assert follower.refused_manifests == 1
    staged = follower.stage(step)
    assert follower.activate(staged) and follower.target.version == 2


def test_a_region_that_cannot_reach_the_newest_version_plans_from_the_source(tmp_path):
    run = "plan-source"
    chain = signed_chain(tmp_path, run, versions=3)
    regional = DeltaStore(open_bucket(str(tmp_path / REGION), create=True))
    regional_copy(chain, regional, [1, 3])  # version 2 never arrived in the region (and no snapshot past 0)
    follower = Follower(BucketChain(regional, chain.store), verify=Verifier.load(chain.public_key, run))
    follower.attach(TensorTarget.from_state(LAYOUT, {k: v.clone() for k, v in chain.states[1].items()}, version=1))
    step = follower.next_step(2, "behind")
    assert step is not None and step.version == 2 and step.from_source
    staged = follower.stage(step)
    assert follower.activate(staged) and str(follower.target.digest) == chain.store.manifest(2).weights_digest


def test_a_segment_ref_of_a_hostile_size_is_never_offered():
    prefetcher = Prefetcher(1, 1 << 20, Metrics("actor", "t"))
    prefetcher.retire(0)
    assert not prefetcher.offer(1, SegmentRef("a" * 64, 0, ()), lambda ref: b"")
    assert not prefetcher.offer(1, SegmentRef("a" * 64, -10, ()), lambda ref: b"")
    assert prefetcher.refused == 2 and prefetcher.held_bytes() == 0
    prefetcher.close()
