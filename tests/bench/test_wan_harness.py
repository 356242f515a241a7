"""The WAN-emulation harness: topology, link emulation (rate, RTT, loss), cubic, calibration, teardown.

Needs root and network namespaces (CI runs as root); skipped with the reason otherwise. Transfers are small
so the module stays well under a minute and a half.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks.wan import (
    LinkSpec,
    NotRootError,
    Shape,
    Topology,
    cleanup_stale,
    get_tcp_congestion,
    set_tcp_congestion,
)
from benchmarks.wan.netns import list_netns, owner_pid, unsupported_reason
from benchmarks.wan.probes import measure_datagram_loss, measure_round_trips, measure_rtt, measure_throughput

# Rates, RTTs and loss are measured through a userspace forwarder: with the cores theirs (timed tests), they
# are the link's.
pytestmark = pytest.mark.serial

REPO = Path(__file__).resolve().parents[2]
WAN_NET = ipaddress.ip_network("198.18.0.0/15")


_REASON = unsupported_reason("the WAN harness")
needs_netns = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

SPECS = {
    "shaped": LinkSpec.symmetric(rate_mbit=50, rtt_ms=10),  # userspace forwarder: rate + delay
    "plain": LinkSpec.symmetric(rate_mbit=50),  # veth + tbf
    "far": LinkSpec.symmetric(rtt_ms=50),
    "lossy": LinkSpec.symmetric(rate_mbit=100, rtt_ms=50, loss=0.01, seed=7),
}


@pytest.fixture(scope="module")
def topo():
    with Topology(SPECS) as t:
        yield t


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_dead(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


# --- no root needed ----------------------------------------------------------------------------------


def test_specs_validate_and_derive_rtt_and_buffer():
    spec = LinkSpec.symmetric(rate_mbit=100, rtt_ms=50, loss=0.01)
    assert spec.down.delay_ms == spec.up.delay_ms == 25
    assert spec.rtt_ms == 50 and spec.uses_forwarder
    assert spec.down.effective_queue_bytes == int(100e6 / 8 * 0.05)  # one BDP
    assert not LinkSpec.symmetric(rate_mbit=10).uses_forwarder  # no delay/loss: veth + tbf
    with pytest.raises(ValueError):
        Shape(loss=1.5)
    with pytest.raises(ValueError):
        LinkSpec.symmetric(rtt_ms=10, backend="veth")


def test_owner_pid_parses_only_harness_names():
    assert owner_pid("aur-1234-0-home") == 1234
    assert owner_pid("aur-home") is None
    assert owner_pid("other-1234-0-home") is None


def test_not_root_is_a_typed_error(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NotRootError, match="root"), Topology({"x": LinkSpec()}):
        pass
    with pytest.raises(PermissionError):  # the builtin a caller may catch to skip
        Topology({"x": LinkSpec()}).start()


# --- topology ------------------------------------------------------------------------------------------


@needs_netns
def test_regions_have_addresses_in_the_benchmark_range_and_cubic_routes(topo):
    addresses = {r.name: r.address for r in topo.regions}
    assert len(set(addresses.values())) == len(addresses)
    assert all(ipaddress.ip_address(a) in WAN_NET for a in addresses.values())
    for region in topo.regions:
        assert region.netns.startswith(topo.prefix)
        lo = topo.run(region.name, ["ip", "-o", "-4", "addr", "show", "dev", "lo"], capture_output=True, text=True)
        assert "127.0.0.1" in lo.stdout and region.address in lo.stdout
        routes = topo.run(region.name, ["ip", "route"], capture_output=True, text=True).stdout.splitlines()
        assert routes and all("congctl cubic" in r for r in routes), routes
        for line in routes:  # every route points into 198.18.0.0/15
            assert ipaddress.ip_network(line.split()[0]).subnet_of(WAN_NET)


@needs_netns
def test_popen_runs_inside_the_region_and_regions_reach_each_other(topo):
    code = "import socket,sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), 5).getsockname()[0])"
    with topo.inside("home"):
        server = socket.create_server((topo.address("home"), 0))
    with server:
        port = server.getsockname()[1]
        proc = topo.popen("far", [sys.executable, "-c", code, topo.address("home"), str(port)],
                          stdout=subprocess.PIPE, text=True)
        conn, peer = server.accept()
        conn.close()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert peer[0] == out.strip() == topo.address("far")
    # remote → remote goes through home (two links): RTT of both
    assert 45 <= measure_rtt(topo, "far", "shaped", samples=5) <= 75


# --- link emulation ------------------------------------------------------------------------------------


def best_of_three(topo, sender: str, receiver: str):
    """The fastest of three 4 MB transfers. One transfer (~0.7 s, slow start included) beside a loaded test pass
    measured 39.2 Mbit/s on a 50 Mbit/s link; the link's rate is what it delivers when nothing else holds the
    sender up, and an emulator that let more through than the rate would still show it here, above 60."""
    return max((measure_throughput(topo, sender, receiver, nbytes=4_000_000) for _ in range(3)),
               key=lambda t: t.mbit_s)


@needs_netns
@pytest.mark.parametrize("region", ["shaped", "plain"])
def test_rate_is_within_20_percent_of_target(topo, region):
    result = best_of_three(topo, "home", region)
    assert 40 <= result.mbit_s <= 60, result
    up = best_of_three(topo, region, "home")
    assert 40 <= up.mbit_s <= 60, up


@needs_netns
def test_a_forwarder_runs_above_the_endpoints_unless_its_starter_runs_lowered(topo):
    link = topo.link("shaped")
    assert link.scheduling == "realtime" and os.sched_getscheduler(link.pid) == os.SCHED_RR
    # a link that a lowered process (a background test worker) starts must not preempt the foreground
    code = textwrap.dedent("""
        import json, os
        from benchmarks.wan import LinkSpec, Topology
        with Topology({"x": LinkSpec.symmetric(rtt_ms=10)}) as t:
            link = t.link("x")
            print(json.dumps([link.scheduling, os.sched_getscheduler(link.pid), os.getpriority(os.PRIO_PROCESS,
                                                                                                link.pid)]))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, 19), check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == ["inherited", os.SCHED_OTHER, 19]


