"""Tiny TCP probes between two regions: bulk throughput (1 or S streams) and echo round-trip time.

They run in the calling process: sockets are created while the thread is inside the region's namespace and
stay there for good, so no helper processes have to be started, waited for or cleaned up. The work is
syscall-bound (``sendall``/``recv_into`` of large buffers release the GIL), so Python threads do not limit the
rates measured here on links the forwarder can carry.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from benchmarks.wan.congestion import get_tcp_congestion
from benchmarks.wan.errors import WanError
from benchmarks.wan.topology import Topology

CHUNK = 256 * 1024


@dataclass(frozen=True)
class Throughput:
    """Result of one bulk transfer: bytes counted at the receiver over ``seconds`` from its first byte."""

    streams: int
    nbytes: int
    seconds: float
    cc_sender: str
    cc_receiver: str

    @property
    def mbit_s(self) -> float:
        """Application-level goodput (TCP/IP headers excluded: ~3.5 % below the IP-level link rate)."""
        return self.nbytes * 8 / self.seconds / 1e6 if self.seconds > 0 else 0.0


@contextmanager
def _listener(topo: Topology, region: str) -> Iterator[socket.socket]:
    with topo.inside(region):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((topo.address(region), 0))
        sock.listen(64)
        yield sock
    finally:
        sock.close()


def measure_throughput(topo: Topology, sender: str, receiver: str, *, nbytes: int | None = None,
                       seconds: float | None = None, streams: int = 1, timeout: float = 120.0) -> Throughput:
    """Bulk TCP goodput from ``sender`` to ``receiver`` over ``streams`` parallel connections.

    Give exactly one of ``nbytes`` (send that much in total, split evenly; the clock runs from the first byte
    received to the last, so setup is excluded but slow start is not, as for an object download) or
    ``seconds`` (senders send without end; the receiver counts what arrives in a window of that length from
    its first byte, then resets the connections). Time windows compare stream counts fairly under random loss:
    with fixed sizes a lucky flow can finish inside its first slow start and the slowest of S flows sets the
    end, which makes single small transfers very noisy at 1 % loss.
    """
    if (nbytes is None) == (seconds is None):
        raise ValueError("give exactly one of nbytes and seconds")
    if streams < 1 or (nbytes is not None and nbytes < streams):
        raise ValueError("need streams >= 1 and at least one byte per stream")
    per_stream: list[int | None] = (
        [nbytes // streams + (1 if i < nbytes % streams else 0) for i in range(streams)]
        if nbytes is not None else [None] * streams
    )
    lock = threading.Lock()
    window: list[float] = []  # [first byte, end of window]
    last: list[float] = []
    received = [0]
    cc_recv: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def drain(conn: socket.socket) -> None:
        view = memoryview(bytearray(CHUNK))
        got = 0
        try:
            with conn:
                cc_recv.append(get_tcp_congestion(conn))
                conn.settimeout(0.05 if seconds is not None else timeout)
                while not stop.is_set():
                    try:
                        n = conn.recv_into(view)
                    except TimeoutError:
                        n = -1
                    now = time.perf_counter()
                    with lock:
                        if not window and n > 0:
                            window.extend([now, now + seconds if seconds is not None else float("inf")])
                        if window and now >= window[1]:
                            stop.set()
                            break
                    if n == 0:
                        break
                    if n > 0:
                        got += n
                with lock:
                    last.append(min(time.perf_counter(), window[1]) if window else time.perf_counter())
                    received[0] += got
        except BaseException as exc:
            errors.append(exc)

    def send(sock: socket.socket, count: int | None) -> None:
        payload = memoryview(bytes(CHUNK))
        try:
            with sock:
                left = count
                while left is None or left > 0:
                    n = CHUNK if left is None else min(left, CHUNK)
                    sock.sendall(payload[:n])
                    if left is not None:
                        left -= n
                sock.shutdown(socket.SHUT_WR)
                sock.recv(1)  # wait for the receiver to close: every byte is delivered
        except OSError as exc:
            if not stop.is_set():  # in a time window the receiver ends the flows by resetting them
                errors.append(exc)
        except BaseException as exc:
            errors.append(exc)

    with ExitStack() as stack:
        server = stack.enter_context(_listener(topo, receiver))
        server.settimeout(timeout)
        port = server.getsockname()[1]
        with topo.inside(sender):
            clients = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(streams)]
        cc_send = []
        for sock in clients:
            sock.settimeout(timeout)
            sock.connect((topo.address(receiver), port))
            cc_send.append(get_tcp_congestion(sock))
        drains = [threading.Thread(target=drain, args=(server.accept()[0],), daemon=True) for _ in clients]
        senders = [threading.Thread(target=send, args=(s, n), daemon=True) for s, n in zip(clients, per_stream)]
        for t in drains + senders:
            t.start()
        for t in drains + senders:
            t.join(timeout)
            if t.is_alive():
                stop.set()
                raise WanError(f"bulk transfer {sender} → {receiver} did not finish within {timeout} s")
    if errors:
        raise WanError(f"bulk transfer {sender} → {receiver} failed: {errors[0]!r}") from errors[0]
    return Throughput(streams=streams, nbytes=received[0], seconds=max(last) - window[0],
                      cc_sender=",".join(sorted(set(cc_send))), cc_receiver=",".join(sorted(set(cc_recv))))


@dataclass(frozen=True)
class RoundTrips:
    """Echo round trips (ms) of one warm connection, in the order they were taken.

    The link only ever adds delay, and the host only ever adds more (a probe thread that waits for a core or
    the GIL): ``min_ms`` is the link's own round trip, ``median_ms`` what a process on this host typically saw.
    """

    samples_ms: tuple[float, ...]

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)


def measure_round_trips(topo: Topology, client: str, server: str, samples: int = 20,
                        timeout: float = 30.0) -> RoundTrips:
    """Round trips of a 1-byte TCP echo between two regions, on one warm NODELAY connection.

    The first exchange is discarded (it may carry the handshake's tail).
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    rtts: list[float] = []
    with _listener(topo, server) as listener:
        listener.settimeout(timeout)
        port = listener.getsockname()[1]

        def echo() -> None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while data := conn.recv(64):
                    conn.sendall(data)

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        with topo.inside(client):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with sock:
            sock.settimeout(timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect((topo.address(server), port))
            for _ in range(samples + 1):
                start = time.perf_counter()
                sock.sendall(b"x")
                if sock.recv(1) != b"x":
                    raise WanError("echo server closed the connection")
                rtts.append((time.perf_counter() - start) * 1000)
        thread.join(timeout)
    return RoundTrips(tuple(rtts[1:]))


def measure_rtt(topo: Topology, client: str, server: str, samples: int = 20, timeout: float = 30.0) -> float:
    """Median round trip (ms) of :func:`measure_round_trips`: it ignores the odd sample delayed by a random loss
    and retransmission timeout."""
    return measure_round_trips(topo, client, server, samples, timeout).median_ms


def measure_connect_rtt(topo: Topology, client: str, server: str, samples: int = 5, timeout: float = 30.0) -> float:
    """Median TCP handshake time (ms): one RTT plus connection-setup cost, for comparison with the echo RTT."""
    times = []
    with _listener(topo, server) as listener:
        port = listener.getsockname()[1]
        for _ in range(samples):
            with topo.inside(client):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            with sock:
                sock.settimeout(timeout)
                start = time.perf_counter()
                sock.connect((topo.address(server), port))
                times.append((time.perf_counter() - start) * 1000)
            listener.accept()[0].close()
    return statistics.median(times)


@dataclass(frozen=True)
class DatagramLoss:
    """End-to-end loss of a paced UDP probe, counted by sequence number at the receiver."""

    sent: int
    received: int

    @property
    def loss(self) -> float:
        return 1 - self.received / self.sent if self.sent else 0.0


def measure_datagram_loss(topo: Topology, sender: str, receiver: str, packets: int = 20000, payload: int = 64,
                          pps: int = 10000, linger: float = 0.5) -> DatagramLoss:
    """Send ``packets`` small numbered UDP datagrams at ``pps`` and count the distinct ones that arrive.

    Many cheap packets give a tight loss estimate quickly (standard error ``sqrt(p / packets)``), independent of
    the forwarder's own counters. Keep ``pps × size`` well below the link rate so no queue drops mix in.
    """
    if payload < 8:
        raise ValueError("payload must hold an 8-byte sequence number")
    with topo.inside(receiver):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with topo.inside(sender):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    seen: set[int] = set()
    done = threading.Event()
    with rx, tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        rx.bind((topo.address(receiver), 0))
        rx.settimeout(0.05)

        def collect() -> None:
            quiet_since = None
            while True:
                try:
                    data = rx.recv(2048)
                except TimeoutError:
                    if done.is_set():
                        quiet_since = quiet_since or time.monotonic()
                        if time.monotonic() - quiet_since >= linger:
                            return
                    continue
                quiet_since = None
                seen.add(int.from_bytes(data[:8], "big"))

        thread = threading.Thread(target=collect, daemon=True)
        thread.start()
        dest = (topo.address(receiver), rx.getsockname()[1])
        pad = bytes(payload - 8)
        burst = max(1, pps // 200)  # one burst every 5 ms
        start = time.monotonic()
        for seq in range(packets):
            tx.sendto(seq.to_bytes(8, "big") + pad, dest)
            if seq % burst == burst - 1:
                delay = start + (seq + 1) / pps - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        done.set()
        thread.join()
    return DatagramLoss(sent=packets, received=len(seen))
