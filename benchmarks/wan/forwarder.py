"""The userspace link: one process per link that moves IP packets between two TUN devices in two namespaces.

The kernel here has no ``netem``, so delay and random loss are emulated in user space. Each direction models a
bottleneck link: a packet read at time *t* starts transmission when the link is free (``max(t, link_free)``),
occupies it for ``size / rate`` (tail-dropped if the backlog would exceed the buffer), is lost on the wire with
probability ``loss`` (seeded RNG), and is delivered ``delay`` after its transmission ends. Rate limiting lives
here rather than in a ``tbf`` qdisc because a qdisc on the sender's own egress gives the sender's TCP local
back-pressure (TSQ, local drops), unlike a router in the network, and because computing release times from the
arrival clock keeps the long-run rate exact however late the loop wakes.

Delivery times within a direction are non-decreasing (a link does not reorder), so a FIFO per direction holds
the packets in release order: the min-heap of the general case degenerates to a deque, which is cheaper.

Run as ``python -m benchmarks.wan.forwarder --ns-a NS --tun-a IF --ns-b NS --tun-b IF --ab SHAPE --ba
SHAPE --seed N``. Control protocol on stdin/stdout, one line each: ``stats`` → a JSON line of counters, ``reset``
→ zero them, ``set ab|ba RATE,DELAY,LOSS,QUEUE`` → change a direction, ``quit``. EOF on stdin (the parent died)
also ends the process, as does the parent-death signal; the TUN devices vanish with it.

The forwarder is the network, so it runs above the endpoints whose packets it carries: in the real-time class
(``SCHED_RR``, lowest real-time priority) where the system allows. Among ordinary processes its timing would
be theirs: measured beside six busy processes of other sessions (each an autogroup of its own, so nice and
the idle class do not reach across them), a 50 Mbit/s link delivered 36-42 Mbit/s in the normal class and 47
in the real-time one, as on a quiet machine. It never busy-waits (it sleeps in ``epoll`` until a packet is
due), so it holds a core only for the work the packets need. A forwarder started at a lowered priority (a
background test worker) keeps it: a link in the background must not preempt a measurement in the foreground.
The ``ready`` line names the class it got.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import json
import os
import random
import select
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from benchmarks.wan.tun import open_tun

READ_BATCH = 256
"""Packets read per readiness event before writing due ones: amortises the poll call without starving output."""
MAX_PACKET = 65536
PR_SET_PDEATHSIG = 1
REALTIME_PRIORITY = 1
"""The lowest real-time priority: above every ordinary process, below the kernel's own real-time threads."""


@dataclass
class DirectionState:
    """Counters and link model of one direction (``ab`` = TUN a → TUN b)."""

    name: str
    src: int
    dst: int
    rng: random.Random
    rate_Bps: float = 0.0
    delay_s: float = 0.0
    loss: float = 0.0
    queue_bytes: int = 0
    link_free: float = 0.0
    last_release: float = 0.0
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    packets_in: int = 0
    bytes_in: int = 0
    packets_out: int = 0
    bytes_out: int = 0
    dropped_loss: int = 0
    dropped_queue: int = 0
    write_errors: int = 0
    max_backlog_s: float = 0.0

    def configure(self, spec: str) -> None:
        """Apply ``RATE_MBIT,DELAY_MS,LOSS,QUEUE_BYTES`` (0 rate or queue = unlimited)."""
        rate, delay, loss, queue = (float(x) for x in spec.split(","))
        self.rate_Bps = rate * 1e6 / 8
        self.delay_s = delay / 1000
        self.loss = loss
        self.queue_bytes = int(queue)

    def counters(self) -> dict[str, float]:
        return {
            "packets_in": self.packets_in,
            "bytes_in": self.bytes_in,
            "packets_out": self.packets_out,
            "bytes_out": self.bytes_out,
            "dropped_loss": self.dropped_loss,
            "dropped_queue": self.dropped_queue,
            "write_errors": self.write_errors,
            "queued": len(self.queue),
            "max_backlog_ms": round(self.max_backlog_s * 1000, 3),
        }

    def reset(self) -> None:
        self.packets_in = self.bytes_in = self.packets_out = self.bytes_out = 0
        self.dropped_loss = self.dropped_queue = self.write_errors = 0
        self.max_backlog_s = 0.0


