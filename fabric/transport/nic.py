"""Which NIC port carries each plane's address, and whether its link is up (side-effecting:
an ioctl and an rtnetlink request, in the calling process's network namespace; cheap
enough to poll every few milliseconds).

The roce transport watches each plane's port: a port that goes down (its carrier lost: the
cable, or the switch port at the other end; or set down) takes the plane out at once,
before any packet is found missing. ioctl and netlink rather than ``/sys/class/net``: a Mininet host
is a network namespace sharing the machine's mounts, so sysfs there shows the root
namespace's interfaces, not the host's. An address that no interface owns as its primary
IPv4 address (127.0.x.y other than 127.0.0.1, for instance) maps to no port and is not
watched.
"""
from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915
RTM_NEWLINK, RTM_GETLINK, NLMSG_ERROR, NLM_F_REQUEST = 16, 18, 2, 1
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000      # the carrier is present (rtnetlink only: not in SIOCGIFFLAGS' 16 bits)


def _ifreq(name: str) -> bytes:
    return struct.pack("256s", name.encode()[:15])


def interface_of(ip: str) -> str | None:
    """The name of the interface whose IPv4 address is ``ip`` (None: no interface's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, _ifreq(name))
            except OSError:
                continue                    # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None


def link_up(name: str, sock: socket.socket | None = None) -> bool | None:
    """True if interface ``name`` is up with its carrier present, False if not, None if
    there is no such interface. Asks rtnetlink (RTM_GETLINK) for the interface's flags:
    IFF_LOWER_UP follows the carrier at once, whereas IFF_RUNNING (all SIOCGIFFLAGS can
    see) follows the operational state, which the kernel's link watch updates up to a
    second later. ``sock``: a NETLINK_ROUTE socket to reuse (:func:`netlink_socket`)."""
    try:
        index = socket.if_nametoindex(name)
    except OSError:
        return None
    s = sock or netlink_socket()
    try:
        s.send(struct.pack("=IHHII", 32, RTM_GETLINK, NLM_F_REQUEST, index, 0)
               + struct.pack("=BBHiII", socket.AF_UNSPEC, 0, 0, index, 0, 0))
        while True:
            raw = s.recv(65536)
            _, typ, _, seq, _ = struct.unpack_from("=IHHII", raw)
            if typ == NLMSG_ERROR:
                return None
            if typ == RTM_NEWLINK and seq == index:
                flags = struct.unpack_from("=I", raw, 24)[0]
                return bool(flags & IFF_UP) and bool(flags & IFF_LOWER_UP)
    except OSError:
        return None
    finally:
        if sock is None:
            s.close()


def netlink_socket() -> socket.socket:
    """A NETLINK_ROUTE socket (in the calling process's network namespace) for :func:`link_up`."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    s.bind((0, 0))
    return s
