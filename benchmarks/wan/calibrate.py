"""Measure what an emulated link really delivers, so benchmark results can quote achieved, not requested, numbers.

``python -m benchmarks.wan.calibrate --rate 100 --rtt 50 --loss 0.01 --json`` builds a one-link topology,
measures it and prints one JSON object. Rates are TCP goodput (payload bytes at the receiver, first to last byte);
with 1500-byte packets that is ~3.5 % below the IP-level link rate because of TCP/IP headers. The RTT is the
fastest of the echo round trips, the link's own: a probe thread of a busy host only ever adds to it (the median
and slowest are recorded beside it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from benchmarks.wan.congestion import DEFAULT_CC
from benchmarks.wan.links import ForwarderLink
from benchmarks.wan.probes import measure_round_trips, measure_throughput
from benchmarks.wan.spec import LinkSpec
from benchmarks.wan.topology import Topology


@dataclass(frozen=True)
class Calibration:
    """Targets next to what was measured on one link (``direction`` ``down`` = home → remote)."""

    rate_mbit_target: float | None
    rate_mbit_achieved_1stream: float
    rate_mbit_achieved_nstreams: float
    streams: int
    rtt_ms_target: float
    rtt_ms: float
    rtt_ms_median: float
    rtt_ms_max: float
    loss_target: float
    loss_observed: float
    packets: int
    dropped_overrun: int
    cc: str
    cc_mechanism: str
    direction: str
    mbytes: float | None
    seconds: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def calibrate_link(topo: Topology, region: str, *, mbytes: float = 8.0, seconds: float | None = None,
                   streams: int = 4, rtt_samples: int = 20, direction: str = "down") -> Calibration:
    """Measure the link of remote ``region``: RTT, bulk goodput with 1 and ``streams`` streams, observed loss.

    Each bulk transfer moves ``mbytes`` megabytes, or, with ``seconds``, runs for a fixed time window (better
    under random loss, see :func:`~benchmarks.wan.probes.measure_throughput`).

    Loss is the forwarder's random-drop count over the packets it put on the wire during the bulk transfers
    (data and ACKs, both directions), so use enough megabytes for the precision you need: the standard error
    is ``sqrt(p / packets)``.
    """
    if topo.region(region).link is None:
        raise ValueError(f"{region!r} is the home region; calibrate a remote one")
    if direction not in ("down", "up"):
        raise ValueError(f"direction must be 'down' or 'up', got {direction!r}")
    sender, receiver = (topo.home, region) if direction == "down" else (region, topo.home)
    link = topo.link(region)
    spec = link.spec  # the link's current shape: it may have been reshaped since the topology was built
    rtts = measure_round_trips(topo, region, topo.home, samples=rtt_samples)
    if isinstance(link, ForwarderLink):
        link.reset_stats()
        before = None
    else:
        before = link.stats()
    size = {"seconds": seconds} if seconds is not None else {"nbytes": int(mbytes * 1e6)}
    single = measure_throughput(topo, sender, receiver, streams=1, **size)
    multi = measure_throughput(topo, sender, receiver, streams=streams, **size)
    stats = link.stats()
    packets = stats.packets_in - (before.packets_in if before else 0)
    overrun = stats.down.dropped_overrun + stats.up.dropped_overrun
    shape = spec.down if direction == "down" else spec.up
    ccs = {single.cc_sender, single.cc_receiver, multi.cc_sender, multi.cc_receiver}
    return Calibration(
        rate_mbit_target=shape.rate_mbit,
        rate_mbit_achieved_1stream=round(single.mbit_s, 3),
        rate_mbit_achieved_nstreams=round(multi.mbit_s, 3),
        streams=streams,
        rtt_ms_target=spec.rtt_ms,
        rtt_ms=round(rtts.min_ms, 3),
        rtt_ms_median=round(rtts.median_ms, 3),
        rtt_ms_max=round(rtts.max_ms, 3),
        loss_target=shape.loss,
        loss_observed=round(stats.loss_observed, 5),
        packets=packets,
        dropped_overrun=overrun,
        cc=",".join(sorted(ccs)),
        cc_mechanism=f"ip route congctl {topo.congestion}" if topo.congestion else "machine default",
        direction=direction,
        mbytes=None if seconds is not None else mbytes,
        seconds=seconds,
    )


def calibrate(rate_mbit: float | None, rtt_ms: float, loss: float, *, mbytes: float = 8.0,
              seconds: float | None = None, streams: int = 4, seed: int = 0, congestion: str | None = DEFAULT_CC,
              backend: str = "auto", direction: str = "down") -> Calibration:
    """Build a home + one remote region joined by the described link, measure it, tear it down."""
    spec = LinkSpec.symmetric(rate_mbit, rtt_ms, loss, seed=seed, backend=backend)
    with Topology({"remote": spec}, congestion=congestion) as topo:
        return calibrate_link(topo, "remote", mbytes=mbytes, seconds=seconds, streams=streams, direction=direction)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wan.calibrate", description=__doc__)
    parser.add_argument("--rate", type=float, default=None, help="link rate in Mbit/s each way (default: unlimited)")
    parser.add_argument("--rtt", type=float, default=0.0, help="round-trip time in ms (half each way)")
    parser.add_argument("--loss", type=float, default=0.0, help="random loss probability in each direction")
    parser.add_argument("--mbytes", type=float, default=8.0, help="megabytes per bulk transfer")
    parser.add_argument("--seconds", type=float, default=None,
                        help="time window per bulk transfer instead of --mbytes (steadier under random loss)")
    parser.add_argument("--streams", type=int, default=4, help="parallel streams of the second transfer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cc", default=DEFAULT_CC, help="algorithm pinned on link routes; 'default' = machine's")
    parser.add_argument("--backend", default="auto", choices=["auto", "forwarder", "veth"])
    parser.add_argument("--direction", default="down", choices=["down", "up"])
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = parser.parse_args(argv)
    result = calibrate(args.rate, args.rtt, args.loss, mbytes=args.mbytes, seconds=args.seconds,
                       streams=args.streams, seed=args.seed,
                       congestion=None if args.cc == "default" else args.cc, backend=args.backend,
                       direction=args.direction)
    json.dump(result.to_dict(), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
