"""WAN emulation for benchmarks: real processes in per-region network namespaces joined by emulated links.

Typical use::

    from benchmarks.wan import LinkSpec, Topology

    with Topology({"eu": LinkSpec.symmetric(rate_mbit=100, rtt_ms=50, loss=0.01)}) as topo:
        s3 = topo.popen("home", ["weed", "mini", "-ip", topo.address("home"), ...])
        relay = topo.popen("eu", [sys.executable, "-m", "workers.relay", ...], env=env)
        print(topo.link_stats("eu").loss_observed)

Needs root. See :mod:`.topology` (regions, addresses, teardown), :mod:`.forwarder` (delay/loss/rate
emulation), :mod:`.congestion` (cubic on every route over a link), :mod:`.probes` (throughput, RTT, loss
measurements) and :mod:`.calibrate` (a link's achieved numbers; not imported here so ``python -m`` runs it cleanly).
"""

from benchmarks.wan.congestion import get_tcp_congestion, set_tcp_congestion
from benchmarks.wan.errors import (
    CommandError,
    ForwarderError,
    NetnsUnsupportedError,
    NotRootError,
    WanError,
)
from benchmarks.wan.links import DirectionStats, LinkStats
from benchmarks.wan.netns import cleanup_stale
from benchmarks.wan.probes import (
    DatagramLoss,
    RoundTrips,
    Throughput,
    measure_connect_rtt,
    measure_datagram_loss,
    measure_round_trips,
    measure_rtt,
    measure_throughput,
)
from benchmarks.wan.spec import LinkSpec, Shape
from benchmarks.wan.topology import HOME_ADDRESS, Region, Topology

__all__ = [
    "HOME_ADDRESS",
    "CommandError",
    "DatagramLoss",
    "DirectionStats",
    "ForwarderError",
    "LinkSpec",
    "LinkStats",
    "NetnsUnsupportedError",
    "NotRootError",
    "Region",
    "RoundTrips",
    "Shape",
    "Throughput",
    "Topology",
    "WanError",
    "cleanup_stale",
    "get_tcp_congestion",
    "measure_connect_rtt",
    "measure_datagram_loss",
    "measure_round_trips",
    "measure_rtt",
    "measure_throughput",
    "set_tcp_congestion",
]
