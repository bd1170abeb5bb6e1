"""Which NIC port carries each plane's address, and whether its link is up (side-effecting:
two ioctls on a UDP socket, in the calling process's network namespace; cheap enough to
poll every few milliseconds).

The roce transport watches each plane's port: a port that goes down (its carrier lost: the
cable, or the switch port at the other end; or set down) takes the plane out at once,
before any packet is found missing. ioctls rather than ``/sys/class/net``: a Mininet host
is a network namespace sharing the machine's mounts, so sysfs there shows the root
namespace's interfaces, not the host's. An address that no interface owns as its primary
IPv4 address (127.0.x.y other than 127.0.0.1, for instance) maps to no port and is not
watched.
"""
from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFFLAGS = 0x8913
SIOCGIFADDR = 0x8915
IFF_UP = 0x1
IFF_RUNNING = 0x40          # operationally up: administratively up and the carrier present


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
    there is no such interface."""
    s = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw = fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, _ifreq(name))
    except OSError:
        return None
    finally:
        if sock is None:
            s.close()
    flags = struct.unpack_from("H", raw, 16)[0]
    return bool(flags & IFF_UP) and bool(flags & IFF_RUNNING)
