"""Loss-sensitive TCP (cubic) for traffic that crosses emulated links.

The machine default is bbr, which barely reacts to random loss; WAN benchmarks need the classic behaviour.
What works here (kernel 6.x, tried): the per-namespace sysctl ``net.ipv4.tcp_congestion_control`` refuses
cubic with EPERM outside the initial namespace (the kernel only lets init_net pick an algorithm that is not in
``tcp_allowed_congestion_control``, and that list is global), so the harness sets ``congctl cubic`` on every
route that leads over an emulated link. The kernel applies a route's algorithm to active connects *and* to
accepted connections (``tcp_ca_openreq_child``), so servers we do not control (a Go binary) get cubic too.
Sockets can still override it after connect with :func:`set_tcp_congestion` (the route metric is not locked).
"""

from __future__ import annotations

import socket

DEFAULT_CC = "cubic"
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)


def route_options(algorithm: str | None) -> list[str]:
    """The ``ip route`` words that pin ``algorithm`` on a route (empty for ``None`` = leave the default)."""
    return ["congctl", algorithm] if algorithm else []


def set_tcp_congestion(sock: socket.socket, algorithm: str = DEFAULT_CC) -> None:
    """Select ``algorithm`` on one TCP socket (for clients that want to be explicit or to compare, e.g. bbr).

    Works for root in any namespace, and for anyone for algorithms in ``tcp_allowed_congestion_control``.
    Set it after ``connect``/``accept``: a route's ``congctl`` is applied at connect time and would replace a
    choice made before.
    """
    sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, algorithm.encode())


def get_tcp_congestion(sock: socket.socket) -> str:
    """The algorithm a connected TCP socket actually uses (to verify the route pinned it)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
    return raw.split(b"\0", 1)[0].decode()
