"""The relay's liveness as its region's actors see it: a relay busy with slow cross-region copies stays
alive (otherwise every actor of the region would fall back and pay the WAN copy itself), and a relay
whose work has stopped making progress stops heartbeating (so they do fall back)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from aurora_store.bus import ControlPlane
from aurora_store.store import DeltaStore, open_bucket
from tests.ops.helpers import build_bucket
from workers.chaos.faultproxy import FaultProxy, FaultRates
from workers.relay.cli import parse_args
from workers.relay.relay import Relay

pytestmark = [pytest.mark.slow, pytest.mark.redis]

TTL_S = 2  # the smallest heartbeat TTL the configuration accepts
SLOW_S = 2.5  # every request through the proxy takes longer than the TTL


@contextmanager
def running_relay(s3_server, bucket_url: str, redis_url: str, tmp_path, proxy: FaultProxy, stall_s: float,
                  rates: FaultRates) -> Iterator[Relay]:
    source = build_bucket(bucket_url, versions=2, snapshots=(0,)).store
    source.put_run_info({**(source.run_info() or {}), "home_region": "us-east"})
    proxy.rates = rates
    relay = Relay(parse_args([
        "--source", bucket_url.replace(s3_server.endpoint_url, proxy.endpoint_url), "--dest", str(tmp_path / "eu-west"),
        "--redis", redis_url, "--region", "eu-west", "--run", "relay-test", "--stall-s", str(stall_s)]))
    thread = threading.Thread(target=relay.run, name="relay-under-test", daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.stopping.set()
        proxy.rates = FaultRates()
        thread.join(timeout=30)


def watch(plane: ControlPlane, until: Callable[[], bool], timeout: float) -> list[bool]:
    """Sample 'is the relay alive' (as an actor asks it) every 0.2 s until ``until()`` or ``timeout``."""
    seen = []
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        seen.append(plane.relay("eu-west") is not None)
        time.sleep(0.2)
    return seen


@pytest.fixture()
def plane(redis_url, monkeypatch) -> ControlPlane:
    monkeypatch.setenv("AURORA_HEARTBEAT_TTL", str(TTL_S))
    return ControlPlane(redis_url, "relay-test")


# Heartbeats against a 2 s TTL while each copy takes 2.5 s: it judges time (a timed test; ~1 of its ~45 s on a CPU).
@pytest.mark.serial
def test_a_relay_busy_with_slow_copies_stays_alive(s3_server, s3_bucket_url, redis_url, plane, tmp_path):
    slow = FaultRates(slow=1.0, slow_s=SLOW_S)
    with FaultProxy(s3_server.endpoint_url) as proxy, \
            running_relay(s3_server, s3_bucket_url, redis_url, tmp_path, proxy, 60, slow) as relay:
        started = time.monotonic()
        seen = watch(plane, lambda: {1, 2} <= relay.forwarded, timeout=120)
        elapsed = time.monotonic() - started
    assert {1, 2} <= relay.forwarded, "the relay did not finish forwarding"
    assert proxy.counters.slow >= 5 and elapsed > 3 * TTL_S, "the copies were not slow enough to test anything"
    assert True in seen, f"the relay never looked alive while copying: {seen}"
    first = seen.index(True)
    assert all(seen[first:]), f"the relay looked gone while copying: {seen}"
    regional = DeltaStore(open_bucket(str(tmp_path / "eu-west")))
    assert regional.versions() == [1, 2] and regional.snapshot_versions() == [0]


def test_a_relay_that_stops_making_progress_stops_heartbeating(s3_server, s3_bucket_url, redis_url, plane, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("AURORA_READ_TIMEOUT", "3")
    with FaultProxy(s3_server.endpoint_url) as proxy, \
            running_relay(s3_server, s3_bucket_url, redis_url, tmp_path, proxy, 2.0, FaultRates()) as relay:
        watch(plane, lambda: {1, 2} <= relay.forwarded, timeout=60)
        assert plane.relay("eu-west") is not None
        proxy.rates = FaultRates(stall=1.0, stall_s=8.0)  # every request now hangs: its periodic sync wedges
        wedged = watch(plane, lambda: plane.relay("eu-west") is None, timeout=20)
        assert proxy.counters.stalls and plane.relay("eu-west") is None, \
            f"a relay without progress for longer than --stall-s kept heartbeating: {wedged}"
        proxy.rates = FaultRates()  # requests succeed again (after the client's read timeout): it comes back
        watch(plane, lambda: plane.relay("eu-west") is not None, timeout=30)
        assert plane.relay("eu-west") is not None, "the relay did not come back once it made progress again"


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "soon"])
def test_a_stall_window_that_is_not_a_positive_number_is_refused(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--source", "s", "--dest", "d", "--redis", "redis://x", "--region", "r", "--stall-s", bad])
    assert exit_info.value.code == 2 and "--stall-s: needs a positive number of seconds" in capsys.readouterr().err
