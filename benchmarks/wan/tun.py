"""TUN devices: an L3 interface whose packets a user process reads and writes as plain IP datagrams.

A TUN device is created in the namespace of the thread that opens ``/dev/net/tun``; the file descriptor stays
valid after the thread moves to another namespace. That is how one forwarder process holds one end in the home
namespace and the other in a remote one. The device disappears when the descriptor is closed (non-persistent),
so a dead forwarder never leaves devices behind.
"""

from __future__ import annotations

import fcntl
import os
import struct

from benchmarks.wan.netns import entered

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFNAMSIZ = 16


def open_tun(ifname: str, netns: str | None = None) -> int:
    """Create TUN device ``ifname`` (in ``netns`` if given) and return its non-blocking descriptor.

    ``IFF_NO_PI`` drops the 4-byte packet-information header, so each read is exactly one IP packet.
    """
    if len(ifname.encode()) >= IFNAMSIZ:
        raise ValueError(f"interface name {ifname!r} is longer than {IFNAMSIZ - 1} bytes")
    if netns is None:
        return _open(ifname)
    with entered(netns):
        return _open(ifname)


def _open(ifname: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
    except BaseException:
        os.close(fd)
        raise
    return fd