@needs_netns
def test_rtt_is_within_10ms_of_target(topo):
    rtt = measure_rtt(topo, "far", "home", samples=10)
    assert 40 <= rtt <= 60
    trips = measure_round_trips(topo, "far", "home", samples=5)
    assert len(trips.samples_ms) == 5
    assert 49.9 <= trips.min_ms <= trips.median_ms <= trips.max_ms, trips  # no echo beats the link's 50 ms
    with pytest.raises(ValueError, match="samples"):
        measure_round_trips(topo, "far", "home", samples=0)


@needs_netns
def test_links_can_be_reshaped_while_running(topo):
    link = topo.link("far")
    link.reshape(LinkSpec.symmetric(rtt_ms=20))
    try:
        assert 10 <= measure_rtt(topo, "far", "home", samples=5) <= 30
    finally:
        link.reshape(SPECS["far"])
    # within 10 ms, like the link's own RTT test above: beside a loaded test pass the median of five came out
    # at 55.3 ms for 50; 20 and 50 stay told apart
    assert 40 <= measure_rtt(topo, "far", "home", samples=5) <= 60


@needs_netns
def test_loss_is_observed_at_the_configured_rate(topo):
    link = topo.link("lossy")
    link.reset_stats()
    probe = measure_datagram_loss(topo, "home", "lossy", packets=20000)
    stats = link.stats()
    assert stats.down.packets_in >= 20000
    assert 0.005 <= stats.loss_observed <= 0.015, stats
    assert 0.005 <= probe.loss <= 0.015, probe  # end to end, independent of the forwarder's counters
    assert stats.down.dropped_queue == 0 and stats.down.dropped_overrun == 0


@needs_netns
def test_parallel_streams_pay_under_loss_with_cubic_on_both_ends(topo):
    one = measure_throughput(topo, "home", "lossy", seconds=3, streams=1)
    four = measure_throughput(topo, "home", "lossy", seconds=3, streams=4)
    assert one.cc_sender == one.cc_receiver == four.cc_sender == four.cc_receiver == "cubic"
    assert four.mbit_s >= 1.3 * one.mbit_s, (one, four)
    assert one.mbit_s < 30  # cubic reacts to 1 % loss (bbr would run near the link rate)