def _accept(d: DirectionState, now: float) -> bool:
    """Read up to :data:`READ_BATCH` packets of one direction; False when the device is gone."""
    src, queue, rng = d.src, d.queue, d.rng
    rate, delay, loss, qbytes = d.rate_Bps, d.delay_s, d.loss, d.queue_bytes
    for _ in range(READ_BATCH):
        try:
            pkt = os.read(src, MAX_PACKET)
        except BlockingIOError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EBADFD, errno.EIO, errno.ENXIO, errno.ENODEV):
                return False
            raise
        size = len(pkt)
        d.packets_in += 1
        d.bytes_in += size
        if rate:
            start = d.link_free if d.link_free > now else now
            backlog = start - now
            if qbytes and backlog * rate + size > qbytes:
                d.dropped_queue += 1
                continue
            if backlog > d.max_backlog_s:
                d.max_backlog_s = backlog
            d.link_free = start + size / rate
            release = d.link_free + delay
        else:
            release = now + delay
        if loss and rng.random() < loss:
            d.dropped_loss += 1
            continue
        if release < d.last_release:
            release = d.last_release
        d.last_release = release
        if release <= now and not queue:
            _write(d, pkt)
        else:
            queue.append((release, pkt))
    return True


def _write(d: DirectionState, pkt: bytes) -> None:
    try:
        os.write(d.dst, pkt)
    except OSError:
        d.write_errors += 1
        return
    d.packets_out += 1
    d.bytes_out += len(pkt)


def _flush(d: DirectionState, now: float) -> None:
    queue = d.queue
    while queue and queue[0][0] <= now:
        _write(d, queue.popleft()[1])


def serve(fd_a: int, fd_b: int, ab: str, ba: str, seed: int, control_in: int, control_out) -> int:
    """The forwarding loop; returns an exit status when told to quit, the parent goes, or a device vanishes."""
    dirs = {
        "ab": DirectionState("ab", fd_a, fd_b, random.Random(seed * 2 + 1)),
        "ba": DirectionState("ba", fd_b, fd_a, random.Random(seed * 2 + 2)),
    }
    dirs["ab"].configure(ab)
    dirs["ba"].configure(ba)
    by_fd = {fd_a: dirs["ab"], fd_b: dirs["ba"]}
    poller = select.epoll()
    poller.register(fd_a, select.EPOLLIN)
    poller.register(fd_b, select.EPOLLIN)
    poller.register(control_in, select.EPOLLIN)
    pending = b""
    both = (dirs["ab"], dirs["ba"])
    monotonic = time.monotonic
    while True:
        now = monotonic()
        timeout = -1.0
        for d in both:
            if d.queue:
                _flush(d, now)
                if d.queue:
                    wait = d.queue[0][0] - now
                    timeout = wait if timeout < 0 or wait < timeout else timeout
        events = poller.poll(timeout)
        now = monotonic()
        for fd, ev in events:
            d = by_fd.get(fd)
            if d is None:
                chunk = os.read(control_in, 4096)
                if not chunk:
                    return 0
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    reply = _control(line.decode(), dirs)
                    if reply is None:
                        return 0
                    control_out.write(reply + "\n")
                    control_out.flush()
            elif ev & (select.EPOLLERR | select.EPOLLHUP) or not _accept(d, now):
                return 3


def _control(line: str, dirs: dict[str, DirectionState]) -> str | None:
    words = line.split()
    if not words or words[0] == "quit":
        return None
    if words[0] == "stats":
        return json.dumps({name: d.counters() for name, d in dirs.items()})
    if words[0] == "reset":
        for d in dirs.values():
            d.reset()
        return "ok"
    if words[0] == "set" and len(words) == 3 and words[1] in dirs:
        dirs[words[1]].configure(words[2])
        return "ok"
    return json.dumps({"error": f"unknown command {line.strip()!r}"})


def _die_with_parent() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the parent already died before prctl took effect
        sys.exit(2)


def _run_above_endpoints() -> str:
    """Move to the real-time class if started at ordinary priority and permitted; return the class held."""
    if os.sched_getscheduler(0) != os.SCHED_OTHER or os.getpriority(os.PRIO_PROCESS, 0) > 0:
        return "inherited"  # started lowered (or already raised): keep what the starter chose
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(REALTIME_PRIORITY))
    except OSError:  # not privileged, or the container's cgroup grants no real-time time
        return "normal"
    return "realtime"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wan.forwarder", description=__doc__)
    parser.add_argument("--ns-a", required=True)
    parser.add_argument("--tun-a", required=True)
    parser.add_argument("--ns-b", required=True)
    parser.add_argument("--tun-b", required=True)
    parser.add_argument("--ab", default="0,0,0,0", help="a→b RATE_MBIT,DELAY_MS,LOSS,QUEUE_BYTES")
    parser.add_argument("--ba", default="0,0,0,0", help="b→a RATE_MBIT,DELAY_MS,LOSS,QUEUE_BYTES")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-id", default="", help="owner tag, lets a later run find forwarders of a crashed one")
    args = parser.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness stops us; a terminal ^C goes to it first
    fd_a = open_tun(args.tun_a, args.ns_a)
    fd_b = open_tun(args.tun_b, args.ns_b)
    scheduling = _run_above_endpoints()
    sys.stdout.write(f"ready {scheduling}\n")
    sys.stdout.flush()
    return serve(fd_a, fd_b, args.ab, args.ba, args.seed, sys.stdin.fileno(), sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