@needs_netns
def test_sockets_can_override_the_route_algorithm(topo):
    with topo.inside("home"):
        server = socket.create_server((topo.address("home"), 0))
    with topo.inside("far"):
        client = socket.socket()
    with server, client:
        client.connect((topo.address("home"), server.getsockname()[1]))
        accepted, _ = server.accept()
        with accepted:
            assert get_tcp_congestion(client) == get_tcp_congestion(accepted) == "cubic"
            set_tcp_congestion(client, "reno")
            assert get_tcp_congestion(client) == "reno"


@needs_netns
def test_calibration_cli_prints_one_json_object():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.wan.calibrate", "--rate", "50", "--rtt", "20", "--seconds", "1.5",
         "--streams", "2", "--json"],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=True,
    )
    result = json.loads(proc.stdout)
    for key in ("rate_mbit_target", "rate_mbit_achieved_1stream", "rate_mbit_achieved_nstreams", "rtt_ms",
                "loss_target", "loss_observed", "cc"):
        assert key in result
    assert result["cc"] == "cubic" and result["loss_observed"] == 0
    assert result["rate_mbit_target"] == 50 and result["streams"] == 2
    # The CLI reports what the link delivered in one 1.5 s window per stream count. How close that comes to the
    # target is test_rate_is_within_20_percent_of_target's to judge (best of three, both directions): a single
    # window beside a loaded test pass once came out at 33.8. Here the figures must be goodput of the shaped link:
    # never above its rate, and not off by a unit (bits for bytes: 8x).
    for key in ("rate_mbit_achieved_1stream", "rate_mbit_achieved_nstreams"):
        assert 50 / 4 <= result[key] <= 60, (key, result)
    # The RTT is the fastest echo: never below the link's 20 ms (the forwarder holds every packet its delay) and
    # not a unit off (half or twice the round trip). The median beside it once came out at 30.5 in a loaded test
    # pass; it is reported, and bounded only by the fastest and slowest samples.
    assert result["rtt_ms_target"] == 20
    assert 19.9 <= result["rtt_ms"] <= 25, result
    assert result["rtt_ms"] <= result["rtt_ms_median"] <= result["rtt_ms_max"], result


# --- teardown ------------------------------------------------------------------------------------------


@needs_netns
def test_teardown_when_the_body_raises():
    topology = Topology({"eu": LinkSpec.symmetric(rtt_ms=10), "us": LinkSpec.symmetric(rate_mbit=10)})
    with pytest.raises(RuntimeError, match="boom"), topology as t:
        forwarders = t.forwarder_pids()
        sleeper = t.popen("eu", ["sleep", "60"])
        assert forwarders and all(_alive(p) for p in forwarders)
        assert sum(n.startswith(t.prefix) for n in list_netns()) == 3
        raise RuntimeError("boom")
    assert not [n for n in list_netns() if n.startswith(topology.prefix)]
    assert not _wait_dead([*forwarders, sleeper.pid], timeout=2)


HARNESS = textwrap.dedent("""
    import json, sys, time
    from benchmarks.wan import LinkSpec, Topology
    with Topology({"eu": LinkSpec.symmetric(rtt_ms=10, loss=0.01)}) as t:
        sleeper = t.popen("eu", ["sleep", "60"])
        print(json.dumps({"prefix": t.prefix, "pids": [*t.forwarder_pids(), sleeper.pid]}), flush=True)
        time.sleep(60)
""")


def _start_harness() -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", HARNESS], stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = proc.stdout.readline()
    assert line, "harness did not start"
    return proc, json.loads(line)


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_teardown_on_signal(sig):
    proc, info = _start_harness()
    proc.send_signal(sig)
    proc.wait(timeout=20)
    assert not [n for n in list_netns() if n.startswith(info["prefix"])]
    assert not _wait_dead(info["pids"], timeout=2)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM


@needs_netns
def test_stale_namespaces_of_a_killed_harness_are_cleaned_up():
    proc, info = _start_harness()
    forwarder, sleeper = info["pids"]
    proc.kill()
    proc.wait(timeout=10)
    assert not _wait_dead([forwarder], timeout=5), "forwarder must die with its parent"
    assert [n for n in list_netns() if n.startswith(info["prefix"])]  # a crash leaves namespaces behind…
    removed = cleanup_stale()
    assert all(not _alive(owner_pid(n)) for n in removed)  # never a live run's namespaces
    assert not [n for n in list_netns() if n.startswith(info["prefix"])]  # …which the next run removes
    assert not _wait_dead([sleeper], timeout=2)
